"""Where a PPO iteration's time goes on the slow-env-lag scenario, and so how much `--policy-lag 1` could ever win.

    python benchmarks/lag_phases.py                        # 200 us sleeping env, serial / split / lag 1, 3 repeats
    python benchmarks/lag_phases.py --env-id ppo_speed_envs:BusyWait200us-v0 --repeats 5

Each run is `fleetrl train ppo` on 8 envs x 128 steps, async backend, one torch thread (benchmarks/ppo_speed.py's
slow-env-lag shape), in its own process; the modes alternate within each repeat. The table gives the medians over the
timed iterations (the first two left out) of the phase timer's `perf/*_time` scalars: `env` (stepping), `inference`
(acting), `learn` (the update), `wait` (with --policy-lag 1: the learner waiting for the sampler thread's rollout) and
SPS. With perfect overlap an iteration of lag 1 takes max(rollout, update) instead of their sum, so the serial run's
(env + inference + learn) / (env + inference) is the most lag 1 can gain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]  # this checkout's fleetrl

MODES = {
    "serial (--async-batch 8)": ["--policy-lag", "0", "--async-batch", "8"],
    "split (the default)": ["--policy-lag", "0"],
    "--policy-lag 1": ["--policy-lag", "1"],
}
PHASES = ("env", "inference", "learn", "wait")


def phase_medians(run_dir: str, phases: tuple[str, ...], skip: int = 2) -> dict[str, float]:
    """Each phase's median seconds an iteration (the phase timer's ``perf/<phase>_time``), the first ``skip`` iterations
    left out: the steady state."""
    from fleetrl.monitor.tbread import read_scalars

    medians = {}
    for phase in phases:
        values = [s.value for s in read_scalars(run_dir, f"perf/{phase}_time")][skip:]
        medians[phase] = statistics.median(values) if values else 0.0
    return medians


def run(env_id: str, flags: list[str], iterations: int) -> dict[str, float]:
    from fleetrl.monitor.tbread import read_scalars

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as run_dir:
        proc = subprocess.run([sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", env_id, "--env-backend", "async",
                               "--num-envs", "8", "--num-steps", "128", "--total-timesteps", str(iterations * 1024), "--no-cuda",
                               *flags, "--run-dir", run_dir], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"fleetrl train failed ({' '.join(flags)}):\n{proc.stderr[-2000:]}")
        medians = phase_medians(run_dir, PHASES)
        values = [s.value for s in read_scalars(run_dir, "charts/SPS")][2:]
        medians["SPS"] = statistics.median(values) if values else 0.0
        return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="ppo_speed_envs:Sleep200us-v0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=17)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode, flags in MODES.items():
            runs[mode].append(run(args.env_id, flags, args.iterations))
            print(f"[{repeat + 1}/{args.repeats}] {mode}: {runs[mode][-1]['SPS']:,.0f} SPS", file=sys.stderr, flush=True)
    print(f"\n{args.env_id}, 8 envs x 128 steps, async backend; medians of {args.repeats} runs of the per-iteration medians\n")
    print("| mode | env ms | inference ms | learn ms | wait ms | SPS | vs serial |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    median = {mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for mode, rs in runs.items()}
    serial = median["serial (--async-batch 8)"]
    for mode, m in median.items():
        print(f"| {mode} | {m['env'] * 1e3:.1f} | {m['inference'] * 1e3:.1f} | {m['learn'] * 1e3:.1f} | {m['wait'] * 1e3:.1f} | "
              f"{m['SPS']:,.0f} | {m['SPS'] / serial['SPS']:.2f}x |")
    rollout = serial["env"] + serial["inference"]
    print(f"\nThe serial run's rollout takes {rollout * 1e3:.1f} ms and its update {serial['learn'] * 1e3:.1f} ms: perfect overlap "
          f"would make lag 1 at most {(rollout + serial['learn']) / max(rollout, serial['learn']):.2f}x the serial loop.")


if __name__ == "__main__":
    main()
