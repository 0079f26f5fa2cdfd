"""Small gymnasium envs for the vector-backend tests, registered at import (``envs_for_tests:ShmCounting-v0``).

Workers import this module by name, so it must stay importable from the tests folder (conftest.py
puts that folder on sys.path, and the backends pass sys.path on to their workers).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.wrappers import EpisodeStats

COUNTING_LENGTH = 5  # steps before a Counting episode is truncated
GATE_TIMEOUT_S = 60  # a gated step that is never let through fails rather than hang its worker


class CountingEnv(gym.Env):
    """Obs ``[seed, episode, t, noise]``: the reset seed, the episode number since that seed, the step
    count, and a number drawn from the env's RNG at reset (equal for equal seeds only).

    Action 1 terminates the episode; otherwise it is truncated after ``length`` steps. The reward of
    step ``t`` (1-based) is ``t``, so an episode of length L returns L(L+1)/2.
    Optional faults for the tests: ``raise_on_step`` (raise on that step of the first episode),
    ``raise_on_reset`` (raise in every reset), ``step_us`` (a busy loop per step, not a sleep), ``gate`` (a file
    path: each step waits until that file exists, so a test holds the env in a step for as long as it needs; a held
    step creates ``<gate>.held`` first).
    """

    def __init__(self, length: int = COUNTING_LENGTH, raise_on_step: int | None = None,
                 raise_on_reset: bool = False, step_us: float = 0.0, gate: str | None = None):
        self.observation_space = gym.spaces.Box(0, np.iinfo(np.int64).max, shape=(4,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.raise_on_step = raise_on_step
        self.raise_on_reset = raise_on_reset
        self.step_us = step_us
        self.gate = gate
        self._seed, self._episode, self._t, self._noise, self._total_steps = 0, 0, 0, 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self._seed, self._episode, self._t, self._noise], dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self.raise_on_reset:
            raise RuntimeError("CountingEnv was told to fail in reset")
        if seed is not None:
            self._seed, self._episode = seed, 0
        else:
            self._episode += 1
        self._t = 0
        self._noise = int(self.np_random.integers(0, 1_000_000))
        return self._obs(), {}

    def step(self, action):
        deadline = time.monotonic() + GATE_TIMEOUT_S
        if self.gate is not None and not os.path.exists(self.gate):
            open(f"{self.gate}.held", "a").close()  # tells the test a step is being held
        while self.gate is not None and not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise RuntimeError(f"CountingEnv waited {GATE_TIMEOUT_S} s for its gate {self.gate}")
            time.sleep(0.002)
        if self.step_us:
            end = time.perf_counter() + self.step_us * 1e-6
            while time.perf_counter() < end:  # burn CPU like a real simulator would
                pass
        self._t += 1
        self._total_steps += 1
        if self.raise_on_step is not None and self._total_steps == self.raise_on_step:
            raise RuntimeError(f"CountingEnv was told to fail on step {self.raise_on_step}")
        terminated = int(action) == 1
        truncated = not terminated and self._t >= self.length
        return self._obs(), float(self._t), terminated, truncated, {}


class ImageEnv(gym.Env):
    """Atari-shaped uint8 observations ``(4, 84, 84)``, every pixel equal to the step count (mod 256)."""

    def __init__(self, length: int = 7):
        self.observation_space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.length = length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(self.observation_space.shape, np.uint8), {}

    def step(self, action):
        self._t += 1
        obs = np.full(self.observation_space.shape, self._t % 256, dtype=np.uint8)
        return obs, 1.0, False, self._t >= self.length, {}


# Ids carry a "Shm" prefix: fleetrl_test_envs registers its own "Counting-v0", and both modules load
# into one pytest process, where a second registration of an id would replace the first.
gym.register("ShmCounting-v0", entry_point=CountingEnv)
gym.register("ShmImage-v0", entry_point=ImageEnv)


@dataclass(frozen=True)
class MakeEnv:
    """A picklable env function with constructor arguments (EnvFactory takes none): the env in EpisodeStats."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> gym.Env:
        return EpisodeStats(gym.make(self.env_id, **self.kwargs))
