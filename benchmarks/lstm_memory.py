"""Memory matters (issue 25's target): on CartPoleNoVel-v1 (CartPole without its velocities), `fleetrl train ppo_lstm`
against feed-forward `fleetrl train ppo`, each with its defaults, 3 seeds, 300k steps.

    python benchmarks/lstm_memory.py                          # 3 seeds each, 2 runs at a time (~1 h on 2 cores)
    python benchmarks/lstm_memory.py --seeds 1 --steps 100000 --png /tmp/curves.png

A run's score is the mean return of its last 20 episodes; "reached 400 at" is the first step where that mean was at
least 400 (the target: every ppo_lstm seed within 300k steps, and ppo clearly lower). Each run is its own subprocess
with one torch thread. The curves (the mean of the last 20 episodes against the step, per run) go to ``--png``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV_ID = "CartPoleNoVel-v1"
WINDOW, TARGET = 20, 400.0


def train(algo: str, seed: int, steps: int, run_dir: str) -> tuple[float, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fleetrl", "train", algo, "--env-id", ENV_ID, "--seed", str(seed), "--total-timesteps",
                           str(steps), "--no-cuda", "--no-progress", "--torch-threads", "1", "--run-dir", run_dir],
                          capture_output=True, text=True, env=env)
    return time.perf_counter() - started, "" if proc.returncode == 0 else proc.stderr[-2000:]


def curve(run_dir: str) -> tuple[list[int], list[float]]:
    """The mean of the last ``WINDOW`` episode returns after each episode, and the step it ended at."""
    sys.path.insert(0, ROOT)
    from fleetrl.monitor.tbread import read_scalars

    points = read_scalars(run_dir, "charts/episodic_return")
    steps, means = [], []
    for k in range(WINDOW, len(points) + 1):
        steps.append(points[k - 1].step)
        means.append(statistics.mean(p.value for p in points[k - WINDOW : k]))
    return steps, means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time")
    parser.add_argument("--png", default=os.path.join(ROOT, "docs", "img", "lstm_memory.png"))
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    opts = parser.parse_args()
    out = opts.out or tempfile.mkdtemp(prefix="lstm_memory_")
    runs = [(algo, seed, os.path.join(out, f"{algo}_{seed}")) for algo in ("ppo_lstm", "ppo") for seed in opts.seeds]
    started = time.perf_counter()
    with ThreadPoolExecutor(opts.parallel) as pool:
        done = dict(zip(runs, pool.map(lambda r: train(r[0], r[1], opts.steps, r[2]), runs)))

    rows, curves = [], {}
    for (algo, seed, run_dir), (seconds, error) in done.items():
        if error:
            rows.append(f"| {algo} | {seed} | FAILED | | | {seconds:.0f} |")
            print(f"FAILED {algo} seed {seed}:\n{error}", file=sys.stderr)
            continue
        steps, means = curve(run_dir)
        curves[(algo, seed)] = (steps, means)
        reached = next((s for s, m in zip(steps, means) if m >= TARGET), None)
        rows.append(f"| {algo} | {seed} | {means[-1] if means else float('nan'):.1f} | {max(means, default=float('nan')):.1f} | "
                    f"{f'{reached:,}' if reached else 'never'} | {seconds:.0f} |")
    lines = [f"## Memory matters: {ENV_ID}, ppo_lstm against ppo (benchmarks/lstm_memory.py)", "",
             f"`python benchmarks/lstm_memory.py {' '.join(sys.argv[1:])}`: {opts.steps:,} steps, each algorithm's defaults, "
             f"one torch thread a run; {time.perf_counter() - started:.0f} s in all.", "",
             f"| algorithm | seed | mean of the last {WINDOW} episodes | best such mean | reached {TARGET:.0f} at step | seconds |",
             "| --- | --- | --- | --- | --- | --- |", *rows, ""]
    lstm_ok = [c for (a, _), c in curves.items() if a == "ppo_lstm" and any(m >= TARGET for m in c[1])]
    lines.append(f"- Target: every ppo_lstm seed reaches {TARGET:.0f} within {opts.steps:,} steps: "
                 f"**{len(lstm_ok)} of {len(opts.seeds)}**, {'met' if len(lstm_ok) == len(opts.seeds) else 'NOT met'}.")
    text = "\n".join(lines)
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (algo, seed), (steps, means) in sorted(curves.items()):
        ax.plot(steps, means, color="tab:blue" if algo == "ppo_lstm" else "tab:orange", alpha=0.8,
                label=algo if seed == opts.seeds[0] else None)
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="environment steps", ylabel=f"mean return of the last {WINDOW} episodes", title=f"{ENV_ID}: memory matters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(opts.png, dpi=100)
    print(f"curves: {opts.png}")


if __name__ == "__main__":
    main()
