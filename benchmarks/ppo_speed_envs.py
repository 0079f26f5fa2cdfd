"""Slow pure-Python envs for benchmarks/ppo_speed.py, registered on import for fleetrl's custom-env form.

    python -m fleetrl train ppo --env-id ppo_speed_envs:BusyWait200us-v0 --env-backend async ...
    (with benchmarks/ on PYTHONPATH, which ppo_speed.py sets for its subprocesses)

- ``BusyWait200us-v0``: each step burns 200 us of CPU (a simulator written in Python).
- ``Sleep200us-v0``: each step sleeps 200 us (waiting on a remote simulator: no CPU used).
- ``Sleep5ms-v0``: each step sleeps 5 ms (a simulator or server that answers in a few milliseconds; issue 21's env).
- ``Straggler-v0``: busy-wait envs where one env of every 8 is 10x slower (2 ms). Which one is decided at its
  first seeded reset: fleetrl seeds env i with ``seed + i``, so exactly one of 8 consecutive envs has a seed
  divisible by 8, whatever the base seed, and in whichever worker process it was built.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

STEP_US = 200.0
SLOW_FACTOR = 10.0
EPISODE_LENGTH = 500  # episodes truncate here, so resets are part of every measurement
OBS_DIM = 8


class SlowEnv(gym.Env):
    """Vector observations, two actions; each step costs ``step_us`` by busy-waiting or by sleeping."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step_us: float = STEP_US, sleep: bool = False, slow_one_in: int | None = None):
        self.step_us, self.sleep, self.slow_one_in = step_us, sleep, slow_one_in
        self._t = 0
        self._obs = np.zeros(OBS_DIM, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None and self.slow_one_in and seed % self.slow_one_in == 0:
            self.step_us = STEP_US * SLOW_FACTOR
        self._t = 0
        self._obs = self.np_random.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
        return self._obs, {}

    def step(self, action):
        if self.sleep:
            time.sleep(self.step_us * 1e-6)
        else:
            end = time.perf_counter() + self.step_us * 1e-6
            while time.perf_counter() < end:
                pass
        self._t += 1
        # something learnable (act on the sign of the first feature), so the update is not degenerate
        reward = 1.0 if int(action) == int(self._obs[0] > 0) else 0.0
        self._obs = self.np_random.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
        return self._obs, reward, False, self._t >= EPISODE_LENGTH, {}


gym.register("BusyWait200us-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US})
gym.register("Sleep200us-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US, "sleep": True})
gym.register("Sleep5ms-v0", entry_point=SlowEnv, kwargs={"step_us": 5000.0, "sleep": True})
gym.register("Straggler-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US, "slow_one_in": 8})
