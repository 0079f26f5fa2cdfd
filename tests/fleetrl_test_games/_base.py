"""A minimal PettingZoo ParallelEnv base for the test games (PettingZoo's own API, no wrappers)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class TestGame(ParallelEnv):
    metadata = {"name": "fleetrl_test_game", "render_modes": []}
    observation_width = 5
    actions = 3

    def __init__(self, agents=("player_0", "player_1")):
        self.possible_agents = list(agents)
        self.agents: list[str] = []
        self._rng = np.random.default_rng()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (self.observation_width,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return gym.spaces.Discrete(self.actions)

    def seed_rng(self, seed):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
