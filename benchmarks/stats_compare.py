"""Issue 25's repeatable-intervals target: `fleetrl compare` on two 10-seed PPO CartPole benchmarks, CleanRL's defaults
against a learning rate 10x lower, prints a probability of improvement whose interval excludes 0.5, and the same
numbers when run again.

    nice -n 19 python benchmarks/stats_compare.py [--seeds 10] [--steps 100000] [--workers 2] [--out runs/stats_cartpole]

Each configuration is one `fleetrl benchmark` (finished runs in --out are skipped on a second call); then `fleetrl compare`
runs twice on the two folders, with --score-bounds CartPole-v1=0,500 so that the optimality gap has its target. Prints
the compare table, its wall time, and whether the two outputs are the same. The figures are in OUT/compare/.
A check with tiny sizes (not a measurement):
    python benchmarks/stats_compare.py --seeds 2 --steps 2048 --out runs/stats_check
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

ENV_ID = "CartPole-v1"
CONFIGURATIONS = {"defaults": [], "lr_2.5e-5": ["--learning-rate", "2.5e-5"]}  # CleanRL's default is 2.5e-4
LABELS = ["CleanRL defaults", "lr 2.5e-5"]
BOUNDS = f"{ENV_ID}=0,500"  # CartPole-v1's returns run from 0 to 500


def fleetrl(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fleetrl", *args]
    print(f"$ {shlex.join(command)}", flush=True)
    return subprocess.run(command, capture_output=True, text=True)


def benchmark(out: Path, name: str, flags: list[str], seeds: int, steps: int, workers: int) -> None:
    start = time.perf_counter()
    proc = fleetrl("benchmark", "--env-ids", ENV_ID, "--num-seeds", str(seeds), "--workers", str(workers), "--out", str(out / name),
                   "--score-bounds", BOUNDS, "--", "fleetrl", "train", "ppo", "--total-timesteps", str(steps), *flags)  # fmt: skip
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} benchmark failed; its output is in {out / f'{name}.log'}")
    print(f"{name}: {time.perf_counter() - start:.0f}s (runs that finished in an earlier call are skipped)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per configuration")
    parser.add_argument("--steps", type=int, default=100_000, help="--total-timesteps of each run")
    parser.add_argument("--workers", type=int, default=2, help="runs at the same time")
    parser.add_argument("--out", default="runs/stats_cartpole", help="folder for the two benchmarks and the comparison")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, flags in CONFIGURATIONS.items():
        benchmark(out, name, flags, args.seeds, args.steps, args.workers)

    outputs, walls = [], []
    for _ in range(2):
        start = time.perf_counter()
        proc = fleetrl("compare", *(str(out / name) for name in CONFIGURATIONS), "--labels", *LABELS, "--score-bounds", BOUNDS,
                       "--out", str(out / "compare"))  # fmt: skip
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"fleetrl compare failed:\n{proc.stdout}{proc.stderr}")
        outputs.append(proc.stdout)
    print(f"\nPPO {ENV_ID}, {args.seeds} seeds x {args.steps:,} steps per configuration\n")
    print(outputs[0])
    print(f"fleetrl compare: {walls[0]:.1f}s, then {walls[1]:.1f}s; the second output is "
          f"{'the same' if outputs[0] == outputs[1] else 'DIFFERENT'} (target: the same)")
    poi = next(line for line in outputs[0].splitlines() if line.startswith(f"| {LABELS[0]} | {LABELS[1]} |"))
    low, high = (float(x) for x in poi.split("[")[1].split("]")[0].split(","))
    print(f"P({LABELS[0]} > {LABELS[1]}) interval [{low}, {high}] {'excludes' if low > 0.5 or high < 0.5 else 'includes'} 0.5 "
          "(target: excludes)")


if __name__ == "__main__":
    main()
