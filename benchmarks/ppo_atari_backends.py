"""PPO on an Atari game end to end with each env backend: training SPS per backend.

    python benchmarks/ppo_atari_backends.py [--env-id BreakoutNoFrameskip-v4] [--iterations 4]

Each backend trains `fleetrl train ppo` with the Atari defaults (8 envs x 128 steps) for a few
iterations; SPS is the median of charts/SPS_window over the iterations after the first, and the
env share is the median of perf/env_share. On a CPU the Nature CNN's update dominates, so the
backend moves the total less than it moves env throughput (compare `fleetrl bench-env`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from fleetrl.monitor.tbread import read_scalars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--backends", default="sync,async,ale,envpool")
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            run_dir = os.path.join(tmp, backend)
            cmd = [sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", args.env_id, "--env-backend", backend,
                   "--total-timesteps", str(args.iterations * 8 * 128), "--no-cuda", "--no-progress", "--run-dir", run_dir]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                rows.append((backend, "failed", "", proc.stderr.strip().splitlines()[-1][:120]))
                continue
            sps = statistics.median(p.value for p in read_scalars(run_dir, "charts/SPS_window")[1:])
            env_share = statistics.median(p.value for p in read_scalars(run_dir, "perf/env_share")[1:])
            learn_share = statistics.median(p.value for p in read_scalars(run_dir, "perf/learn_share")[1:])
            rows.append((backend, f"{sps:,.0f}", f"{100 * env_share:.0f}%", f"{100 * learn_share:.0f}%"))
    print(f"\nfleetrl train ppo --env-id {args.env_id} (8 envs x 128 steps), {args.iterations - 1} timed iterations, "
          f"{os.cpu_count()} CPU cores\n")
    print("| backend | training SPS | env share | learn share |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
