"""PPO training speed on CartPole-v1 with CleanRL's defaults (4 envs x 128 steps), fleetrl vs a plain loop.

    python benchmarks/ppo_sps.py [--iterations 40] [--repeats 3]

Both count whole iterations (rollout + update) and leave out the first. The baseline is the
straightforward synchronous loop of CleanRL's ppo.py (gymnasium SyncVectorEnv, a Categorical built
each step, preallocated torch tensors; benchmarks/plain_ppo.py), run in the same process, alternating
with fleetrl. benchmarks/ppo_speed.py measures the same in separate processes, with CPU cost and Atari.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared plain loop beside this script
from plain_ppo import CARTPOLE, plain_ppo as _plain_ppo  # noqa: E402

NUM_ENVS, NUM_STEPS = CARTPOLE.num_envs, CARTPOLE.num_steps


def plain_ppo(iterations: int, seed: int = 1) -> list[float]:
    """CleanRL's ppo.py loop, written the straightforward way (benchmarks/plain_ppo.py); each iteration's seconds."""
    return _plain_ppo(CARTPOLE, iterations, seed)


def fleetrl_ppo(iterations: int, backend: str = "sync") -> list[float]:
    from fleetrl.algos.ppo import Args, train

    with tempfile.TemporaryDirectory() as tmp:
        args = Args(total_timesteps=iterations * NUM_ENVS * NUM_STEPS, run_dir=os.path.join(tmp, "run"), progress=False,
                    checkpoint_every=10**9, env_backend=backend, cuda=False)
        return train(args).iteration_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    contenders = {"plain synchronous loop (CleanRL ppo.py style)": plain_ppo, "fleetrl train ppo (sync backend)": fleetrl_ppo}
    sps: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(opts.repeats):
        for name, run in contenders.items():
            seconds = run(opts.iterations)[1:]  # leave out the first iteration (warm-up)
            sps[name].append(NUM_ENVS * NUM_STEPS * len(seconds) / sum(seconds))
    baseline = statistics.median(sps[next(iter(contenders))])
    print(f"\nPPO CartPole-v1, {NUM_ENVS} envs x {NUM_STEPS} steps, {opts.iterations - 1} timed iterations, "
          f"median of {opts.repeats}, {os.cpu_count()} CPU cores, torch {torch.__version__}\n")
    print("| contender | SPS (median) | SPS (all repeats) | vs plain |")
    print("| --- | --- | --- | --- |")
    for name, values in sps.items():
        med = statistics.median(values)
        print(f"| {name} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {med / baseline:.2f}x |")


if __name__ == "__main__":
    main()
