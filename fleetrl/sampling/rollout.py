"""The rollout buffer: filled by the sampler and the algorithm's rollout loop, read by the learner."""

from __future__ import annotations

from collections.abc import Callable

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
                 total_envs: int | None = None, state_shape: tuple[int, ...] | None = None):
        shape = (num_steps, num_envs)
        self.num_steps, self.num_envs = num_steps, num_envs
        self.obs = np.zeros(shape + tuple(obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(shape + tuple(action_shape), dtype=action_dtype)
        self.logprobs = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminated = np.zeros(shape, dtype=bool)
        self.dones = np.zeros(shape, dtype=bool)  # terminated or truncated: the episode stops here
        # False where the row's agent had left its game (PettingZoo, fleetrl/envs/multiagent.py): no transition there
        self.live = np.ones(shape, dtype=bool)
        # value of the final observation where an episode was truncated (0 elsewhere): the bootstrap
        self.final_values = np.zeros(shape, dtype=np.float32)
        self.advantages = np.zeros(shape, dtype=np.float32)
        self.returns = np.zeros(shape, dtype=np.float32)
        # rows that are arrival batches rather than time steps: which env each transition belongs to
        self.env_ids = None if total_envs is None else np.zeros(shape, dtype=np.int64)
        self.last_values = np.zeros(num_envs if total_envs is None else total_envs, dtype=np.float32)
        if state_shape is not None:  # a recurrent policy: each transition's state before the step, and episode starts
            self.states = np.zeros(shape + tuple(state_shape), dtype=np.float32)
            self.starts = np.zeros(shape, dtype=bool)
        # kept where the sampler is asked to (keep_next_obs): what next_obs() reads besides the rows
        self.last_obs: np.ndarray | None = None  # per env: the observation after its last transition
        self.final_obs: list[tuple[int, np.ndarray, np.ndarray]] = []  # (row, env ids, last observations) where episodes ended
        self.episodes: list[tuple[int, float, int]] = []
        self.global_step = 0
        self.policy_version = 0
        self.acting_version = 0.0  # the version that acted, averaged over the transitions (first-ready mixes two)
        self.actor_state: dict = {}  # the sampling RNG after this rollout (what a checkpoint saves)
        self.norm_sums: list = []  # --policy-lag 1: this rollout's normalisation sums, merged by the learner

    def next_obs(self, pick: Callable[[np.ndarray], np.ndarray] = lambda obs: obs) -> np.ndarray:
        """Each transition's next observation, ``(num_steps, num_envs, ...)``, through ``pick`` (a part of each, say the
        newest frame, to save memory): the next row's observation, the one after the last row for the last, and the
        episode's last observation where an episode ended (the next row starts the following one). Rows must be steps
        (not first-ready batches), and the sampler made with ``keep_next_obs``."""
        if self.last_obs is None or self.env_ids is not None:
            raise ValueError("next_obs needs a rollout of steps sampled with keep_next_obs=True.")
        following = np.concatenate([pick(self.obs[1:]), pick(self.last_obs)[None]])
        for row, env_ids, final_obs in self.final_obs:
            following[row, env_ids] = pick(final_obs)
        return following

    def flat(self) -> dict[str, torch.Tensor]:
        """The batch as torch tensors of shape ``(num_steps * num_envs, ...)``, row by row (step by step), sharing memory."""
        n = self.num_steps * self.num_envs
        fields = ("obs", "actions", "logprobs", "values", "advantages", "returns") + (("states", "starts") if hasattr(self, "states") else ())
        return {k: torch.from_numpy(getattr(self, k).reshape(n, *getattr(self, k).shape[2:])) for k in fields}
