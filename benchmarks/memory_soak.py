"""Memory stays flat: a long PPO run per env backend, its process tree's RSS sampled, printed as a table.

    python benchmarks/memory_soak.py                      # 20 minutes per backend (the reliability target)
    python benchmarks/memory_soak.py --minutes 3 --backends sync async

Each run is a real `fleetrl train ppo` with a huge --total-timesteps, stopped with SIGTERM (so it also
checkpoints and exits cleanly) after --minutes. The first --warmup share of the run is warm-up (allocator
pools, TensorBoard buffers, the first checkpoint); the verdict compares every later sample with the RSS at
the end of warm-up: flat means every later minute's median RSS within --tolerance (10%) of the first one's
(single samples swing with the phase of an iteration). RSS is the trainer plus its env worker processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

ENVS = {"sync": "CartPole-v1", "async": "CartPole-v1", "gym-sync": "CartPole-v1", "envpool": "CartPole-v1",
        "ale": "BreakoutNoFrameskip-v4"}


def tree_rss_mb(root: psutil.Process) -> float:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def soak(backend: str, minutes: float, warmup: float, interval: float) -> dict:
    env_id = ENVS[backend]
    run_dir = tempfile.mkdtemp(prefix=f"soak-{backend}-")
    cmd = [sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", env_id, "--env-backend", backend, "--no-cuda",
           "--total-timesteps", str(10**10), "--checkpoint-every", "20", "--run-dir", run_dir, "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, float]] = []
    start = time.time()
    try:
        while time.time() - start < minutes * 60:
            if proc.poll() is not None:
                raise RuntimeError(f"{backend}: the run ended early (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
            samples.append((time.time() - start, tree_rss_mb(root)))
            time.sleep(interval)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if ARGS.series:
        with open(ARGS.series, "a") as f:
            f.writelines(f"{backend},{t:.1f},{rss:.1f}\n" for t, rss in samples)
    after = [(t, rss) for t, rss in samples if t >= warmup * minutes * 60]
    # RSS swings within an iteration (an update allocates and frees its batch copies and activations: ~100 MB for
    # a Nature CNN), so a leak shows in the trend of per-minute medians, not in single samples
    minutes_medians = [statistics.median(rss for t, rss in after if int((t - after[0][0]) // 60) == m)
                       for m in range(int((after[-1][0] - after[0][0]) // 60) + 1)]
    base = minutes_medians[0]
    worst = max(abs(m - base) / base for m in minutes_medians)
    slope = np.polyfit([t / 3600 for t, _ in after], [rss for _, rss in after], 1)[0]  # MB per hour
    return {"backend": backend, "env": env_id, "samples": len(samples), "warm_mb": base,
            "min_mb": min(rss for _, rss in after), "max_mb": max(rss for _, rss in after),
            "final_mb": minutes_medians[-1], "drift": (minutes_medians[-1] - base) / base, "worst": worst, "slope": slope,
            "flat": worst <= ARGS.tolerance, "exit": proc.returncode}


def main() -> None:
    rows = [soak(b, ARGS.minutes, ARGS.warmup, ARGS.interval) for b in ARGS.backends]
    print(f"\nPPO memory soak: {ARGS.minutes:g} min per backend, RSS of the trainer and its workers every {ARGS.interval:g} s, "
          f"warm-up {ARGS.warmup:.0%}; {os.cpu_count()} cores\n")
    print("| backend | env | samples | first minute after warm-up, median (MB) | last minute, median (MB) | drift | "
          "worst minute vs first | trend (MB/hour) | samples min-max (MB) | within 10% | exit on SIGTERM |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['env']} | {r['samples']} | {r['warm_mb']:.0f} | {r['final_mb']:.0f} | {r['drift']:+.1%} | "
              f"{r['worst']:.1%} | {r['slope']:+.1f} | {r['min_mb']:.0f}-{r['max_mb']:.0f} | {'yes' if r['flat'] else 'NO'} | {r['exit']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--backends", nargs="+", default=["sync", "async", "envpool", "ale"], choices=list(ENVS))
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run counted as warm-up")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--series", help="append every sample (backend, seconds, MB) to this CSV file")
    ARGS = parser.parse_args()
    main()
