"""What monitoring and preflight cost: the speed figures the test suite used to assert, measured here instead.

    python benchmarks/monitor_overhead.py [--iterations 80]

Three rows, each with the target it was once asserted against in tests (speed depends on the machine and its load,
so the suite checks behaviour and this script reports the figures):
- the resource sampler's own CPU time per sample, as a share of a core at its 2 s default interval (target < 1%);
- `fleetrl preflight --seconds 0.5`'s wall time (target < 15 s);
- the median `perf/other_share` of a CartPole training run, iterations after the first (target < 0.10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from fleetrl.monitor.resources import ResourceSampler
from fleetrl.monitor.tbread import read_scalars

SAMPLER_INTERVAL_S = 2.0  # ResourceSampler's default interval


def sampler_share(seconds: float = 2.0) -> float:
    with ResourceSampler(interval=0.05) as sampler:
        time.sleep(seconds)
    return sampler.sample_cpu_s / sampler.samples / SAMPLER_INTERVAL_S


def preflight_wall_s() -> float:
    proc = subprocess.run([sys.executable, "-m", "fleetrl", "preflight", "--json", "--seconds", "0.5"], capture_output=True, text=True,
                          timeout=300)
    return float(json.loads(proc.stdout)["status"]["wall_s"])


def median_other_share(iterations: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run([sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", str(iterations * 512),
                        "--env-backend", "sync", "--run-dir", run_dir, "--no-cuda", "--no-progress"], check=True, capture_output=True, timeout=900)
        return statistics.median(p.value for p in read_scalars(run_dir, "perf/other_share")[1:])  # the first holds warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=80, help="PPO iterations of the other_share run")
    args = parser.parse_args()
    rows = [
        ("resource sampler, share of a core at 2 s", sampler_share(), 0.01, "{:.3%}"),
        ("preflight --seconds 0.5, wall s", preflight_wall_s(), 15.0, "{:.1f}"),
        ("PPO CartPole, median perf/other_share", median_other_share(args.iterations), 0.10, "{:.3f}"),
    ]
    print("| check | measured | target | ok |\n|---|---|---|---|")
    for name, value, target, fmt in rows:
        print(f"| {name} | {fmt.format(value)} | < {fmt.format(target)} | {'yes' if value < target else 'NO'} |")


if __name__ == "__main__":
    main()
