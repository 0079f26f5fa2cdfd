"""The rollout buffer (filled by the sampler, read by the learner) and GAE with truncation bootstrapping."""

from __future__ import annotations

import numpy as np
import torch


class RolloutBuffer:
    """Preallocated ``(num_steps, num_envs, ...)`` numpy storage for one rollout.

    Writes during acting are plain numpy stores (cheap per step); :meth:`flat` hands the learner
    torch views of the whole batch without copying. A sampler that overlaps with learning fills a
    second buffer while the learner reads this one.
    """

    def __init__(self, num_steps: int, num_envs: int, obs_shape, obs_dtype, action_shape, action_dtype):
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

    def compute_advantages(self, last_values: np.ndarray, gamma: float, gae_lambda: float) -> None:
        self.advantages[:] = compute_gae(
            self.rewards, self.values, self.terminated, self.dones, self.final_values, last_values, gamma, gae_lambda
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
) -> np.ndarray:
    """Generalised advantage estimation over a ``(T, N)`` rollout, computed backwards.

    The value after step t is: 0 if the episode terminated there; the value of the final
    observation if it was truncated there (a time limit is not the end of the task, so we
    bootstrap through it, unlike CleanRL); otherwise the value of the next step's observation.
    The advantage trace stops at every episode end, terminated or truncated.
    """
    num_steps = rewards.shape[0]
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)
    next_values = np.where(dones, final_values, next_values) * (1.0 - terminated)
    deltas = rewards + gamma * next_values - values
    carry = (1.0 - dones) * (gamma * gae_lambda)
    advantages = np.zeros_like(values)
    last = np.zeros_like(values[0])
    for t in reversed(range(num_steps)):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages
