"""What DQN, SAC and TD3 share around their replay buffer: its size per rank, the memory check, whether
checkpoints hold it, and when learning starts (again, after a resume without it).

An off-policy iteration is ``STEPS_PER_ITERATION`` steps of every env; the algorithm logs once an iteration.
The steps of their loops that are not the algorithm are here too: random warm-up actions, stepping the envs into
the buffer, an optimiser step averaged over ranks, the soft target update.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.args import STEPS_PER_ITERATION
from fleetrl.envs.vector import episode_stats
from fleetrl.sampling.replay import ReplayBuffer, check_fits_in_memory

__all__ = ["STEPS_PER_ITERATION", "epsilon_greedy", "learning_starts", "make_replay", "num_iterations", "optimizer_step", "soft_update", "step_envs",
           "times_due", "uniform_actions"]


def num_iterations(args: Any) -> int:
    return args.total_timesteps // (args.num_envs * STEPS_PER_ITERATION)


def make_replay(run: Any, envs: Any, *, n_step: int = 1, gamma: float | None = None, alpha: float | None = None,
                beta: float = 0.4, priority_eps: float = 1e-6) -> ReplayBuffer:
    """This rank's replay shard (``--buffer-size`` over all ranks), checked against free memory before it is made.
    With ``--save-buffer`` checkpoints hold it; otherwise a resumed run refills it first, and says so.

    Rainbow's options (fleetrl/sampling/replay.py): ``n_step`` with ``gamma`` samples n-step transitions (their
    ``discounts`` are ``gamma ** k``); ``alpha`` makes it prioritised (each rank's shard has its own sum tree, and
    ``--save-buffer`` keeps the priorities): set ``rb.beta`` before sampling, read ``batch.weights`` and
    ``batch.indices``, and pass the new errors to ``rb.update_priorities(batch.indices, errors)``."""
    args, dist = run.args, run.dist
    capacity = args.buffer_size // dist.world_size
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    check_fits_in_memory(capacity, obs_space, action_space, num_envs=run.local_num_envs, processes=dist.local_world_size,
                         buffer_size=args.buffer_size, save_buffer=args.save_buffer, n_step=n_step,
                         prioritized=alpha is not None)  # every process on this machine holds a shard
    replay = ReplayBuffer(capacity, run.local_num_envs, obs_space, action_space, run.device, check_memory=False, n_step=n_step,
                          gamma=gamma, alpha=alpha, beta=beta, priority_eps=priority_eps)
    if args.save_buffer:
        run.register_shard(replay=replay)  # each rank's shard goes to a checkpoint file of its own
    if run.resumed is not None and not run.restores("replay") and dist.is_main:
        why = ("it was written without --save-buffer, or by a run of another number of processes" if args.save_buffer
               else "train with --save-buffer for that")
        print(f"fleetrl: the checkpoint holds no replay buffer for this run ({why}): the run refills it for "
              f"--learning-starts {args.learning_starts:,} steps before learning goes on.", file=sys.stderr, flush=True)
    return replay


def learning_starts(run: Any) -> int:
    """The global step after which updates happen: ``--learning-starts``, or that many steps after a resume that
    had to refill the buffer."""
    refill = run.resumed is not None and not run.restores("replay")
    return run.args.learning_starts + (run.global_step if refill else 0)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging: target <- tau * source + (1 - tau) * target, CleanRL's arithmetic in three for-each calls.

    CleanRL writes ``target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)``; the same elementwise
    products and sum over all parameters at once give its bits (``lerp_``, used before, rounds differently, so TD3's and
    DDPG's lockstep with CleanRL parted at the first soft update), and tau 1 copies exactly (DQN's target copy)."""
    targets = list(target.parameters())
    mixed = torch._foreach_mul(list(source.parameters()), tau)
    torch._foreach_add_(mixed, torch._foreach_mul(targets, 1 - tau))
    torch._foreach_copy_(targets, mixed)


def times_due(global_step: int, steps: int, every: int) -> int:
    """How many of the ``steps`` timesteps numbered from ``global_step`` on are multiples of ``every``: CleanRL's
    ``global_step % every == 0`` when one env steps at a time, and the same number of updates per env step with more."""
    return (global_step + steps - 1) // every - (global_step - 1) // every


def epsilon_greedy(q_values_of: Callable[[np.ndarray], np.ndarray], obs: np.ndarray, epsilon: float, num_actions: int) -> np.ndarray:
    """DQN's acting: each env explores with probability ``epsilon``, drawing one uniform pair per env from numpy's global
    RNG (one call: 0.6 us against 1.8 for randint + random, benchmarks/costs.py micro), else acts greedily; the network
    runs only if some env does not explore. At epsilon 0 (Rainbow: its noisy layers explore) it draws nothing."""
    if epsilon <= 0:
        return q_values_of(obs).argmax(axis=1)
    draws = np.random.random((2, len(obs)))
    explore, actions = draws[0] < epsilon, (draws[1] * num_actions).astype(np.int64)
    if not explore.all():
        actions = np.where(explore, actions, q_values_of(obs).argmax(axis=1))
    return actions


def uniform_actions(action_space: gym.spaces.Box | gym.spaces.Discrete, num_envs: int) -> np.ndarray:
    """Random exploration actions within the bounds (or one of a Discrete space's actions), from numpy's global RNG
    (seeded and checkpointed by the run; ``action_space.sample()`` has an RNG of its own that no one seeds)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return action_space.start + np.random.randint(action_space.n, size=num_envs)
    low, high = action_space.low, action_space.high
    return np.random.uniform(low, high, (num_envs, *low.shape)).astype(action_space.dtype)


def step_envs(envs, rb, obs: np.ndarray, actions: np.ndarray, global_step: int, episodes: list, timer) -> np.ndarray:
    """Step the envs (timed), store the transitions in the replay buffer ``rb`` (the true final observation at a time
    limit), append the episodes that ended to ``episodes`` as (global step, return, length); return the next obs."""
    with timer.env:
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
    rb.add(obs, next_obs, actions, rewards, terminations, truncations, infos)
    episodes += [(global_step, episode_return, length) for episode_return, length in episode_stats(infos)]
    return next_obs


def optimizer_step(optimizer: torch.optim.Optimizer, sync, loss: torch.Tensor) -> None:
    """Backward, the gradients averaged over ranks (``sync``: this optimiser's GradientSync), then the step."""
    optimizer.zero_grad()
    sync.backward(loss)
    sync.finish()
    optimizer.step()
