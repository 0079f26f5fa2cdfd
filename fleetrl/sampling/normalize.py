"""Running mean/std normalisation of observations and rewards, owned by the trainer (one set for all envs).

The statistics are merged from per-batch sums, so under torchrun the sums can be all-reduced and
every rank holds identical statistics. They are saved in checkpoints and frozen for evaluation.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

CLIP = 10.0
EPSILON = 1e-8

# all-reduces (sums) a float64 array across ranks; identity in a single process
AllReduce = Callable[[np.ndarray], np.ndarray]


class RunningMeanStd:
    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4  # as gymnasium's, so the first batch dominates

    def update(self, batch: np.ndarray, allreduce: AllReduce | None = None) -> None:
        batch = np.asarray(batch, np.float64).reshape(-1, *self.mean.shape)
        sums = np.concatenate([[len(batch)], batch.sum(0).ravel(), np.square(batch).sum(0).ravel()])
        if allreduce is not None:
            sums = allreduce(sums)
        size = self.mean.size
        count = sums[0]
        mean = sums[1 : 1 + size].reshape(self.mean.shape) / count
        var = np.maximum(sums[1 + size :].reshape(self.mean.shape) / count - np.square(mean), 0.0)
        delta = mean - self.mean
        total = self.count + count
        self.mean = self.mean + delta * count / total
        m2 = self.var * self.count + var * count + np.square(delta) * self.count * count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": torch.tensor(np.asarray(self.mean)), "var": torch.tensor(np.asarray(self.var)), "count": torch.tensor(float(self.count))}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.mean = state["mean"].numpy().astype(np.float64)
        self.var = state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class ObsNormalizer:
    """(obs - mean) / std, clipped to ±10, as CleanRL's NormalizeObservation + TransformObservation."""

    def __init__(self, shape: tuple[int, ...], allreduce: AllReduce | None = None):
        self.rms = RunningMeanStd(shape)
        self.allreduce = allreduce
        self.frozen = False  # evaluation uses the statistics without changing them

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if update and not self.frozen:
            self.rms.update(obs, self.allreduce)
        return self.normalize(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        normed = (obs - self.rms.mean) / np.sqrt(self.rms.var + EPSILON)
        return np.clip(normed, -CLIP, CLIP).astype(np.float32)


class RewardNormalizer:
    """Scales rewards by the std of the discounted return, clipped to ±10, as CleanRL's NormalizeReward.

    The discounted return restarts at every episode end, terminated or truncated.
    """

    def __init__(self, num_envs: int, gamma: float, allreduce: AllReduce | None = None):
        self.rms = RunningMeanStd(())
        self.gamma = gamma
        self.allreduce = allreduce
        self.returns = np.zeros(num_envs, np.float64)
        self.frozen = False

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + reward
        if not self.frozen:
            self.rms.update(self.returns, self.allreduce)
        self.returns[done] = 0.0
        return np.clip(reward / np.sqrt(self.rms.var + EPSILON), -CLIP, CLIP).astype(np.float32)
