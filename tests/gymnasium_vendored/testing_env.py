# Vendored from https://github.com/Farama-Foundation/Gymnasium, path tests/testing_env.py,
# at commit 95a790e199c1ea7befa2fca03ac9fc42001c908d ("Update to v1.4.0": the release commit of the installed gymnasium 1.4.0; the tag v1.4.0
# itself is not in the snapshot this was taken from). Unchanged, but for this header and GenericTestVectorEnv left out (make_vec builds its own vectors).
# Licence: MIT. Copyright (c) 2016 OpenAI, Copyright (c) 2022 Farama Foundation (the full text: LICENSE in this folder).
"""Provides a generic testing environment for use in tests with custom reset, step and render functions."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

import gymnasium as gym
from gymnasium import spaces
from gymnasium.core import ActType, ObsType
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.vector.vector_env import AutoresetMode


class DefaultTestSpace:
    """Sentinel class to indicate that the default space should be used."""


DEFAULT_SPACE = DefaultTestSpace()


def basic_reset_func(
    self,
    *,
    seed: int | None = None,
    options: dict | None = None,
) -> tuple[ObsType, dict]:
    """A basic reset function that will pass the environment check using random actions from the observation space."""
    super(GenericTestEnv, self).reset(seed=seed)
    self.observation_space.seed(self.np_random_seed)
    return self.observation_space.sample(), {"options": options}


def old_reset_func(self) -> ObsType:
    """An old reset function that will pass the environment check using random actions from the observation space."""
    super(GenericTestEnv, self).reset()
    return self.observation_space.sample()


def basic_step_func(self, action: ActType) -> tuple[ObsType, float, bool, bool, dict]:
    """A step function that follows the basic step api that will pass the environment check using random actions from the observation space."""
    return self.observation_space.sample(), 0, False, False, {}


def old_step_func(self, action: ActType) -> tuple[ObsType, float, bool, dict]:
    """A step function that follows the old step api that will pass the environment check using random actions from the observation space."""
    return self.observation_space.sample(), 0, False, {}


def basic_render_func(self):
    """Basic render fn that does nothing."""
    pass


class GenericTestEnv(gym.Env):
    """A generic testing environment for use in testing with modified environments are required."""

    def __init__(
        self,
        action_space: spaces.Space | DefaultTestSpace | None = DEFAULT_SPACE,
        observation_space: spaces.Space | DefaultTestSpace | None = DEFAULT_SPACE,
        reset_func: Callable = basic_reset_func,
        step_func: Callable = basic_step_func,
        render_func: Callable = basic_render_func,
        metadata: dict[str, Any] | None = None,
        render_mode: str | None = None,
        spec: EnvSpec | None = None,
    ):
        """Generic testing environment constructor.

        Args:
            action_space: The environment action space. Use DEFAULT_SPACE for default,
                None for no space (to test error cases), or a custom Space.
            observation_space: The environment observation space. Use DEFAULT_SPACE for default,
                None for no space (to test error cases), or a custom Space.
            reset_func: The environment reset function
            step_func: The environment step function
            render_func: The environment render function
            metadata: The environment metadata
            render_mode: The render mode of the environment
            spec: The environment spec
        """
        if action_space is DEFAULT_SPACE:
            self.action_space = spaces.Box(0, 1, (1,))
        elif action_space is not None:
            self.action_space = action_space
        # If action_space is None, don't set the attribute (for testing error cases)

        if observation_space is DEFAULT_SPACE:
            self.observation_space = spaces.Box(0, 1, (1,))
        elif observation_space is not None:
            self.observation_space = observation_space
        # If observation_space is None, don't set the attribute (for testing error cases)

        if reset_func is not None:
            self.reset = types.MethodType(reset_func, self)
        if step_func is not None:
            self.step = types.MethodType(step_func, self)
        if render_func is not None:
            self.render = types.MethodType(render_func, self)

        if metadata is None:
            self.metadata = {"render_modes": []}
        else:
            self.metadata = metadata

        self.render_mode = render_mode

        if spec is None:
            self.spec = EnvSpec(
                "TestingEnv-v0",
                "tests.testing_env:GenericTestEnv",
                max_episode_steps=100,
            )
        else:
            self.spec = spec

    def reset(
        self,
        *,
        seed: int | None = None,
        options: dict | None = None,
    ) -> ObsType | tuple[ObsType, dict]:
        """Resets the environment."""
        # If you need a default working reset function, use `basic_reset_fn` above
        raise NotImplementedError("TestingEnv reset_fn is not set.")

    def step(self, action: ActType) -> tuple[ObsType, float, bool, dict[str, Any]]:
        """Steps through the environment."""
        raise NotImplementedError("TestingEnv step_fn is not set.")

    def render(self):
        """Renders the environment."""
        raise NotImplementedError("testingEnv render_fn is not set.")


