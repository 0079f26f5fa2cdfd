"""The rollout buffer (filled by the sampler, read by the learner) and GAE with truncation bootstrapping."""

from __future__ import annotations

import numpy as np
import torch


class RolloutBuffer:
    """Preallocated ``(rows, columns, ...)`` numpy storage for one rollout.

    Usually row ``t`` is step ``t`` and column ``i`` is env ``i`` (``env_ids`` is None). With first-ready
    batches (``--async-batch K``) a row is one batch of ``K`` transitions, in the order they arrived, and
    ``env_ids[row, k]`` names the env of each; an env's own trajectory is its transitions in row order.

    Writes during acting are plain numpy stores (cheap per step); :meth:`flat` hands the learner
    torch views of the whole batch without copying. The sampler also leaves here what the learner and
    the logs need from the rollout: ``last_values`` (per env: the value of the observation after its
    last transition), the ``episodes`` that ended (global step, return, length), the ``global_step``
    reached and the ``policy_version`` that acted.
    """

    def __init__(self, num_steps: int, num_envs: int, obs_shape, obs_dtype, action_shape, action_dtype,
                 total_envs: int | None = None):
        shape = (num_steps, num_envs)
        self.num_steps, self.num_envs = num_steps, num_envs
        self.obs = np.zeros(shape + tuple(obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(shape + tuple(action_shape), dtype=action_dtype)
        self.logprobs = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminated = np.zeros(shape, dtype=bool)
        self.dones = np.zeros(shape, dtype=bool)  # terminated or truncated: the episode stops here
        # value of the final observation where an episode was truncated (0 elsewhere): the bootstrap
        self.final_values = np.zeros(shape, dtype=np.float32)
        self.advantages = np.zeros(shape, dtype=np.float32)
        self.returns = np.zeros(shape, dtype=np.float32)
        # rows that are arrival batches rather than time steps: which env each transition belongs to
        self.env_ids = None if total_envs is None else np.zeros(shape, dtype=np.int64)
        self.last_values = np.zeros(num_envs if total_envs is None else total_envs, dtype=np.float32)
        self.episodes: list[tuple[int, float, int]] = []
        self.global_step = 0
        self.policy_version = 0
        self.acting_version = 0.0  # the version that acted, averaged over the transitions (first-ready mixes two)
        self.actor_state: dict = {}  # the sampling RNG after this rollout (what a checkpoint saves)
        self.norm_sums: list = []  # --policy-lag 1: this rollout's normalisation sums, merged by the learner

    def compute_advantages(self, last_values: np.ndarray, gamma: float, gae_lambda: float) -> None:
        self.advantages[:] = compute_gae(
            self.rewards, self.values, self.terminated, self.dones, self.final_values, last_values, gamma, gae_lambda,
            self.env_ids,
        )
        self.returns[:] = self.advantages + self.values

    def flat(self) -> dict[str, torch.Tensor]:
        """The batch as torch tensors of shape ``(num_steps * num_envs, ...)``, sharing memory."""
        n = self.num_steps * self.num_envs
        fields = ("obs", "actions", "logprobs", "values", "advantages", "returns")
        return {k: torch.from_numpy(getattr(self, k).reshape(n, *getattr(self, k).shape[2:])) for k in fields}


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    dones: np.ndarray,
    final_values: np.ndarray,
    last_values: np.ndarray,
    gamma: float,
    gae_lambda: float,
    env_ids: np.ndarray | None = None,
) -> np.ndarray:
    """Generalised advantage estimation over a ``(T, N)`` rollout, computed backwards.

    The value after step t is: 0 if the episode terminated there; the value of the final
    observation if it was truncated there (a time limit is not the end of the task, so we
    bootstrap through it, unlike CleanRL); otherwise the value of the next step's observation.
    The advantage trace stops at every episode end, terminated or truncated.

    ``env_ids`` (rows of first-ready batches, see :class:`RolloutBuffer`): each env's transitions form
    its own trajectory in row order, and the last one bootstraps from ``last_values[env]``. The
    backward walk then carries the next value and the advantage trace per env instead of per column.
    """
    next_value = np.array(last_values, dtype=np.float64)  # per env: the value after its latest transition seen
    trace = np.zeros_like(next_value)  # per env: the advantage of its next transition
    advantages = np.zeros_like(values)
    for t in reversed(range(rewards.shape[0])):
        ids = slice(None) if env_ids is None else env_ids[t]
        after = np.where(dones[t], final_values[t], next_value[ids]) * (1.0 - terminated[t])
        delta = rewards[t] + gamma * after - values[t]
        trace[ids] = delta + (1.0 - dones[t]) * (gamma * gae_lambda) * trace[ids]
        advantages[t] = trace[ids]
        next_value[ids] = values[t]
    return advantages
