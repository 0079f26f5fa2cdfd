"""Did a change slow training? The same `fleetrl train` command from an earlier commit and from this checkout, side by
side on this machine, alternating, with each iteration's phases.

    python benchmarks/ab_checkouts.py --before 'cb42f9c^'                       # PPO CartPole-v1, 41 iterations, 5 repeats
    python benchmarks/ab_checkouts.py --before v0.1 --repeats 3 -- ppo --env-id BreakoutNoFrameskip-v4 --total-timesteps 10240

The earlier commit is checked out into a temporary git worktree and run with this venv's packages (PYTHONPATH first,
with its benchmarks/ folder, so that the benchmark envs such as ``ppo_speed_envs:Sleep5ms-v0`` import).
The table gives medians over the repeats of the final cumulative `charts/SPS` (CleanRL's definition: steps over the
time since the start, so it includes the first iterations) and of each run's per-iteration medians of the phase
timer's `perf/*_time` scalars, the first two iterations left out (the steady state).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
from lag_phases import phase_medians  # noqa: E402  (the phase timer's steady-state medians, shared)

PHASES = ("env", "inference", "learn", "other")


def run(tree: str, command: list[str]) -> dict[str, float]:
    from fleetrl.monitor.tbread import read_scalars

    with tempfile.TemporaryDirectory() as run_dir:
        proc = subprocess.run([sys.executable, "-m", "fleetrl", "train", *command, "--run-dir", run_dir], cwd=tree,
                              env=dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.path.join(tree, 'benchmarks')}"), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"fleetrl train failed in {tree}:\n{proc.stderr[-2000:]}")
        row = {phase: seconds * 1e3 for phase, seconds in phase_medians(run_dir, PHASES).items()}
        row["SPS"] = read_scalars(run_dir, "charts/SPS")[-1].value
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("command", nargs="*", default=["ppo", "--env-id", "CartPole-v1", "--total-timesteps", str(41 * 512), "--no-cuda"],
                        help="what follows `fleetrl train` (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as parent:
        before = os.path.join(parent, "before")
        added = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", before, args.before], capture_output=True, text=True)
        if added.returncode != 0:
            raise SystemExit(f"--before {args.before!r}: git could not check it out ({added.stderr.strip()}); give a commit, "
                             "branch or tag of this repository, e.g. --before 'HEAD~5'.")
        try:
            trees = {f"before ({args.before})": before, "this checkout": ROOT}
            rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for repeat in range(args.repeats):
                for name, tree in trees.items():
                    rows[name].append(run(tree, args.command))
                    print(f"[{repeat + 1}/{args.repeats}] {name}: {rows[name][-1]['SPS']:,.0f} SPS", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before], capture_output=True)
    print(f"\n`fleetrl train {' '.join(args.command)}`, medians of {args.repeats}\n")
    print("| checkout | SPS (cumulative) | SPS (repeats) | " + " | ".join(f"{p} ms/iteration" for p in PHASES) + " | sum ms |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in PHASES) + " | --- |")
    for name, rs in rows.items():
        m = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        repeats = ", ".join(f"{r['SPS']:,.0f}" for r in rs)
        print(f"| {name} | {m['SPS']:,.0f} | {repeats} | "
              + " | ".join(f"{m[p]:.2f}" for p in PHASES) + f" | {sum(m[p] for p in PHASES):.2f} |")


if __name__ == "__main__":
    main()
