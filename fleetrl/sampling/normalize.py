"""Running mean/std normalisation of observations and rewards, owned by the trainer (one set for all envs).

The statistics are merged from per-batch sums, so under torchrun the sums can be all-reduced and
every rank holds identical statistics. They are saved in checkpoints and frozen for evaluation.

Two ways to merge, chosen by the sampler:
* **every step** (the default, as CleanRL's wrappers): each batch updates the statistics (all-reduced
  under torchrun) before it is normalised;
* **once an iteration** (:meth:`defer`, used with ``--policy-lag 1``, where a sampler thread acts): a
  rollout is normalised with the statistics it started with, and only accumulates its sums; the trainer
  thread merges them (:meth:`merge`, the one collective) and hands the new statistics to the sampler
  with the new weights (:meth:`acting_stats` / :meth:`use_stats`). No collective runs on the sampler
  thread, and statistics and weights lag alike.

A PettingZoo game's rows (fleetrl/envs/multiagent.py) include blank ones, of agents that have left the game: zeros, not
observations or rewards of anything. The callers pass ``live`` (which rows are real), and only those rows count, so the
statistics are what they would be without the blank rows (they still get normalised, with the others, and are dropped
later by the learner).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

CLIP = 10.0
EPSILON = 1e-8

# all-reduces (sums) a float64 array across ranks; identity in a single process
AllReduce = Callable[[np.ndarray], np.ndarray]
Stats = tuple[np.ndarray, np.ndarray]  # (mean, var)


class RunningMeanStd:
    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4  # as gymnasium's, so the first batch dominates

    def batch_sums(self, batch: np.ndarray) -> np.ndarray:
        """``[count, sum..., sum of squares...]`` of a batch: what ranks and iterations add up."""
        batch = np.asarray(batch, np.float64).reshape(-1, *self.mean.shape)
        return np.concatenate([[len(batch)], batch.sum(0).ravel(), np.square(batch).sum(0).ravel()])

    def update(self, batch: np.ndarray, allreduce: AllReduce | None = None) -> None:
        sums = self.batch_sums(batch)
        self.merge_sums(allreduce(sums) if allreduce is not None else sums)

    def merge_sums(self, sums: np.ndarray) -> None:
        """Merge a batch given by its :meth:`batch_sums` (Chan et al.'s parallel update). The arrays are
        replaced, not written in place, so a reader holding the old ``(mean, var)`` keeps a consistent pair."""
        size = self.mean.size
        count = sums[0]
        if count == 0:
            return
        mean = sums[1 : 1 + size].reshape(self.mean.shape) / count
        var = np.maximum(sums[1 + size :].reshape(self.mean.shape) / count - np.square(mean), 0.0)
        delta = mean - self.mean
        total = self.count + count
        self.mean = self.mean + delta * count / total
        m2 = self.var * self.count + var * count + np.square(delta) * self.count * count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": torch.tensor(np.asarray(self.mean)), "var": torch.tensor(np.asarray(self.var)),
                "count": torch.tensor(float(self.count), dtype=torch.float64)}  # float64: a resumed run merges exactly as it would have

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.mean = state["mean"].numpy().astype(np.float64)
        self.var = state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class _RunningNormalizer:
    """The statistics and the two merge schedules shared by the observation and reward normalisers."""

    def __init__(self, shape: tuple[int, ...], allreduce: AllReduce | None):
        self.rms = RunningMeanStd(shape)
        self.allreduce = allreduce
        self.frozen = False  # evaluation uses the statistics without changing them
        self.deferred = False
        self._pending: np.ndarray | None = None
        self._acting: Stats | None = None

    def defer(self) -> None:
        """Merge once an iteration from now on: see the module docstring."""
        self.deferred = True
        self._pending = np.zeros_like(self.rms.batch_sums(np.zeros((0, *self.rms.mean.shape))))
        self._acting = self.acting_stats()

    def _observe(self, batch: np.ndarray, live: np.ndarray | None = None) -> None:
        if self.frozen:
            return
        if live is not None:  # blank rows of agents that have left a game; every rank still takes part in the all-reduce
            batch = batch[np.asarray(live, bool)]
        if self.deferred:
            self._pending += self.rms.batch_sums(batch)
        else:
            self.rms.update(batch, self.allreduce)

    def _stats(self) -> Stats:
        return self._acting if self.deferred else (self.rms.mean, self.rms.var)

    # ---- once an iteration (deferred) -------------------------------------------------------------
    def take_pending(self) -> np.ndarray:
        """Sampler thread, at a rollout's end: the sums it accumulated (and start the next rollout's)."""
        pending, self._pending = self._pending, np.zeros_like(self._pending)
        return pending

    def merge(self, sums: np.ndarray) -> None:
        """Trainer thread, once an iteration: merge one rollout's sums, all-reduced over ranks."""
        if not self.frozen:
            self.rms.merge_sums(self.allreduce(sums) if self.allreduce is not None else sums)

    def acting_stats(self) -> Stats:
        """The current statistics, to hand to the sampler with the weights."""
        return self.rms.mean, self.rms.var

    def use_stats(self, stats: Stats) -> None:
        """Sampler thread, between rollouts: normalise with these statistics from now on."""
        self._acting = stats


class ObsNormalizer(_RunningNormalizer):
    """(obs - mean) / std, clipped to ±10, as CleanRL's NormalizeObservation + TransformObservation."""

    def __init__(self, shape: tuple[int, ...], allreduce: AllReduce | None = None):
        super().__init__(shape, allreduce)

    def __call__(self, obs: np.ndarray, update: bool = True, live: np.ndarray | None = None) -> np.ndarray:
        """``obs`` normalised, after merging them into the statistics (with ``update``; ``live``: only those rows)."""
        if update:
            self._observe(obs, live)
        return self.normalize(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        mean, var = self._stats()
        normed = (obs - mean) / np.sqrt(var + EPSILON)
        return np.clip(normed, -CLIP, CLIP).astype(np.float32)


class RewardNormalizer(_RunningNormalizer):
    """Scales rewards by the std of the discounted return, clipped to ±10, as CleanRL's NormalizeReward.

    The discounted return restarts at every episode end, terminated or truncated.
    """

    def __init__(self, num_envs: int, gamma: float, allreduce: AllReduce | None = None):
        super().__init__((), allreduce)
        self.gamma = gamma
        self.returns = np.zeros(num_envs, np.float64)

    def __call__(self, reward: np.ndarray, done: np.ndarray, env_ids: np.ndarray | slice = slice(None),
                 live: np.ndarray | None = None) -> np.ndarray:
        """``reward``/``done`` of the envs ``env_ids`` (all by default), in that order; ``live``: the rows whose step was
        a transition (the others' returns are not merged into the statistics)."""
        returns = self.returns[env_ids] * self.gamma + reward
        self._observe(returns, live)
        returns[done] = 0.0
        self.returns[env_ids] = returns
        _, var = self._stats()
        return np.clip(reward / np.sqrt(var + EPSILON), -CLIP, CLIP).astype(np.float32)


class DiscountedSum:
    """Each env's discounted sum of a signal so far, never reset (RND's ``RewardForwardFilter``: its spread scales the
    intrinsic rewards). Checkpointable, per rank."""

    def __init__(self, gamma: float, num_envs: int):
        self.rewems = np.zeros(num_envs)
        self.gamma = gamma

    def update(self, rews: np.ndarray) -> np.ndarray:
        self.rewems = self.rewems * self.gamma + rews
        return self.rewems

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rewems": torch.from_numpy(self.rewems.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.rewems = state["rewems"].numpy().astype(np.float64)


def stats_from_random_actions(envs, rms: RunningMeanStd, rollouts: int, num_steps: int, pick: Callable[[np.ndarray], np.ndarray],
                              seed: int, env_seed: int | None, allreduce: AllReduce | None = None) -> np.ndarray:
    """Start ``rms`` as CleanRL's RND does: ``rollouts`` rollouts of ``num_steps`` uniformly random actions from reset
    envs, ``pick`` of each observation merged once a rollout (all ranks' sums, with ``allreduce``). Not counted as steps.
    Returns the envs' last observations (``Sampler.begin`` goes on from them)."""
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=env_seed)
    for _ in range(rollouts):
        batch = []
        for _ in range(num_steps):
            obs = envs.step(rng.integers(0, envs.single_action_space.n, size=envs.num_envs))[0]
            batch.append(pick(obs))
        rms.update(np.concatenate(batch), allreduce)
    return obs
