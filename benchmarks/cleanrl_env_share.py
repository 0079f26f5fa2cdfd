"""How much of CleanRL's PPO loop is env stepping: the most any vector env can speed the script up (Amdahl's bound).

    python benchmarks/cleanrl_env_share.py [--script ppo_atari] [--env-id BreakoutNoFrameskip-v4] [--num-envs 8]
                                           [--steps 16384] [--cpus 0]

Runs CleanRL's script ported to gymnasium 1.x on its own SyncVectorEnv (benchmarks/cleanrl/patch.py's ``*_gym_sync``),
timing every ``envs.step`` and ``envs.reset`` call, and prints the share of the loop's wall time they take. A vector
env that stepped in no time at all would make the script at most ``1 / (1 - share)`` times faster: if that bound is
under a target, no backend can reach the target with this script on this machine.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def measure(script: Path, argv: list[str]) -> None:
    """In this process: run ``script`` with ``argv``, timing SyncVectorEnv's step and reset; print the shares."""
    import gymnasium as gym

    spent = {"step": 0.0, "reset": 0.0}
    for name in spent:
        original = getattr(gym.vector.SyncVectorEnv, name)

        def timed(self, *args, _original=original, _name=name, **kwargs):
            began = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - began

        setattr(gym.vector.SyncVectorEnv, name, timed)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent))
    began = time.perf_counter()
    runpy.run_path(str(script), run_name="__main__")
    wall = time.perf_counter() - began
    share = (spent["step"] + spent["reset"]) / wall
    print(f"RESULT wall {wall:.1f} s, envs.step {spent['step']:.1f} s, envs.reset {spent['reset']:.2f} s, env share {share:.1%}, "
          f"bound {1 / (1 - share):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default="ppo_atari")
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16384)
    parser.add_argument("--cpus", default="0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inner", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    if opts.inner:
        measure(Path(opts.inner[0]), opts.inner[1:])
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(HERE / "cleanrl" / "patch.py"), tmp], check=True, capture_output=True)
        script = Path(tmp) / f"{opts.script}_gym_sync.py"
        argv = ["--env-id", opts.env_id, "--num-envs", str(opts.num_envs), "--total-timesteps", str(opts.steps), "--seed", "1"]
        results = []
        for _ in range(opts.repeats):
            proc = subprocess.run(["taskset", "-c", opts.cpus, sys.executable, __file__, "--inner", str(script), *argv], cwd=tmp,
                                  capture_output=True, text=True)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
            if line is None:
                raise SystemExit(proc.stdout[-2000:] + proc.stderr[-3000:])
            results.append(line.removeprefix("RESULT "))
    cores = len(opts.cpus.split(",")) if "-" not in opts.cpus else opts.cpus
    print(f"\nCleanRL's {opts.script}.py on gymnasium's SyncVectorEnv, {opts.env_id}, {opts.num_envs} envs, {opts.steps:,} steps, "
          f"taskset -c {opts.cpus} ({cores} core(s)), {os.cpu_count()} CPU cores on the machine\n")
    print("| repeat | measured |")
    print("| --- | --- |")
    for i, line in enumerate(results, 1):
        print(f"| {i} | {line} |")


if __name__ == "__main__":
    main()
