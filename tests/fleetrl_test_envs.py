"""Small real gymnasium envs used by the tests, registered on import (`fleetrl_test_envs:NanReward-v0`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class NanRewardEnv(gym.Env):
    """CartPole-like observations; after `nan_after` steps in total it returns a NaN reward."""

    def __init__(self, nan_after: int = 1500):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.nan_after = nan_after
        self.total_steps = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        self.total_steps += 1
        self.t += 1
        reward = float("nan") if self.total_steps > self.nan_after else 1.0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), reward, self.t >= 20, False, {}


gym.register("NanReward-v0", entry_point=NanRewardEnv)


class CountingEnv(gym.Env):
    """obs = [step in episode, episode start value]; reward = step; terminates when the action is 1
    after step 3, else truncates (a time limit) at step 7. Lets tests check every field exactly."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.start = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.start = float(self.np_random.integers(0, 1000))
        return np.array([0, self.start], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = bool(action == 1 and self.t > 3)
        truncated = not terminated and self.t >= 7
        return np.array([self.t, self.start], np.float32), float(self.t), terminated, truncated, {}


gym.register("Counting-v0", entry_point=CountingEnv)


class BusyEnv(gym.Env):
    """A pure-Python env whose step is a ~300 us busy loop (not a sleep): expensive enough for workers."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        import time

        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 50, {}


gym.register("Busy-v0", entry_point=BusyEnv)
