"""Partially observed classic-control envs, registered on import: RL Zoo's ``CartPoleNoVel-v1``, CartPole-v1 with its
two velocities hidden (cart position and pole angle only). A policy without memory cannot tell which way the pole
moves; a recurrent one can (``fleetrl train ppo_lstm``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

VISIBLE = [0, 2]  # cart position, pole angle (the velocities are 1 and 3)


class CartPoleNoVelEnv(CartPoleEnv):
    """CartPole whose observation is ``[cart position, pole angle]``."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        high = self.observation_space.high[VISIBLE]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[VISIBLE], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[VISIBLE], reward, terminated, truncated, info


if "CartPoleNoVel-v1" not in gym.registry:
    gym.register("CartPoleNoVel-v1", entry_point=CartPoleNoVelEnv, max_episode_steps=500, reward_threshold=475.0)
