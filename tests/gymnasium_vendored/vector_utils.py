# Vendored from https://github.com/Farama-Foundation/Gymnasium, path tests/vector/test_autoreset_mode.py (count_reset, count_step, count_reset_obs, count_step_obs) and tests/vector/testing_utils.py (make_env),
# at commit 95a790e199c1ea7befa2fca03ac9fc42001c908d ("Update to v1.4.0": the release commit of the installed gymnasium 1.4.0; the tag v1.4.0
# itself is not in the snapshot this was taken from). Only those five functions, unchanged.
# Licence: MIT. Copyright (c) 2016 OpenAI, Copyright (c) 2022 Farama Foundation (the full text: LICENSE in this folder).
"""Step-counting env functions and the CartPole env maker of gymnasium's vector tests."""

from __future__ import annotations

import gymnasium as gym
from gymnasium_vendored.testing_env import GenericTestEnv


def count_reset(
    self: GenericTestEnv, seed: int | None = None, options: dict | None = None
):
    super(GenericTestEnv, self).reset(seed=seed)

    self.count = seed if seed is not None else 0
    return self.count, {}


def count_step(self: GenericTestEnv, action):
    self.count += 1

    return self.count, action, self.count == self.max_count, False, {}


def count_reset_obs(
    self: GenericTestEnv, seed: int | None = None, options: dict | None = None
):
    super(GenericTestEnv, self).reset(seed=seed)

    self.count = seed if seed is not None else 0
    return self.observation_space.sample(), {}


def count_step_obs(self: GenericTestEnv, action):
    self.count += 1

    return (
        self.observation_space.sample(),
        action,
        self.count == self.max_count,
        False,
        {},
    )


def make_env(env_name, seed, **kwargs):
    """Creates an environment."""

    def _make():
        env = gym.make(env_name, disable_env_checker=True, **kwargs)
        env.action_space.seed(seed)
        env.reset(seed=seed)
        return env

    return _make
