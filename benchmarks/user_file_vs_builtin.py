"""A user's own algorithm file is as fast as the built-in: `fleetrl train ./my_ppo.py` (made by `fleetrl new my_ppo
--from ppo`) against `fleetrl train ppo`, on CartPole-v1 (4 envs) and Breakout (8 envs), each a fresh process.

    python benchmarks/user_file_vs_builtin.py [--repeats 3] [--cartpole-steps 200000] [--breakout-steps 40000]

Side by side, alternating, medians of the repeats. SPS is the run's own `charts/SPS` at its end (CleanRL's: global steps
over wall seconds since the start of training, so the start of the process is left out alike for both). On a shared
machine wall time swings with the other jobs; steps per CPU second (the run's whole process tree, its start included)
do not, so both are shown. Target (issue 34): the user's file ≥ 0.97x the built-in's SPS on each env.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fleetrl.monitor.tbread import read_scalars
from fleetrl.tools.new import template



def sps_of(command: list[str], run_dir: Path, cwd: Path) -> tuple[float, float]:
    """The run's own SPS (wall) and its steps per CPU second (user + system time of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([*command, "--run-dir", str(run_dir), "--no-progress", "--checkpoint-every", "1000000"], cwd=cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    steps = int(command[command.index("--total-timesteps") + 1])
    return read_scalars(run_dir, "charts/SPS")[-1][1], steps / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cartpole-steps", type=int, default=200_000)
    parser.add_argument("--breakout-steps", type=int, default=40_000)
    opts = parser.parse_args()
    steps = {"CartPole-v1": opts.cartpole_steps, "BreakoutNoFrameskip-v4": opts.breakout_steps}
    fleetrl = [sys.executable, "-m", "fleetrl", "train"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "my_ppo.py").write_text(template("ppo", "my_ppo"))
        contenders = {"fleetrl train ppo": [*fleetrl, "ppo"], "fleetrl train ./my_ppo.py": [*fleetrl, "./my_ppo.py"]}
        for env_id, total in steps.items():
            sps: dict[str, list[float]] = {name: [] for name in contenders}
            per_cpu: dict[str, list[float]] = {name: [] for name in contenders}
            for repeat in range(opts.repeats):
                order = list(contenders) if repeat % 2 == 0 else list(reversed(contenders))  # alternate who goes first
                for name in order:
                    run_dir = folder / f"{env_id}-{len(sps[name])}-{name.split()[-1].strip('./')}"
                    wall, cpu = sps_of([*contenders[name], "--env-id", env_id, "--total-timesteps", str(total)], run_dir, folder)
                    sps[name].append(wall)
                    per_cpu[name].append(cpu)
                    print(f"{env_id} {name}: {wall:,.0f} SPS, {cpu:,.0f} steps per CPU second", file=sys.stderr, flush=True)
            builtin = statistics.median(sps["fleetrl train ppo"])
            builtin_cpu = statistics.median(per_cpu["fleetrl train ppo"])
            for name, values in sps.items():
                rows.append((env_id, total, name, values, statistics.median(values) / builtin, statistics.median(per_cpu[name]),
                             statistics.median(per_cpu[name]) / builtin_cpu))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    print(f"\nA user's file against the built-in: PPO with each env family's defaults, {opts.repeats} repeats alternating, "
          f"medians; {cpu}, {os.cpu_count()} CPU cores\n")
    print("| env | steps | command | SPS (median) | SPS (each repeat) | vs built-in | steps per CPU s (median) | vs built-in |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for env_id, total, name, values, ratio, cpu, cpu_ratio in rows:
        print(f"| {env_id} | {total:,} | `{name}` | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | "
              f"{ratio:.3f}x | {cpu:,.0f} | {cpu_ratio:.3f}x |")


if __name__ == "__main__":
    main()
