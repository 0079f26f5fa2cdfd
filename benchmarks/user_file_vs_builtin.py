"""A user's own algorithm file is as fast as the built-in: `fleetrl train ./my_ppo.py` (made by `fleetrl new my_ppo
--from ppo`) against `fleetrl train ppo`, on CartPole-v1 (4 envs) and Breakout (8 envs), each a fresh process.

    python benchmarks/user_file_vs_builtin.py [--repeats 3] [--cartpole-steps 200000] [--breakout-steps 40000]

Side by side, alternating, medians of the repeats. SPS is the run's own `charts/SPS` at its end (CleanRL's: global steps
over wall seconds since the start of training, so the start of the process is left out alike for both). Target
(issue 34): the user's file ≥ 0.97x the built-in's SPS on each env.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fleetrl.monitor.tbread import read_scalars
from fleetrl.tools.new import template



def sps_of(command: list[str], run_dir: Path, cwd: Path) -> float:
    proc = subprocess.run([*command, "--run-dir", str(run_dir), "--no-progress", "--checkpoint-every", "1000000"], cwd=cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return read_scalars(run_dir, "charts/SPS")[-1][1]


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
            for repeat in range(opts.repeats):
                order = list(contenders) if repeat % 2 == 0 else list(reversed(contenders))  # alternate who goes first
                for name in order:
                    run_dir = folder / f"{env_id}-{len(sps[name])}-{name.split()[-1].strip('./')}"
                    sps[name].append(sps_of([*contenders[name], "--env-id", env_id, "--total-timesteps", str(total)], run_dir, folder))
                    print(f"{env_id} {name}: {sps[name][-1]:,.0f} SPS", file=sys.stderr, flush=True)
            builtin = statistics.median(sps["fleetrl train ppo"])
            for name, values in sps.items():
                rows.append((env_id, total, name, values, statistics.median(values) / builtin))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    print(f"\nA user's file against the built-in: PPO with each env family's defaults, {opts.repeats} repeats alternating, "
          f"medians; {cpu}, {os.cpu_count()} CPU cores\n")
    print("| env | steps | command | SPS (median) | SPS (each repeat) | vs built-in |")
    print("| --- | --- | --- | --- | --- | --- |")
    for env_id, total, name, values, ratio in rows:
        print(f"| {env_id} | {total:,} | `{name}` | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
