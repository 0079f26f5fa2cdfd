"""Learning at budgets of minutes (`make bench-learning`): runs to a bar, one table. `make test` keeps a check of about
20 s per algorithm (tests/test_learning.py); these are the longer runs it used to make, and the comparisons.

    python benchmarks/learning.py                        # every algorithm's check at its old test budget and bar, seed 1
    python benchmarks/learning.py --only sac,td3 --seeds 1-3
    python benchmarks/learning.py --suite full           # full budgets: PPO's seeds to 475, DQN's 500k, SAC and TD3 to 950
    python benchmarks/learning.py --suite memory --png docs/img/lstm_memory.png   # ppo_lstm against ppo, no velocities
    python benchmarks/learning.py --suite cheetah        # SAC and TD3 against CleanRL's loop on HalfCheetah-v5, 50k steps
    python benchmarks/learning.py --suite multiagent     # shared PPO, independent learners, random: simple_spread
    python benchmarks/learning.py --suite reincarnation --seeds 1-5   # QDagger from a 500-scoring DQN teacher against DQN from scratch
    python benchmarks/learning.py --suite pom --seeds 1-5 --parallel 1   # ppo_trxl against ppo_lstm on ProofofMemory-v0, 25k steps

Each run is its own process with one torch thread, `--parallel` at a time (2): a row's CPU seconds are its cost, and its
wall seconds depend on whatever else the machine runs. A run's score is the best rolling mean of its last `window` episode returns ("best"), or
the mean of its last `window` ("last"); "reached" is the step of the episode at which that rolling mean first met the
bar, and a run with a bar stops there (`--stop-at-return`) unless its suite compares whole curves. Exit status 1 if a
check misses its bar on more seeds than it allows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench import HERE, ROOT, env_with_path, host_line, seed_list, table
PENDULUM = ["--env-id", "InvertedPendulum-v5", "--env-backend", "sync"]
CARTPOLE = ["--env-id", "CartPole-v1"]
CHEETAH = ["--env-id", "HalfCheetah-v5"]
SPREAD = ["--env-id", "mpe2.simple_spread_v3", "--num-envs", "6"]  # 2 games of 3 agents, every config
# CleanRL's docs/benchmark, HalfCheetah-v4 at 1M steps, 3 seeds: for scale beside the cheetah suite's 50k
PUBLISHED_1M = {"sac": "9,635 ± 1,424", "td3": "9,583 ± 126"}


@dataclasses.dataclass
class Check:
    """One configuration's runs and how each is scored. ``command`` is `fleetrl train`'s arguments (the algorithm
    first), or ``plain:ALGO`` / ``ippo`` / ``random`` and their flags for the baselines in benchmarks/."""

    name: str
    suites: tuple[str, ...]
    command: list[str]
    budget: int
    bar: float | None
    window: int = 10
    score: str = "best"  # "best": the best rolling mean of `window`; "last": the mean of the last `window`
    stop: bool = True  # stop at the bar (--stop-at-return) rather than run the whole budget
    seeds: tuple[int, ...] = (1,)
    share: float = 1.0  # the share of seeds that must meet the bar
    eval_episodes: int = 0  # > 0: `fleetrl eval` the final policy; it must give at least 0.9x the last `window`
    not_env_steps: int = 0  # logged steps that are not env steps (QDagger's offline updates), taken off "reached at step"
    note: str = ""

    @property
    def env(self) -> str:
        return self.command[self.command.index("--env-id") + 1]

    def run_dir(self, out: Path, seed: int) -> Path:
        return out / self.name / f"{self.env}__{seed}"  # `fleetrl compare`'s name for a seed of a folder's configuration


CHECKS = [
    # --- "checks": what tests/test_learning.py ran before issue 46, at its budgets and bars (seed 1 measured 2026-12-04;
    # a random policy scores 22.7 on CartPole-v1 and CartPoleNoVel-v1, 5.1 on InvertedPendulum-v5)
    Check("sac", ("checks",), ["sac", *PENDULUM, "--learning-starts", "1000", "--batch-size", "128"], 30_000, 300,
          note="learning from 1k, minibatches of 128 (CleanRL: 5k, 256)"),
    Check("ppo-pendulum", ("checks", "full"), ["ppo", "--env-id", "InvertedPendulum-v5"], 150_000, 950, eval_episodes=10,
          note="and eval >= 0.9x the last 10 training episodes"),
    Check("td3", ("checks",), ["td3", *PENDULUM, "--learning-starts", "5000"], 25_000, 100, note="learning from 5k (CleanRL: 25k)"),
    Check("ddpg", ("checks",), ["ddpg", *PENDULUM, "--learning-starts", "5000"], 20_000, 75, note="TD3's settings"),
    Check("sac_discrete", ("checks",), ["sac_discrete", *CARTPOLE], 30_000, 150),
    Check("dqn", ("checks",), ["dqn", *CARTPOLE], 40_000, 150),
    Check("ppo_lstm", ("checks",), ["ppo_lstm", "--env-id", "CartPoleNoVel-v1"], 30_000, 150, note="velocities hidden"),
    Check("ppo-lag", ("checks",), ["ppo", *CARTPOLE, "--policy-lag", "1"], 100_000, 200, note="--policy-lag 1"),
    Check("ppg", ("checks",), ["ppg", *CARTPOLE], 60_000, 200),
    Check("ppo_rnd", ("checks",), ["ppo_rnd", *CARTPOLE], 60_000, 150),
    Check("ppo", ("checks",), ["ppo", *CARTPOLE], 100_000, 200),
    Check("pqn", ("checks",), ["pqn", *CARTPOLE, "--learning-rate", "1e-3", "--exploration-fraction", "0.2"], 60_000, 151,
          window=20, note="tests/test_pqn.py's bar before issue 46 (make test: 75)"),
    # --- "full": the full-budget comparisons, with CleanRL's defaults
    Check("ppo-cartpole", ("full",), ["ppo", *CARTPOLE], 500_000, 475, window=20, seeds=(1, 2, 3), share=2 / 3,
          note="two of three seeds"),
    Check("ppo-lag-cartpole", ("full",), ["ppo", *CARTPOLE, "--policy-lag", "1"], 500_000, 475, window=20),
    Check("dqn-cartpole", ("full",), ["dqn", *CARTPOLE], 500_000, 450, window=20, score="last", stop=False,
          note="CleanRL: 488.69 ± 16.11"),
    Check("sac-pendulum", ("full",), ["sac", *PENDULUM], 26_000, 950),
    Check("td3-pendulum", ("full",), ["td3", *PENDULUM, "--learning-starts", "10000"], 46_000, 950,
          note="from CleanRL's 25k it was still near 350 at 50k"),
    # --- "memory": CartPole without its velocities; memory should matter (issue 25: every ppo_lstm seed reaches 400 within
    # 300k, and memoryless ppo clearly lower)
    Check("ppo_lstm-novel", ("memory",), ["ppo_lstm", "--env-id", "CartPoleNoVel-v1"], 300_000, 400, window=20, score="last",
          stop=False, seeds=(1, 2, 3)),
    Check("ppo-novel", ("memory",), ["ppo", "--env-id", "CartPoleNoVel-v1"], 300_000, None, window=20, score="last", stop=False,
          seeds=(1, 2, 3), note="no bar: it should stay clearly below ppo_lstm"),
    # --- "cheetah": fleetrl's SAC and TD3 against CleanRL's loop (benchmarks/cleanrl/loops/offpolicy.py), CleanRL's defaults on
    # both sides, mean of the last 10 episodes (HalfCheetah's episodes are 1,000 steps)
    *(Check(f"{algo}-{side}", ("cheetah",), [f"plain:{algo}" if side == "cleanrl" else algo, *CHEETAH], 50_000, None, score="last",
            stop=False, note=f"CleanRL publishes {PUBLISHED_1M[algo]} at 1M (v4)") for algo in ("sac", "td3") for side in ("cleanrl", "fleetrl")),
    # --- "multiagent": parameter-shared PPO against independent PPO learners (benchmarks/ippo_pettingzoo.py) and random
    # actions, at equal agent steps; mean of each agent's last 300 episodes; `fleetrl compare` gives the intervals
    Check("shared", ("multiagent",), ["ppo", *SPREAD], 500_000, None, window=300, score="last", stop=False, seeds=tuple(range(1, 11))),
    Check("independent", ("multiagent",), ["ippo", *SPREAD], 500_000, None, window=300, score="last", stop=False, seeds=tuple(range(1, 11))),
    Check("random", ("multiagent",), ["ippo", *SPREAD, "--random"], 500_000, None, window=300, score="last", stop=False,
          seeds=tuple(range(1, 11))),
]
# --- "reincarnation" (issue 48): a QDagger student of a DQN teacher that scores 500 (TEACHER, trained first) reaches 475
# in fewer env steps, its teacher's 5,000 rollout steps counted (its 5,000 offline updates are not env steps), than DQN
# from scratch, with DQN's defaults and with the teacher's tuned flags; each stopped at the bar; "reached at" per seed,
# then its mean with a bootstrap interval over the seeds
TEACHER = Check("teacher", (), ["dqn", *CARTPOLE, "--learning-rate", "1e-3", "--train-frequency", "1", "--learning-starts", "1000",
                                "--exploration-fraction", "0.2", "--target-network-frequency", "100"], 100_000, 500, eval_episodes=10)
TEACHER_DIR = "{teacher}"  # in a command: the teacher's run folder
CHECKS += [
    Check("qdagger-student", ("reincarnation",), ["qdagger", *CARTPOLE, "--teacher-checkpoint", TEACHER_DIR], 100_000, 475,
          seeds=(1, 2, 3, 4, 5), not_env_steps=5_000, note="QDagger's classic defaults: 5k teacher steps (counted), 5k offline updates"),
    Check("dqn-scratch", ("reincarnation",), ["dqn", *CARTPOLE], 500_000, 475, seeds=(1, 2, 3, 4, 5),
          note="DQN's classic defaults (epsilon falls over 250k steps)"),
    Check("dqn-tuned-scratch", ("reincarnation",), TEACHER.command, 100_000, 475, seeds=(1, 2, 3, 4, 5),
          note="the teacher's flags: DQN tuned for CartPole (epsilon over 20k, an update every step)"),
]
# --- "pom" (issue 48): PPO-TrXL with CleanRL's documented ProofofMemory-v0 command against PPO-LSTM at the same 25k steps,
# with its classic defaults and with TrXL's rollout shape; the mean of the last 100 episodes, then its mean over the seeds
# with a 95% t-interval; the bar 1.0 is remembering the goal (a policy without memory cannot pass 0, the best is about 1.2)
POM = ["--env-id", "ProofofMemory-v0"]
TRXL_SHAPE = ["--num-envs", "16", "--num-steps", "128", "--num-minibatches", "8", "--update-epochs", "4"]
CHECKS += [
    Check("ppo_trxl-pom", ("pom",), ["ppo_trxl", *POM, *TRXL_SHAPE, "--trxl-num-layers", "4", "--trxl-num-heads", "1", "--trxl-dim", "64",
                                     "--trxl-memory-length", "16", "--trxl-positional-encoding", "none", "--vf-coef", "0.1", "--max-grad-norm",
                                     "0.5", "--init-lr", "3.0e-4", "--init-ent-coef", "0.001", "--clip-coef", "0.2"], 25_000, 1.0, window=100,
          score="last", stop=False, seeds=(1, 2, 3, 4, 5), note="CleanRL's documented command (docs/algorithms.md)"),
    Check("ppo_lstm-pom", ("pom",), ["ppo_lstm", *POM], 25_000, 1.0, window=100, score="last", stop=False, seeds=(1, 2, 3, 4, 5),
          note="ppo_lstm's classic defaults (RL Zoo's CartPoleNoVel: 8 envs x 32 steps, 1 minibatch, 20 epochs)"),
    Check("ppo_lstm-pom-trxl-shape", ("pom",), ["ppo_lstm", *POM, *TRXL_SHAPE], 25_000, 1.0, window=100, score="last", stop=False,
          seeds=(1, 2, 3, 4, 5), note="the classic defaults with TrXL's 16 envs x 128 steps, 8 minibatches, 4 epochs"),
]
SUITES = ("checks", "full", "memory", "cheetah", "multiagent", "reincarnation", "pom")


def command(check: Check, seed: int, run_dir: Path) -> list[str]:
    """The process that makes one run, with one torch thread, writing its episode returns into ``run_dir``."""
    head, *flags = check.command
    flags = [str(run_dir.parent.parent / TEACHER.name / f"{TEACHER.env}__1") if f == TEACHER_DIR else f for f in flags]
    common = ["--seed", str(seed), "--total-timesteps", str(check.budget), "--run-dir", str(run_dir)]
    if head.startswith("plain:"):
        return [sys.executable, __file__, "--plain", head[len("plain:"):], *flags, *common]
    if head == "ippo":
        return [sys.executable, os.path.join(HERE, "ippo_pettingzoo.py"), *flags, *common]
    stop = ["--stop-at-return", str(check.bar), "--stop-window", str(check.window)] if check.stop and check.bar is not None else []
    return [sys.executable, "-m", "fleetrl", "train", head, *flags, *common, *stop, "--torch-threads", "1", "--no-cuda", "--no-progress",
            "--checkpoint-every", "100000"]


def returns_of(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(the step each episode ended at, its return): TensorBoard's charts/episodic_return, or a plain run's JSON."""
    if (run_dir / "returns.json").exists():
        saved = json.loads((run_dir / "returns.json").read_text())
        return np.array(saved["steps"]), np.array(saved["returns"], float)
    from fleetrl.monitor.tbread import read_scalars

    points = read_scalars(run_dir, "charts/episodic_return")
    return np.array([p.step for p in points]), np.array([p.value for p in points], float)


def rolling(values: np.ndarray, window: int) -> np.ndarray:
    return np.convolve(values, np.ones(window) / window, mode="valid") if len(values) >= window else np.array([])


def measured(argv: list[str]) -> tuple[int, str, float]:
    """Run ``argv``: its exit status, its stderr, and the CPU seconds it and the children it waited for used (what a
    run costs; its wall time on a shared machine depends on the other jobs)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env_with_path(OMP_NUM_THREADS="1"), cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read(), usage.ru_utime + usage.ru_stime


def run(check: Check, seed: int, out: Path) -> dict:
    run_dir = check.run_dir(out, seed)
    shutil.rmtree(run_dir, ignore_errors=True)  # afresh: never a resume of an earlier call's run
    started = time.perf_counter()
    returncode, stderr, cpu_s = measured(command(check, seed, run_dir))
    result = {"check": check.name, "seed": seed, "wall_s": time.perf_counter() - started, "cpu_s": cpu_s}
    if returncode != 0:
        return {**result, "error": f"exit {returncode}: {stderr.strip()[-600:]}", "met": False}
    steps, returns = returns_of(run_dir)
    steps = steps - check.not_env_steps
    means = rolling(returns, check.window)
    if check.score == "best":
        score = float(means.max()) if len(means) else float("nan")
    else:
        score = float(returns[-check.window:].mean()) if len(returns) else float("nan")
    reached = np.flatnonzero(means >= check.bar) if check.bar is not None else []
    result.update(score=score, episodes=len(returns), last_step=int(steps[-1]) if len(steps) else 0,
                  reached_at=int(steps[reached[0] + check.window - 1]) if len(reached) else None,
                  met=check.bar is None or score >= check.bar)
    if check.eval_episodes:
        evaluated = subprocess.run([sys.executable, "-m", "fleetrl", "eval", str(run_dir), "--episodes", str(check.eval_episodes), "--json"],
                                   capture_output=True, text=True, env=env_with_path(OMP_NUM_THREADS="1"), cwd=ROOT)
        last = float(returns[-check.window:].mean())
        mean = json.loads(evaluated.stdout.strip().splitlines()[-1])["mean_return"] if evaluated.returncode == 0 else float("nan")
        result.update(eval_return=mean, last_training=last, met=result["met"] and mean >= 0.9 * last)
    return result


def needed(check: Check, seeds: int) -> int:
    return math.ceil(check.share * seeds - 1e-9)


def results_table(checks: list[Check], results: dict[str, list[dict]]) -> str:
    rows = []
    for check in checks:
        kind = f"best rolling {check.window}" if check.score == "best" else f"last {check.window}"
        bar = "-" if check.bar is None else f"{check.bar:g}"
        for r in results[check.name]:
            start = [check.name, check.command[0], check.env, r["seed"], f"{check.budget:,}", bar]
            end = [f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}"]
            if "error" in r:
                rows.append([*start, f"failed: {r['error'][:120]}", "", "", "no", *end])
                continue
            reached = f"{r['reached_at']:,}" if r["reached_at"] is not None else "-"
            ev = f"{r['eval_return']:.0f} vs {r['last_training']:.0f}" if "eval_return" in r else ""
            rows.append([*start, f"{r['score']:.1f} ({kind})", reached, ev, "-" if check.bar is None else "yes" if r["met"] else "no", *end])
        if len(results[check.name]) > 1 and check.score == "last":  # a final score, compared across configurations
            runs = len(results[check.name])
            met = f"{sum(r['met'] for r in results[check.name])} of {runs} met, {needed(check, runs)} needed" if check.bar is not None else ""
            reached = f"mean {interval([r.get('reached_at') for r in results[check.name]], check.budget)}" if check.bar is not None else ""
            rows.append([f"**{check.name}**", met, *[""] * 4, score_interval([r.get("score", math.nan) for r in results[check.name]]),
                         reached, *[""] * 4])
        elif len(results[check.name]) > 1 and check.bar is not None:
            met = sum(r["met"] for r in results[check.name])
            runs = len(results[check.name])
            rows.append([f"**{check.name}**", f"{met} of {runs} met, {needed(check, runs)} needed", *[""] * 5,
                         f"mean {interval([r.get('reached_at') for r in results[check.name]], check.budget)}", *[""] * 4])
    notes = [f"- {c.name}: {c.note}" for c in checks if c.note]
    header = ["check", "algorithm", "env", "seed", "budget", "bar", "score", "reached at step", "eval", "met", "wall s", "CPU s"]
    return "\n".join([table(header, rows), *([""] + notes if notes else [])])


def interval(reached: list[int | None], budget: int, resamples: int = 10_000) -> str:
    """The mean step at which the seeds reached the bar, with a 95% percentile-bootstrap interval over the seeds; a seed
    that never reached it counts at the budget, so the mean is a lower bound ("at least")."""
    steps = np.array([budget if r is None else r for r in reached], float)
    means = np.random.default_rng(0).choice(steps, (resamples, len(steps))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return f"{'at least ' if None in reached else ''}{steps.mean():,.0f} [95% CI {low:,.0f} to {high:,.0f}]"


def score_interval(scores: list[float]) -> str:
    """The mean of the seeds' scores with a 95% t-interval over the seeds (a failed run counts as nan)."""
    from scipy import stats

    values = np.array(scores, float)
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return f"mean {values.mean():.3f} [95% CI {values.mean() - half:.3f} to {values.mean() + half:.3f}]"


def train_teacher(out: Path) -> dict:
    """The reincarnation suite's teacher, first: DQN to a rolling 500 (tuned to get there in minutes), then `fleetrl eval`
    of it, which must give at least 475."""
    result = run(TEACHER, 1, out)
    print(json.dumps(result), flush=True)
    if not result["met"] or result.get("eval_return", 0) < 475:
        sys.exit(f"the teacher did not reach 500 with an eval of 475 or more: {result}")
    return result


def plot(checks: list[Check], out: Path, png: str) -> None:
    """Each run's rolling mean against the step, a colour per check."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for colour, check in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], checks):
        for i, seed_dir in enumerate(sorted((out / check.name).glob(f"{check.env}__*"))):
            steps, returns = returns_of(seed_dir)
            ax.plot(steps[check.window - 1:], rolling(returns, check.window), color=colour, alpha=0.8, label=check.name if i == 0 else None)
    ax.set(xlabel="environment steps", ylabel="rolling mean of episode returns")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"curves: {png}")


def plain(argv: list[str]) -> None:
    """In a run's process: CleanRL's loop of SAC or TD3 (benchmarks/cleanrl/loops/offpolicy.py), its returns as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("algo")
    for flag in ("--env-id", "--run-dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total-timesteps", type=int, required=True)
    opts = parser.parse_args(argv)
    import importlib

    import torch

    torch.set_num_threads(1)
    from loops import offpolicy as plain_offpolicy

    learning_starts = importlib.import_module(f"fleetrl.algos.{opts.algo}").FAMILY_DEFAULTS["mujoco"]["learning_starts"]  # as fleetrl's side
    returns = getattr(plain_offpolicy, f"plain_{opts.algo}")(opts.env_id, opts.total_timesteps, learning_starts, seed=opts.seed).episode_returns
    os.makedirs(opts.run_dir, exist_ok=True)
    steps = [1000 * (k + 1) for k in range(len(returns))]  # one env, and HalfCheetah's episodes never end early: 1,000 steps
    Path(opts.run_dir, "returns.json").write_text(json.dumps({"steps": steps, "returns": returns}))


def main() -> None:
    if sys.argv[1:2] == ["--plain"]:
        return plain(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=SUITES, default="checks", help="which runs (default: checks)")
    parser.add_argument("--only", help="comma-separated check names of the suite: " + "; ".join(
        f"{s}: {','.join(c.name for c in CHECKS if s in c.suites)}" for s in SUITES))
    parser.add_argument("--seeds", type=seed_list, help="seeds for every check, e.g. 1-3 or 1,4 (default: each check's own)")
    parser.add_argument("--steps", type=int, help="one budget for every run instead of each check's own (a quick try)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at the same time, one torch thread each")
    parser.add_argument("--out", type=Path, default=Path(ROOT, "runs", "learning"), help="the runs' folders (each started afresh)")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--png", help="also plot every run's rolling mean here")
    opts = parser.parse_args()
    checks = [c for c in CHECKS if opts.suite in c.suites]
    if opts.only:
        names = opts.only.split(",")
        unknown = sorted(set(names) - {c.name for c in checks})
        if unknown:
            parser.error(f"--only {','.join(unknown)}: not a check of --suite {opts.suite}; its checks: {', '.join(c.name for c in checks)}")
        checks = [c for c in checks if c.name in names]
    if opts.steps:
        checks = [dataclasses.replace(c, budget=opts.steps) for c in checks]
    out = opts.out.resolve() / opts.suite
    jobs = [(check, seed) for check in checks for seed in (opts.seeds or check.seeds)]
    started = time.perf_counter()
    teacher = train_teacher(out) if any(TEACHER_DIR in c.command for c in checks) else None
    results: dict[str, list[dict]] = {c.name: [] for c in checks}
    with ThreadPoolExecutor(opts.parallel) as pool:
        for (check, _), result in zip(jobs, pool.map(lambda job: run(*job, out), jobs)):
            results[check.name].append(result)
            print(json.dumps(result), flush=True)
    import torch

    command_line = f"python benchmarks/learning.py {' '.join(sys.argv[1:])}".strip()
    text = (f"`{command_line}`\n\n{host_line()}; torch {torch.__version__}, {opts.parallel} runs at a time\n\n"
            f"{results_table(([TEACHER] if teacher else []) + checks, {TEACHER.name: [teacher], **results} if teacher else results)}\n\nWall time: {(time.perf_counter() - started) / 60:.1f} min")
    print(text)
    if opts.markdown:
        opts.markdown.write_text(text + "\n")
    if opts.png:
        plot(checks, out, opts.png)
    if opts.suite == "multiagent":  # rliable intervals over the seeds
        subprocess.run([sys.executable, "-m", "fleetrl", "compare", *(str(out / c.name) for c in checks), "--labels",
                        *(c.name for c in checks), "--out", str(out / "compare")], env=env_with_path(OMP_NUM_THREADS="1"), check=False)
    failed = [c.name for c in checks if c.bar is not None and sum(r["met"] for r in results[c.name]) < needed(c, len(results[c.name]))]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
