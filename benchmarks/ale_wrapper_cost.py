"""What fleetrl's `ale` backend costs on top of ale-py's raw C++ AtariVectorEnv.

    python benchmarks/ale_wrapper_cost.py [--env-id BreakoutNoFrameskip-v4] [--num-envs 8] [--seconds 3] [--repeats 3]

Both step the very same AtariVectorEnv (the one fleetrl's AleVectorEnv built, so every ALE setting is
identical) with random actions; the wrapper adds episodic life, FIRE after a lost life, reward
clipping and score tracking (training mode). The two alternate within each repeat, so load drifts
hit both; the table gives medians and every repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from fleetrl.envs.native import AleVectorEnv


def steps_per_second(step, num_envs: int, n_actions: int, seconds: float, rng: np.random.Generator) -> float:
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(rng.integers(0, n_actions, num_envs))
        steps += num_envs
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    envs = AleVectorEnv(args.env_id, args.num_envs, training=True)
    rng = np.random.default_rng(0)
    n_actions = int(envs.single_action_space.n)
    contenders = {"ale-py AtariVectorEnv, raw": envs._env.step, "fleetrl ale backend (training)": envs.step}
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    try:
        envs.reset(seed=0)
        for _ in range(args.repeats):
            for name, step in contenders.items():
                runs[name].append(steps_per_second(step, args.num_envs, n_actions, args.seconds, rng))
    finally:
        envs.close()
    raw = statistics.median(runs["ale-py AtariVectorEnv, raw"])
    print(f"\n{args.env_id} x {args.num_envs}, random actions, {os.cpu_count()} CPU cores, median of {args.repeats} repeats\n")
    print("| contender | env steps/s (median) | all runs | vs raw |")
    print("| --- | --- | --- | --- |")
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {median / raw:.2f}x |")


if __name__ == "__main__":
    main()
