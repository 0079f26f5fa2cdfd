"""Learning at full budgets: the runs that used to be in `make test` (issue 23), each with its bar, in one table.

    python benchmarks/learning_budgets.py                        # every check, two runs at a time (~40 min on 2 cores)
    python benchmarks/learning_budgets.py --checks dqn-cartpole sac-pendulum
    python benchmarks/learning_budgets.py --markdown learning.md --out runs/learning_budgets

`make test` keeps one cheap "learns" check per algorithm (tests/test_learning.py); these are the full-budget
comparisons, with CleanRL's defaults:

* PPO CartPole-v1, seeds 1-3, up to CleanRL's 500k steps, stopping at a rolling-20 return of 475: two of three reach it;
* PPO with --policy-lag 1 (the sampler thread, one update behind) on CartPole-v1, the same bar on seed 1;
* PPO (continuous) InvertedPendulum-v5 within 150k steps to a rolling-10 of 950, and `fleetrl eval` of the policy it
  stopped with gives at least 0.9x its last 10 training episodes;
* DQN CartPole-v1, 500k steps, seed 1: the mean of the last 20 episodes is at least 450 (CleanRL publishes 488.69 ± 16.11);
* SAC and TD3 InvertedPendulum-v5 to a rolling-10 of 950 within 26,000 and 46,000 steps (TD3 with --learning-starts
  10000: from CleanRL's 25,000 it was still near 350 at 50,000).

Each run is `fleetrl train` in its own process with one torch thread; the table gives its score, the step at which the
bar was first reached, the bar, and the minutes it took (a measure of cost, not of speed: runs share the cores).
Exit status 1 if any check misses its bar.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PENDULUM = ["--env-id", "InvertedPendulum-v5", "--env-backend", "sync"]
STOP_CARTPOLE = ["--stop-at-return", "475", "--stop-window", "20"]


@dataclass
class Run:
    """One training run and how it is scored."""

    name: str
    flags: list[str]
    budget: int
    score: str  # "best" (the best rolling mean of `window` episodes) or "last" (the mean of the last `window`)
    window: int
    bar: float
    eval_episodes: int = 0  # > 0: `fleetrl eval` the run afterwards; it must give at least 0.9x its last `window` episodes


@dataclass
class Check:
    name: str
    runs: list[Run]
    needed: int  # how many of the runs must meet their bar
    note: str = ""
    results: list[dict] = field(default_factory=list)


CHECKS = [
    Check("ppo-cartpole", [Run(f"seed {s}", ["ppo", "--env-id", "CartPole-v1", "--seed", str(s), *STOP_CARTPOLE], 500_000, "best", 20, 475)
                           for s in (1, 2, 3)], needed=2, note="two of three seeds"),
    Check("ppo-lag-cartpole", [Run("seed 1", ["ppo", "--env-id", "CartPole-v1", "--seed", "1", "--policy-lag", "1", *STOP_CARTPOLE],
                                   500_000, "best", 20, 475)], needed=1),
    Check("ppo-pendulum", [Run("seed 1", ["ppo", *PENDULUM[:2], "--seed", "1", "--stop-at-return", "950", "--stop-window", "10"],
                               150_000, "best", 10, 950, eval_episodes=10)], needed=1, note="and eval >= 0.9x training"),
    Check("dqn-cartpole", [Run("seed 1", ["dqn", "--env-id", "CartPole-v1", "--seed", "1"], 500_000, "last", 20, 450)], needed=1,
          note="CleanRL: 488.69 ± 16.11"),
    Check("sac-pendulum", [Run("seed 1", ["sac", *PENDULUM, "--seed", "1"], 26_000, "best", 10, 950)], needed=1),
    Check("td3-pendulum", [Run("seed 1", ["td3", *PENDULUM, "--seed", "1", "--learning-starts", "10000"], 46_000, "best", 10, 950)],
          needed=1),
]


def rolling(values: np.ndarray, window: int) -> np.ndarray:
    return np.convolve(values, np.ones(window) / window, mode="valid") if len(values) >= window else np.array([])


def fleetrl(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fleetrl", *args], capture_output=True, text=True, env=env, timeout=timeout)


def train(check: Check, run: Run, out: Path) -> dict:
    from fleetrl.monitor.tbread import read_scalars

    run_dir = out / check.name / run.name.replace(" ", "_")
    shutil.rmtree(run_dir, ignore_errors=True)  # afresh: never a resume of an earlier call's run
    started = time.perf_counter()
    proc = fleetrl("train", *run.flags, "--total-timesteps", str(run.budget), "--torch-threads", "1", "--no-cuda", "--no-progress",
                   "--checkpoint-every", "100000", "--run-dir", str(run_dir), timeout=4 * 3600)
    minutes = (time.perf_counter() - started) / 60
    if proc.returncode != 0:
        return {"run": run.name, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}", "minutes": minutes}
    points = read_scalars(run_dir, "charts/episodic_return")
    returns, steps = np.array([p.value for p in points]), np.array([p.step for p in points])
    means = rolling(returns, run.window)
    score = float(means.max()) if run.score == "best" and len(means) else float(returns[-run.window:].mean()) if len(returns) else float("nan")
    reached = np.flatnonzero(means >= run.bar)
    result = {"run": run.name, "score": score, "met": score >= run.bar, "minutes": minutes, "episodes": len(returns),
              "reached_at": int(steps[reached[0] + run.window - 1]) if len(reached) else None,
              "last_step": int(steps[-1]) if len(steps) else 0}
    if run.eval_episodes:
        evaluated = fleetrl("eval", str(run_dir), "--episodes", str(run.eval_episodes), "--json", timeout=1800)
        last = float(returns[-run.window:].mean())
        mean = json.loads(evaluated.stdout.strip().splitlines()[-1])["mean_return"] if evaluated.returncode == 0 else float("nan")
        result.update(eval_return=mean, last_training=last, met=result["met"] and mean >= 0.9 * last)
    return result


def table(checks: list[Check], host: str) -> str:
    lines = [f"Machine: {host}", "",
             "| check | run | budget | score | bar | reached at step | eval | met | minutes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for check in checks:
        for run, r in zip(check.runs, check.results):
            kind = f"best rolling {run.window}" if run.score == "best" else f"last {run.window}"
            if "error" in r:
                lines.append(f"| {check.name} | {r['run']} | {run.budget:,} | failed: {r['error'][:80]} | | | | no | {r['minutes']:.1f} |")
                continue
            reached = f"{r['reached_at']:,}" if r["reached_at"] is not None else "-"
            ev = f"{r['eval_return']:.0f} vs {r['last_training']:.0f}" if "eval_return" in r else ""
            lines.append(f"| {check.name} | {r['run']} | {run.budget:,} | {r['score']:.1f} ({kind}) | {run.bar:g} | {reached} | {ev} | "
                         f"{'yes' if r['met'] else 'no'} | {r['minutes']:.1f} |")
        met = sum(bool(r.get("met")) for r in check.results)
        note = f" ({check.note})" if check.note else ""
        lines.append(f"| **{check.name}** | {met} of {len(check.runs)} met, {check.needed} needed{note} | | | | | | "
                     f"**{'yes' if met >= check.needed else 'no'}** | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", nargs="+", choices=[c.name for c in CHECKS], default=[c.name for c in CHECKS])
    parser.add_argument("--parallel", type=int, default=2, help="runs at the same time (one torch thread each)")
    parser.add_argument("--out", type=Path, default=Path("runs/learning_budgets"), help="the runs' folders (started afresh)")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import platform

    import torch

    checks = [c for c in CHECKS if c.name in opts.checks]
    jobs = [(check, run) for check in checks for run in check.runs]
    started = time.perf_counter()
    with ThreadPoolExecutor(opts.parallel) as pool:
        results = list(pool.map(lambda job: train(*job, opts.out), jobs))
    for (check, _), result in zip(jobs, results):
        check.results.append(result)
        print(f"{check.name} {result['run']}: {json.dumps(result)}", flush=True)
    host = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {opts.parallel} runs at a time"
    text = table(checks, host) + f"\n\nWall time: {(time.perf_counter() - started) / 60:.1f} min"
    print(text)
    if opts.markdown:
        opts.markdown.write_text(text + "\n")
    sys.exit(0 if all(sum(bool(r.get("met")) for r in c.results) >= c.needed for c in checks) else 1)


if __name__ == "__main__":
    main()
