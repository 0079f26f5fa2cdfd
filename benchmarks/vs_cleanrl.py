"""fleetrl against CleanRL, one algorithm at a time: the lockstep of the two loops, their speed, and their learning.

    python benchmarks/vs_cleanrl.py ALGO --lockstep [--env-id E] [--steps N] [--learning-starts N] [--seed S]
    python benchmarks/vs_cleanrl.py ALGO --speed [--env-id E] [--steps N] [--repeats 3] [--cpu 1] [--sides A,B]
    python benchmarks/vs_cleanrl.py ALGO --learn [--env-id E1,E2] [--seeds 1-10] [--steps N] [--sides A,B]

ALGO is a file of benchmarks/versus/ (c51 ddpg dqn multiagent ppg ppo_rnd pqn rainbow rpo sac_discrete): its
description names CleanRL's script (benchmarks/cleanrl/), the flags both sides get, the engine calls the lockstep
records on fleetrl's side and CleanRL's loop it runs beside them (benchmarks/cleanrl/loops/); `ALGO --help` lists its
own flags. The lockstep prints, for each record, "identical" or where the two first part.

--speed and --learn run each side as a process of its own, one at a time, alternating, pinned with ``taskset -c
--cpu``, with --threads torch threads (OMP_NUM_THREADS and fleetrl's --torch-threads): CleanRL's script and ``fleetrl
train ALGO`` with the same budget and flags (or a side the description adds). A finished run's result is kept in
OUT/results/ and not rerun by a later call. Speed: medians of --repeats of CleanRL's charts/SPS (steps over the seconds
since its loop began; fleetrl's is the same measure), of steps over the process's wall time (start-up included) and
over its CPU time. Learning: a run's score is the mean return of its last 20 episodes; the table gives each seed, the
mean and median, and exact permutation tests against the first side (the Mann-Whitney U with midranks, and the
difference of the means; 200,000 random splits past a million), then ``fleetrl compare`` reads the runs' TensorBoard
folders (OUT/learn/SIDE/ENV/) for IQM, intervals and the probability of improvement.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from bench import add_flags, alternate, fmt, med, seed_list, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALGOS = sorted(p.stem for p in (HERE / "versus").glob("*.py") if p.stem not in ("__init__", "common"))
LAST = (20, 100)  # episodes averaged for a run's score (the first is the tested one)
EXACT_LIMIT = 1_000_000  # splits enumerated for an exact test; more are sampled
SAMPLED_SPLITS = 200_000


# ============================================================================ one run of one side, in its own process
def command(algo, side: str, env_id: str, seed: int, opts: argparse.Namespace, run_dir: str) -> tuple[list[str], dict]:
    extra = algo.sides.get(side)
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "PYTHONPATH": f"{ROOT}:{HERE}"}
    pin = ["taskset", "-c", opts.lag_cpus if extra and extra.lag_cpus else opts.cpu] + (["nice", "-n", str(opts.nice)] if opts.nice else [])
    budget = ["--env-id", env_id, "--seed", str(seed), "--total-timesteps", str(opts.steps), *algo.flags(env_id, opts)]
    if extra and extra.in_process:
        return [*pin, sys.executable, __file__, opts.algo, "--run-one", side, "--out-file", os.path.join(run_dir, "returns.json"),
                "--env-id", env_id, "--seed", str(seed), "--steps", str(opts.steps), "--learning-starts", str(opts.learning_starts)], env
    if side == "cleanrl":
        env["CLEANRL_RUN_DIR"] = run_dir
        script = algo.script(env_id) if callable(algo.script) else algo.script
        budget[1] = algo.their_env_id(env_id)
        return [*pin, sys.executable, str(HERE / "cleanrl" / script), *budget, "--no-cuda"], env
    train = list(algo.fleetrl_command) or [sys.executable, "-m", "fleetrl", "train", (extra and extra.algo) or algo.name]
    return [*pin, *train, *budget, "--no-cuda", "--no-progress", *(["--env-backend", algo.backend] if algo.backend else []),
            "--torch-threads", str(opts.threads), "--run-dir", run_dir, *(extra.flags if extra else ()),
            *shlex.split(opts.fleetrl_flags)], env  # the user's flags last: the last of a repeated flag wins


def load(name: str):
    return importlib.import_module(f"versus.{name}").ALGO


def run_one(algo, side: str, env_id: str, seed: int, opts: argparse.Namespace, kind: str, repeat: int = 0) -> dict:
    """One run (skipped if its result is on file): wall and CPU seconds, the in-loop SPS, its episodes' returns."""
    from fleetrl.monitor.tbread import read_scalars

    out, folder = Path(opts.out).resolve(), env_id.replace("/", "_")
    run_dir = out / kind / side / folder / f"{folder}__{side}__{seed}__{repeat}"
    cmd, env = command(algo, side, env_id, seed, opts, str(run_dir))
    setup = f"{zlib.crc32(shlex.join(cmd[cmd.index(sys.executable):]).encode()):08x}"  # the command, not where it was pinned
    result_file = out / "results" / f"{kind}_{side}_{folder}_{seed}_{repeat}_{setup}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd, open(out / "last_output.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{side} {env_id} seed {seed} failed ({shlex.join(cmd)}); its output: {out / 'last_output.log'}")
        for found in (Path(cwd) / "runs").glob("*"):  # a script that names its own folder (runs/RUN_NAME)
            for event in found.iterdir():
                shutil.move(str(event), run_dir / event.name)
    if (run_dir / "returns.json").exists():
        ran = json.loads((run_dir / "returns.json").read_text())
    else:
        ran = {"returns": [p.value for p in read_scalars(run_dir, "charts/episodic_return")],
               "loop_sps": read_scalars(run_dir, "charts/SPS")[-1].value}
    result = {"side": side, "env_id": env_id, "seed": seed, "steps": opts.steps, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
              **ran, "command": shlex.join(cmd)}
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.write_text(json.dumps(result))
    return result


# ============================================================================ speed
def speed(algo, opts: argparse.Namespace) -> None:
    runs = alternate(opts.sides.split(","), opts.repeats, lambda side, repeat: run_one(algo, side, opts.env_id, 1, opts, "speed", repeat),
                     lambda side, r: f"{r['loop_sps']:,.0f} SPS in the loop, {r['steps'] / r['wall_s']:,.0f} wall")
    measures = {"SPS in the loop": lambda r: r["loop_sps"], "SPS, wall, start-up included": lambda r: r["steps"] / r["wall_s"],
                "SPS per CPU second": lambda r: r["steps"] / r["cpu_s"]}
    first = next(iter(runs))
    base = {m: med(f(r) for r in runs[first]) for m, f in measures.items()}
    print(f"\n{opts.env_id}, {opts.steps:,} steps a run, flags {shlex.join(algo.flags(opts.env_id, opts)) or 'none'}, CleanRL's "
          f"other defaults, seed 1, medians of {opts.repeats}, alternating; one process at a time, {opts.threads} torch thread(s) "
          f"a side, taskset -c {opts.cpu}; fleetrl's extra flags: {opts.fleetrl_flags or 'none'}\n")
    print(table(["side", *(c for m in measures for c in (f"{m} (median)", f"vs {first}")), "runs (in the loop)"],
                [[side, *(c for m, f in measures.items() for c in (fmt(med(f(r) for r in rs)), f"{med(f(r) for r in rs) / base[m]:.2f}x")),
                  ", ".join(fmt(r["loop_sps"]) for r in rs)] for side, rs in runs.items()]))


# ============================================================================ learning
def midranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        ranks[values == v] = ranks[values == v].mean()
    return ranks


def permutation_tests(a: list[float], b: list[float], rng_seed: int = 0) -> dict[str, float]:
    """Two-sided permutation p-values of the Mann-Whitney U of ``a`` (midranks) and of mean(a) - mean(b)."""
    pooled = np.asarray(a + b, dtype=np.float64)
    n, k = len(pooled), len(a)
    ranks = midranks(pooled)
    exact = math.comb(n, k) <= EXACT_LIMIT
    if exact:
        splits = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
    else:
        splits = np.argsort(np.random.default_rng(rng_seed).random((SAMPLED_SPLITS, n)), axis=1)[:, :k]
    u = ranks[splits].sum(1) - k * (k + 1) / 2
    u_null, u_obs = k * (n - k) / 2, ranks[:k].sum() - k * (k + 1) / 2
    sums = pooled[splits].sum(1)
    diffs = sums / k - (pooled.sum() - sums) / (n - k)
    diff_obs = float(np.mean(a) - np.mean(b))
    tolerance = 1e-9  # the observed split is one of the splits: compare with a margin for rounding
    return {"u": float(u_obs), "u_p": float(np.mean(np.abs(u - u_null) >= abs(u_obs - u_null) - tolerance)),
            "mean_diff": diff_obs, "mean_p": float(np.mean(np.abs(diffs) >= abs(diff_obs) - tolerance)), "exact": exact}


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def learn(algo, opts: argparse.Namespace) -> None:
    sides, seeds = opts.sides.split(","), list(seed_list(opts.seeds))
    for env_id in opts.env_id.split(","):
        runs = alternate(sides, len(seeds), lambda side, i: run_one(algo, side, env_id, seeds[i], opts, "learn"),
                         lambda side, r: f"{env_id} seed {r['seed']}: last-20 mean {np.mean(r['returns'][-20:]):.1f} "
                                         f"({len(r['returns'])} episodes), {r['wall_s'] / 60:.1f} min")
        runs = {side: dict(zip(seeds, rs)) for side, rs in runs.items()}
        print(learn_table(algo, env_id, sides, seeds, runs, opts))
        compared = [s for s in sides if not (algo.sides.get(s) and algo.sides[s].in_process)]  # those with TensorBoard folders
        if len(compared) > 1:
            out, folder = Path(opts.out).resolve(), env_id.replace("/", "_")
            bounds = ["--score-bounds", f"{env_id}={algo.score_bounds[env_id]}"] if env_id in algo.score_bounds else []
            compare = [sys.executable, "-m", "fleetrl", "compare", *(str(out / "learn" / s / folder) for s in compared),
                       "--labels", *compared, "--out", str(out / "compare" / folder), *bounds]
            print(f"$ {shlex.join(compare)}", flush=True)
            subprocess.run(compare, check=True)


def learn_table(algo, env_id: str, sides: list[str], seeds: list[int], runs: dict, opts: argparse.Namespace) -> str:
    def scores(side: str, last: int) -> list[float]:
        return [float(np.mean(runs[side][s]["returns"][-last:])) for s in seeds]

    rows = [[s, *(f"{np.mean(runs[side][s]['returns'][-LAST[0]:]):.1f} ({np.mean(runs[side][s]['returns'][-LAST[1]:]):.1f})" for side in sides)]
            for s in seeds]
    rows.append(["mean ± std", *(f"{np.mean(scores(s, LAST[0])):.1f} ± {np.std(scores(s, LAST[0])):.1f}" for s in sides)])
    rows.append(["median", *(f"{np.median(scores(s, LAST[0])):.1f}" for s in sides)])
    for what, f in (("SPS in the loop", lambda r: r["loop_sps"]), ("SPS, wall", lambda r: r["steps"] / r["wall_s"])):
        rows.append([f"{what} (median)", *(f"{np.median([f(runs[s][x]) for x in seeds]):,.0f}" for s in sides)])
    if algo.bar is not None:
        rows.append([f"runs at {algo.bar:g} or more", *(f"{sum(x >= algo.bar for x in scores(s, LAST[0]))} of {len(seeds)}" for s in sides)])
    lines = [f"\n{env_id}, {opts.steps:,} steps a run, flags {shlex.join(algo.flags(env_id, opts)) or 'none'}, CleanRL's other "
             f"defaults. Mean return of the last {LAST[0]} episodes of each run (last {LAST[1]} in brackets).", "", table(["seed", *sides], rows)]
    lines += ["", f"Two-sided permutation tests against {sides[0]}:", ""]
    for side in sides[1:]:
        for last in LAST:
            t = permutation_tests(scores(side, last), scores(sides[0], last))
            kind = "exact" if t["exact"] else f"{SAMPLED_SPLITS:,} random splits"
            lines.append(f"- {side}, last {last} episodes: Mann-Whitney U = {t['u']:.1f}, p = {p_text(t['u_p'])}; "
                         f"difference of means {t['mean_diff']:+.1f}, p = {p_text(t['mean_p'])} ({kind}).")
    return "\n".join(lines)


# ============================================================================ the command line
def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ALGOS:
        sys.exit(__doc__ + f"\nerror: the first argument is the algorithm, one of {', '.join(ALGOS)}")
    name = sys.argv[1]
    algo = load(name)
    parser = argparse.ArgumentParser(prog=f"vs_cleanrl.py {name}", description=importlib.import_module(f"versus.{name}").__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    for m in algo.modes:
        mode.add_argument(f"--{m}", action="store_true")
    mode.add_argument("--run-one", help=argparse.SUPPRESS)  # an in-process side, in a process of its own
    parser.add_argument("--out-file", help=argparse.SUPPRESS)
    parser.add_argument("--env-id", default=algo.env_id, help="for --learn: one or several, comma-separated")
    parser.add_argument("--steps", type=int, help=f"default: {algo.steps}")
    parser.add_argument("--learning-starts", type=int, help=f"default: {algo.learning_starts or 0}")
    add_flags(parser, seed=(algo.lockstep_seed, "for --lockstep"), seeds=("1-10", "for --learn: FIRST-LAST or a list, e.g. 1,4"),
              repeats=(3, "for --speed"), cpu=("1", "taskset -c for every run"), nice=(0, "each run under nice -n NICE"),
              lag_cpus=("0,1", "taskset -c for a side whose learner process takes a core"),
              threads=(1, "torch threads a side (OMP_NUM_THREADS, fleetrl's --torch-threads)"),
              fleetrl_flags=("", 'more flags for fleetrl\'s side, last (e.g. --fleetrl-flags="--env-backend async")'),
              out=str(ROOT / "runs" / f"vs_cleanrl_{name}"))
    parser.add_argument("--sides", help=f"for --speed and --learn, the first the reference: cleanrl, fleetrl, {', '.join(algo.sides)}")
    for names, kwargs in algo.options:
        parser.add_argument(*names, **kwargs)
    opts = parser.parse_args(sys.argv[2:])
    opts.algo = name
    kind = next((m for m in (*algo.modes, "run_one") if getattr(opts, m, None)), None)
    if kind is None:
        parser.error(f"give one of {', '.join('--' + m for m in algo.modes)}")
    opts.steps = opts.steps or algo.steps.get(kind, 0)
    opts.learning_starts = algo.learning_starts.get(kind, 0) if opts.learning_starts is None else opts.learning_starts
    opts.sides = opts.sides or (algo.learn_sides if kind == "learn" else algo.speed_sides)
    unknown = set(opts.sides.split(",")) - {"cleanrl", "fleetrl", *algo.sides}
    if unknown:
        parser.error(f"--sides: unknown {sorted(unknown)}; {name} has cleanrl, fleetrl{''.join(', ' + s for s in algo.sides)}")
    import torch

    torch.set_num_threads(opts.threads)
    if kind == "run_one":
        Path(opts.out_file).write_text(json.dumps(algo.in_process(opts.run_one, opts.env_id, opts.seed, opts)))
    elif kind == "lockstep":
        verdicts = algo.lockstep(opts)
        print(f"lockstep, {name}, {opts.env_id}, seed {opts.seed}, {opts.steps:,} steps, learning after step {opts.learning_starts:,}:")
        for what, verdict in verdicts.items():
            print(f"  {what:30s} {verdict}")
    else:
        Path(opts.out).mkdir(parents=True, exist_ok=True)
        (speed if kind == "speed" else learn)(algo, opts)


if __name__ == "__main__":
    main()
