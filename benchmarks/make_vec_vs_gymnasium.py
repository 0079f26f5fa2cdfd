"""Issue 34's make_vec targets: CleanRL's own PPO scripts on fleetrl's envs (make_vec) against gymnasium's vector envs.

    python benchmarks/make_vec_vs_gymnasium.py speed [--repeats 3] [--cpus 0,1]
    python benchmarks/make_vec_vs_gymnasium.py learning [--seeds 5] [--steps 500000] [--cpus 1]

Every run is a fresh process of a script written by benchmarks/cleanrl/patch.py: CleanRL's ppo.py / ppo_atari.py,
ported to gymnasium 1.x, with its one ``envs = ...`` line as gymnasium's SyncVectorEnv / AsyncVectorEnv or as
fleetrl's make_vec. Each run is pinned with ``taskset -c CPUS``.

speed: side by side, variants alternating in every repeat; SPS is the script's last printed ``SPS:`` (its average
since the start, so the start-up is in it); peak RSS is the whole process tree's (the script and every env worker),
sampled every 50 ms.
  * CartPole-v1, 4 envs: make_vec (auto) against SyncVectorEnv (target ratio >= 1.0).
  * a 5 ms sleeping env (benchmarks/ppo_speed_envs.py), 64 envs: make_vec (auto) against AsyncVectorEnv
    (target >= 1.3x, and a smaller peak RSS).
  * BreakoutNoFrameskip-v4, 8 envs: make_vec (auto, ale) against SyncVectorEnv (target >= 1.2x).
learning: CartPole-v1 at CleanRL's defaults, make_vec against SyncVectorEnv: each run's score is the mean of its last
20 episodes; IQM and mean with 95% bootstrap intervals, and P(make_vec > SyncVectorEnv) (fleetrl/tools/stats.py).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "cleanrl"))
import patch  # noqa: E402  (benchmarks/cleanrl/patch.py)

SPEED_CASES = [
    # (name, script, args, [(label, variant)], target ratio of the first over the second)
    ("CartPole-v1, 4 envs", "ppo", ["--env-id", "CartPole-v1", "--num-envs", "4", "--total-timesteps", "40960"],
     [("make_vec", "make_vec"), ("SyncVectorEnv", "gym_sync")], 1.0),
    ("Sleep5ms-v0, 64 envs", "ppo", ["--env-id", "ppo_speed_envs:Sleep5ms-v0", "--num-envs", "64", "--num-steps", "32",
                                     "--total-timesteps", "16384"],
     [("make_vec", "make_vec"), ("AsyncVectorEnv", "gym_async")], 1.3),
    ("Breakout, 8 envs", "ppo_atari", ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--total-timesteps", "3072"],
     [("make_vec (ale)", "make_vec"), ("SyncVectorEnv", "gym_sync")], 1.2),
]
SPS_LINE = re.compile(r"^SPS: (\d+)", re.M)
RETURN_LINE = re.compile(r"episodic_return=\[?([-\d.e+]+)")
LAST_EPISODES = 20


def run_script(scripts: Path, name: str, variant: str, args: list[str], cpus: str) -> tuple[str, float]:
    """Run one variant to the end: its output and the peak RSS (MB) of its whole process tree."""
    env = {**__import__("os").environ, "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(["taskset", "-c", cpus, sys.executable, str(scripts / f"{name}_{variant}.py"), *args],
                            cwd=scripts, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = [0.0]

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20)
            except psutil.Error:
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, _ = proc.communicate()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{name}_{variant} {' '.join(args)} failed ({proc.returncode}):\n{out[-3000:]}")
    return out, peak[0]


def speed(scripts: Path, repeats: int, cpus: str, only: str | None) -> None:
    print(f"speed: medians of {repeats}, variants alternating; taskset -c {cpus}; SPS as CleanRL prints it (since the start)")
    print("| workload | variant | SPS (median) | all runs | peak RSS of the process tree, MB (median) | ratio (SPS) | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case, name, args, variants, target in SPEED_CASES:
        if only and only not in case:
            continue
        sps: dict[str, list[int]] = {label: [] for label, _ in variants}
        rss: dict[str, list[float]] = {label: [] for label, _ in variants}
        for r in range(repeats):
            for label, variant in (variants if r % 2 == 0 else variants[::-1]):  # alternate who goes first
                out, peak = run_script(scripts, name, variant, args, cpus)
                sps[label].append(int(SPS_LINE.findall(out)[-1]))
                rss[label].append(peak)
        medians = {label: statistics.median(v) for label, v in sps.items()}
        first, second = (label for label, _ in variants)
        ratio = medians[first] / medians[second]
        for label, _ in variants:
            cells = [case, label, f"{medians[label]:,.0f}", ", ".join(f"{s:,}" for s in sps[label]),
                     f"{statistics.median(rss[label]):,.0f}", f"{ratio:.2f}x" if label == first else "", f">= {target}x" if label == first else ""]
            print("| " + " | ".join(cells) + " |", flush=True)


def learning(scripts: Path, seeds: int, steps: int, cpus: str) -> None:
    from fleetrl.tools.stats import interval_estimates, probability_of_improvement

    variants = [("make_vec", "make_vec"), ("SyncVectorEnv", "gym_sync")]
    scores: dict[str, list[float]] = {label: [] for label, _ in variants}
    started = time.time()
    for seed in range(1, seeds + 1):
        for label, variant in (variants if seed % 2 else variants[::-1]):
            out, _ = run_script(scripts, "ppo", variant, ["--env-id", "CartPole-v1", "--seed", str(seed), "--total-timesteps",
                                                          str(steps)], cpus)
            returns = [float(x) for x in RETURN_LINE.findall(out)]
            scores[label].append(float(np.mean(returns[-LAST_EPISODES:])))
            print(f"seed {seed} {label}: mean of the last {LAST_EPISODES} episodes {scores[label][-1]:.1f} "
                  f"({len(returns)} episodes, SPS {SPS_LINE.findall(out)[-1]}, {time.time() - started:.0f} s in)", flush=True)
    print(f"\nlearning: CartPole-v1, CleanRL's ppo.py defaults, {steps:,} steps, seeds 1..{seeds}; taskset -c {cpus}")
    print("| variant | runs | IQM [95% CI] | mean [95% CI] | scores |")
    print("| --- | --- | --- | --- | --- |")
    for label, _ in variants:
        est = interval_estimates(np.array(scores[label])[:, None], normalised=False, reps=2000, seed=0)
        print(f"| {label} | {len(scores[label])} | {est['IQM'].cell(1)} | {est['mean'].cell(1)} | "
              f"{', '.join(f'{s:.1f}' for s in scores[label])} |")
    p = probability_of_improvement(np.array(scores["make_vec"])[:, None], np.array(scores["SyncVectorEnv"])[:, None], 2000, 0)
    print(f"\nP(make_vec > SyncVectorEnv) = {p.cell(2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "learning"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--cpus", default="0,1", help="taskset -c CPUS for every run")
    parser.add_argument("--only", help="speed: only the workload whose name contains this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="make-vec-bench-") as tmp:
        patch.main(Path(tmp))
        if args.what == "speed":
            speed(Path(tmp), args.repeats, args.cpus, args.only)
        else:
            learning(Path(tmp), args.seeds, args.steps, args.cpus)


if __name__ == "__main__":
    main()
