"""The targets of issue 12 for `fleetrl tune`, on PPO CartPole, each a table.

    python benchmarks/tune_speed.py [--parts parallel,pruning,defaults] [--out runs/tune_speed]

1. parallel: 8 trials of 50,000 steps with --parallel 2 against --parallel 1, back to back in one run: wall times and
   their ratio (target: at most 0.65x).
2. pruning: a 16-trial study of 100,000-step trials with the median pruner (the tuner's defaults, or --pruning-flags)
   against the same study with --pruner none, same sampler seed: wall times, their ratio (target: at most 0.6x) and the
   best score of each (target: within noise). Its search space leaves out the parameters that set a trial's cost
   (--pruning-space full keeps them; see FIXED_COST_SPACE).
3. defaults: a 24-trial study at 100,000 steps; its best parameters and CleanRL's defaults, each retrained on 3 fresh
   seeds (not the tuning seed) with `fleetrl benchmark`: final return, mean ± std over the seeds (target: the tuned ones
   beat the defaults).
4. orphans: a tuner running 2 trials at once (async env workers) is killed outright (SIGKILL) --orphan-repeats times:
   the seconds until every process of its trials has ended (each run's parent watch polls every 0.5 s, then the run
   ends its iteration, checkpoints and closes its env workers). tests/test_tune.py checks only that they end, within a
   30 s hang guard; this is where their speed is measured (no target; it was a 10 s assertion in the test).

Every study uses the search space below and --sampler-seed 1. A check with tiny sizes (not a measurement):
    python benchmarks/tune_speed.py --steps 2048 --pruning-steps 2048 --study-steps 2048 --trials 2 --pruning-trials 2 --study-trials 2 --retrain-seeds 1 --orphan-repeats 1
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

SPACE = """\
learning-rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
ent-coef: {type: float, low: 0.0, high: 0.05}
clip-coef: {type: float, low: 0.1, high: 0.3}
gamma: {type: categorical, choices: [0.95, 0.98, 0.99, 0.995]}
gae-lambda: {type: float, low: 0.8, high: 0.99}
update-epochs: {type: int, low: 2, high: 10}
num-minibatches: {type: categorical, choices: [2, 4, 8]}
num-steps: {type: categorical, choices: [64, 128, 256]}
"""
# the pruning part's default space: the same parameters less the three that set a trial's cost (epochs, minibatches and
# rollout length stay at CleanRL's 4, 4 and 128). In the full space the good CartPole trials are the expensive ones
# (many epochs), so a pruner that stops poor trials saves only the cheap ones' time: the ratio then measures the
# sampler's cost choices as much as the pruner (0.90x measured, docs/benchmarks.md).
FIXED_COST_SPACE = "".join(line + "\n" for line in SPACE.splitlines() if line.split(":")[0] not in ("update-epochs", "num-minibatches", "num-steps"))
ENV_ID = "CartPole-v1"
FRESH_SEED = 101  # retraining seeds start here, far from the tuning seed (1)


def train_command(steps: int) -> list[str]:
    return ["fleetrl", "train", "ppo", "--total-timesteps", str(steps), "--env-backend", "sync"]


def tune(out: Path, name: str, trials: int, steps: int, parallel: int, *flags: str, space: str = "space.yaml") -> tuple[float, Path]:
    """One study in its own folder and journal; its wall time (the tuner's whole process) and its folder."""
    folder = out / name
    command = [sys.executable, "-m", "fleetrl", "tune", "--env-ids", ENV_ID, "--search", str(out / space), "--trials", str(trials),
               "--parallel", str(parallel), "--sampler-seed", "1", "--study-name", name, "--out", str(folder), *flags,
               "--", *train_command(steps)]
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"the study {name} failed (exit code {proc.returncode}); its output is in {out / f'{name}.log'}:\n{proc.stderr[-2000:]}")
    return wall, folder


def trials(folder: Path) -> list[dict]:
    with open(folder / "trials.csv") as f:
        return list(csv.DictReader(f))


def best(folder: Path) -> dict:
    return max((t for t in trials(folder) if t["state"] == "COMPLETE"), key=lambda t: float(t["value"]))


def best_command(folder: Path) -> list[str]:
    """The best trial's training command, as the tuner recorded it (the command's flags, then the tuned ones)."""
    import optuna

    from fleetrl.tools.tune import open_storage, parse_storage

    study = optuna.load_study(study_name=folder.name, storage=open_storage(parse_storage(str(folder / "study.log")), 600))
    return shlex.split(study.best_trial.user_attrs["command"])


def retrain(out: Path, name: str, command: list[str], seeds: int, workers: int) -> tuple[float, float]:
    """Final return (mean, std over seeds) of ``command`` on fresh seeds, run by `fleetrl benchmark`."""
    folder = out / name
    bench = [sys.executable, "-m", "fleetrl", "benchmark", "--env-ids", ENV_ID, "--num-seeds", str(seeds), "--start-seed", str(FRESH_SEED),
             "--workers", str(workers), "--out", str(folder), "--", *command]
    print(f"$ {shlex.join(bench)}", flush=True)
    proc = subprocess.run(bench, capture_output=True, text=True)
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"retraining {name} failed; its output is in {out / f'{name}.log'}")
    with open(folder / "summary.csv") as f:
        (row,) = list(csv.DictReader(f))
    return float(row["final_return_mean"]), float(row["final_return_std"])


def part_parallel(args, out: Path) -> None:
    one, _ = tune(out, "parallel_1", args.trials, args.steps, 1, "--pruner", "none")
    two, _ = tune(out, "parallel_2", args.trials, args.steps, 2, "--pruner", "none")
    print(f"\n{args.trials} trials of {args.steps:,} steps, PPO {ENV_ID}, no pruning, {os.cpu_count()} CPU cores\n")
    print("| --parallel | wall time | vs --parallel 1 |")
    print("| --- | --- | --- |")
    print(f"| 1 | {one:.0f}s | 1.00x |")
    print(f"| 2 | {two:.0f}s | {two / one:.2f}x (target ≤ 0.65x) |\n", flush=True)


def part_pruning(args, out: Path) -> None:
    rows = []
    for pruner in ("none", "median"):
        extra = shlex.split(args.pruning_flags) if pruner != "none" else []
        wall, folder = tune(out, f"pruner_{pruner}", args.pruning_trials, args.pruning_steps, args.parallel, "--pruner", pruner, *extra,
                            space=f"space_{args.pruning_space}.yaml")
        states = [t["state"] for t in trials(folder)]
        rows.append((pruner, wall, float(best(folder)["value"]), states.count("PRUNED")))
    none_wall = rows[0][1]
    print(f"\n{args.pruning_trials}-trial study, {args.pruning_steps:,} steps a trial, PPO {ENV_ID}, --parallel {args.parallel}, sampler seed 1, "
          f"{args.pruning_space} search space"
          f"{', pruner flags ' + args.pruning_flags if args.pruning_flags else ''}\n")
    print("| pruner | wall time | vs none | trials pruned | best score (mean of the last 20 episodes) |")
    print("| --- | --- | --- | --- | --- |")
    for pruner, wall, score, pruned in rows:
        print(f"| {pruner} | {wall:.0f}s | {wall / none_wall:.2f}x{' (target ≤ 0.6x)' if pruner != 'none' else ''} | {pruned} | {score:.1f} |")
    print(flush=True)


def part_defaults(args, out: Path) -> None:
    wall, folder = tune(out, "study", args.study_trials, args.study_steps, args.parallel)
    tuned = best_command(folder)
    tuned_score = retrain(out, "retrain_tuned", tuned, args.retrain_seeds, args.parallel)
    default_score = retrain(out, "retrain_defaults", train_command(args.study_steps), args.retrain_seeds, args.parallel)
    print(f"\nPPO {ENV_ID} at {args.study_steps:,} steps: a {args.study_trials}-trial study ({wall:.0f}s, --parallel {args.parallel}), "
          f"then {args.retrain_seeds} fresh seeds ({FRESH_SEED}...) each; final return = mean of the last 10 episodes\n")
    print("| parameters | final return (mean ± std over seeds) |")
    print("| --- | --- |")
    print(f"| CleanRL's defaults | {default_score[0]:.1f} ± {default_score[1]:.1f} |")
    print(f"| tuned (`{shlex.join(tuned[3:])}`) | {tuned_score[0]:.1f} ± {tuned_score[1]:.1f} |\n", flush=True)


def part_orphans(args, out: Path) -> None:
    import psutil

    ended = []
    for repeat in range(args.orphan_repeats):
        folder = out / f"orphans_{repeat}"
        command = [sys.executable, "-m", "fleetrl", "tune", "--env-ids", ENV_ID, "--search", str(out / "space.yaml"), "--trials", "2",
                   "--parallel", "2", "--sampler-seed", "1", "--study-name", folder.name, "--out", str(folder), "--",
                   "fleetrl", "train", "ppo", "--total-timesteps", "10000000", "--num-envs", "2", "--env-backend", "async"]
        print(f"$ {shlex.join(command)}", flush=True)
        with open(out / f"{folder.name}.log", "w") as log:
            tuner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        procs: list[psutil.Process] = []
        try:
            deadline = time.monotonic() + 300
            while len(list(folder.glob("trial_000[01]/*/events.out.tfevents.*"))) < 2:  # both trials' runs are training
                if tuner.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the tuner's two trials did not both start logging; its output is in {out / f'{folder.name}.log'}")
                time.sleep(0.2)
            procs = psutil.Process(tuner.pid).children(recursive=True)  # the trials' trainers, forkservers and env workers
            tuner.kill()
            killed = time.perf_counter()
            tuner.wait()
            _, left = psutil.wait_procs(procs, timeout=120)
            ended.append((len(procs), time.perf_counter() - killed, len(left)))
        finally:  # nothing of this repeat outlives it, however it ended
            if tuner.poll() is None:
                procs += psutil.Process(tuner.pid).children(recursive=True)
                tuner.kill()
                tuner.wait()
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    print(f"\nA tuner of 2 trials at once (PPO {ENV_ID}, 2 envs each on the async backend), killed with SIGKILL while both train; "
          f"{os.cpu_count()} CPU cores\n")
    print("| repeat | processes of its trials | all ended after | left after 120 s |")
    print("| --- | --- | --- | --- |")
    for repeat, (count, took, left) in enumerate(ended):
        print(f"| {repeat + 1} | {count} | {took:.1f}s | {left} |")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="parallel,pruning,defaults,orphans", help="which tables, comma-separated")
    parser.add_argument("--out", default=None, help="where the studies go [runs/tune_speed_{timestamp}]")
    parser.add_argument("--steps", type=int, default=50_000, help="steps a trial in the parallel part")
    parser.add_argument("--trials", type=int, default=8, help="trials of the parallel part")
    parser.add_argument("--pruning-trials", type=int, default=16)
    parser.add_argument("--pruning-steps", type=int, default=100_000, help="steps a trial in the pruning part")
    parser.add_argument("--pruning-flags", default="", help="extra tune flags for the pruned study, e.g. '--prune-after-trials 3 --prune-warmup 0.1'")
    parser.add_argument("--pruning-space", choices=("fixed-cost", "full"), default="fixed-cost",
                        help="the pruning part's search space: the full one, or without the three cost-setting parameters [fixed-cost]")
    parser.add_argument("--study-trials", type=int, default=24)
    parser.add_argument("--study-steps", type=int, default=100_000)
    parser.add_argument("--retrain-seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2, help="--parallel of the pruning and defaults parts")
    parser.add_argument("--orphan-repeats", type=int, default=3, help="times the orphans part kills a tuner")
    args = parser.parse_args()
    out = Path(args.out or f"runs/tune_speed_{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "space.yaml").write_text(SPACE)
    (out / "space_full.yaml").write_text(SPACE)
    (out / "space_fixed-cost.yaml").write_text(FIXED_COST_SPACE)
    parts = {"parallel": part_parallel, "pruning": part_pruning, "defaults": part_defaults, "orphans": part_orphans}
    for name in args.parts.split(","):
        if name not in parts:
            raise SystemExit(f"--parts: unknown part {name!r}; the parts are {', '.join(parts)}")
        parts[name](args, out)


if __name__ == "__main__":
    main()
