"""Learning, side by side: fleetrl's SAC and TD3 against CleanRL's own loops on HalfCheetah-v5, at a budget this
machine can afford (issue 13's learning target).

    python benchmarks/offpolicy_learning.py                          # SAC and TD3, 50k steps, seed 1 (~30 min on 2 cores)
    python benchmarks/offpolicy_learning.py --algos td3 --steps 100000 --seeds 1 2
    python benchmarks/offpolicy_learning.py --markdown learning.md

CleanRL publishes 9,635 (SAC) and 9,583 (TD3) at 1M steps on HalfCheetah-v4, about 2.5 hours a run at this machine's
~110 SPS; its curves at fewer steps are only in its W&B reports, which cannot be reached from here. So the reference
at the same step is CleanRL's own loop run here (benchmarks/plain_offpolicy.py: its networks, hyperparameters and
update, same env, seed and budget), and the published 1M value is listed for scale.

Each run is its own subprocess with one torch thread, and two run at a time (``--parallel``): the comparison is of
returns, not speed. A run's score is the mean return of its last 10 episodes (HalfCheetah's episodes are 1,000
steps: no early termination) and the mean at each 10,000-step mark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_MARKER = "OFFPOLICY_LEARNING_RESULT "
PUBLISHED_1M = {"sac": "9,635 ± 1,424", "td3": "9,583 ± 126"}  # CleanRL docs/benchmark, HalfCheetah-v4, 3 seeds
LAST_EPISODES = 10
EPISODE_STEPS = 1_000


def run_one(opts: argparse.Namespace) -> None:
    """In the subprocess: one run, its episode returns as one line of JSON."""
    import importlib

    import torch

    torch.set_num_threads(1)
    module = importlib.import_module(f"fleetrl.algos.{opts.algo}")
    if opts.side == "plain":
        sys.path.insert(0, HERE)
        import plain_offpolicy

        run = getattr(plain_offpolicy, f"plain_{opts.algo}")
        learning_starts = module.FAMILY_DEFAULTS["mujoco"]["learning_starts"]  # CleanRL's default, as fleetrl's side takes it
        returns = run(opts.env_id, opts.steps, learning_starts, seed=opts.seed).episode_returns
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as runs:
            args = module.Args(env_id=opts.env_id, total_timesteps=opts.steps, seed=opts.seed, torch_threads=1,
                               run_dir=os.path.join(runs, "run"), progress=False)
            returns = module.train(args).episode_returns
    print(RESULT_MARKER + json.dumps({"returns": returns}), flush=True)


def launch(algo: str, side: str, seed: int, opts: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--run-one", "--algo", algo, "--side", side, "--seed", str(seed), "--steps", str(opts.steps),
           "--env-id", opts.env_id]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        return {"algo": algo, "side": side, "seed": seed, "error": proc.stderr.strip().splitlines()[-5:]}
    returns = json.loads(lines[-1][len(RESULT_MARKER):])["returns"]
    return {"algo": algo, "side": side, "seed": seed, "returns": returns, "minutes": (time.perf_counter() - start) / 60}


def at_marks(returns: list[float], steps: int, every: int = 10_000) -> list[str]:
    """The mean of the last episodes finished by each mark (episode k ends at step (k + 1) * 1,000)."""
    out = []
    for mark in range(every, steps + 1, every):
        done = returns[: mark // EPISODE_STEPS]
        out.append(f"{statistics.mean(done[-LAST_EPISODES:]):,.0f}" if done else "-")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="sac,td3")
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (each with one torch thread)")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--run-one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--algo", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.run_one:
        return run_one(opts)

    jobs = [(algo, side, seed) for algo in opts.algos.split(",") for seed in opts.seeds for side in ("plain", "fleetrl")]
    started = time.perf_counter()
    with ThreadPoolExecutor(opts.parallel) as pool:
        results = list(pool.map(lambda job: launch(*job, opts), jobs))

    marks = list(range(10_000, opts.steps + 1, 10_000))
    lines = ["## Off-policy learning (benchmarks/offpolicy_learning.py)", "",
             f"Command: `python benchmarks/{os.path.basename(__file__)} {' '.join(sys.argv[1:])}`; "
             f"{opts.env_id}; total {(time.perf_counter() - started) / 60:.0f} min.", "",
             f"Mean return of the last {LAST_EPISODES} episodes finished by each step; CleanRL's defaults on both sides.", "",
             "| algorithm | side | seed | " + " | ".join(f"{m // 1000}k" for m in marks) + " | run (min) | CleanRL published at 1M (v4) |",
             "| --- | --- | --- | " + " | ".join("---" for _ in marks) + " | --- | --- |"]
    for r in results:
        name = {"plain": "CleanRL loop", "fleetrl": "fleetrl"}[r["side"]]
        if "error" in r:
            lines.append(f"| {r['algo'].upper()} | {name} | {r['seed']} | FAILED: {' / '.join(r['error'])} |")
            continue
        lines.append(f"| {r['algo'].upper()} | {name} | {r['seed']} | " + " | ".join(at_marks(r["returns"], opts.steps))
                     + f" | {r['minutes']:.1f} | {PUBLISHED_1M[r['algo']]} |")
    text = "\n".join(lines)
    print(text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
