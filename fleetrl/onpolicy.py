"""What the PPO-shaped algorithms (ppo, ppo_lstm, ppg, ppo_rnd) share around their loop that is not the algorithm:
the --normalize statistics, the sampler that runs the rollout, the batch the update reads, and explained variance.

The batch and explained variance leave out the rows of PettingZoo agents that had left their game (``buffer.live``
False): those rows hold no transition (docs/multi-agent.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fleetrl import nets
from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer
from fleetrl.sampling.rollout import RolloutBuffer
from fleetrl.sampling.sampler import Sampler

__all__ = ["batch", "explained_variance", "normalizers", "sampler"]


def normalizers(run: Any, obs_shape: tuple[int, ...]) -> tuple[ObsNormalizer | None, RewardNormalizer | None]:
    """--normalize (MuJoCo's and Procgen's default): one set of observation and reward statistics for all envs of all
    ranks (their sums are all-reduced every step, or once an iteration with --policy-lag 1), checkpointed with the run;
    images: rewards only. ``(None, None)`` without --normalize."""
    args, dist = run.args, run.dist
    obs_norm = ObsNormalizer(obs_shape, dist.allreduce_sum_np) if args.normalize and len(obs_shape) == 1 else None
    reward_norm = RewardNormalizer(run.local_num_envs, args.gamma, dist.allreduce_sum_np) if args.normalize else None
    if args.normalize:
        run.register(reward_rms=reward_norm.rms, **({"obs_rms": obs_norm.rms} if obs_norm is not None else {}))
    return obs_norm, reward_norm


def sampler(run: Any, envs: Any, agent: nn.Module, log: Any, rollout: Callable, async_batch: int | None,
            obs_norm: ObsNormalizer | None, reward_norm: RewardNormalizer | None, keep_next_obs: bool = False) -> Sampler:
    """The rollout engine (fleetrl/sampling/sampler.py): acting weights, sampling RNG, buffers; serial, split,
    first-ready or one update behind. It runs ``rollout`` for ``--num-steps`` steps at each ``collect()``, is closed
    with the run (its thread, the envs), and its sampling noise is checkpointed per rank. ``keep_next_obs``: keep what
    ``buffer.next_obs()`` reads (PPO-RND's curiosity is of each step's next observation)."""
    args = run.args
    made = run.closing(Sampler(envs, agent, args.num_steps, rollout=rollout, device=run.device, seed=run.seed, env_seed=run.env_seed,
                               timer=log.timer, actor_device=args.actor_device, saved_actor_device=run.remembered("actor_device"),
                               policy_lag=args.policy_lag, async_batch=async_batch, obs_norm=obs_norm, reward_norm=reward_norm,
                               global_step=run.global_step, global_envs=args.num_envs, verbose=run.dist.is_main, keep_next_obs=keep_next_obs))
    run.remember(actor_device=made.acts_on)  # where auto acts, measured once (or as the resumed run did): a resume keeps it
    run.register_per_rank(actor=made)
    return made


def batch(buffer: RolloutBuffer, device: torch.device, extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The rollout as one flat batch on ``device`` (with ``extra`` fields of the same rows), less the rows whose agent
    had left its game."""
    flat = {k: v.to(device) for k, v in {**buffer.flat(), **(extra or {})}.items()}
    if buffer.live.all():
        return flat
    live = torch.from_numpy(buffer.live.reshape(-1)).to(device)
    return {k: v[live] for k, v in flat.items()}


def explained_variance(buffer: RolloutBuffer, dist: Any) -> float:
    """How much of the returns' variance the values explained, over all ranks' live rows."""
    live = buffer.live.ravel()
    return nets.explained_variance(buffer.values.ravel()[live], buffer.returns.ravel()[live], dist.allreduce_sum_np)

