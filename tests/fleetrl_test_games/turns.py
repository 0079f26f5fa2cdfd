"""An AEC game whose agents take turns and that says it cannot run in parallel: fleetrl must refuse it clearly."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv


class Turns(AECEnv):
    metadata = {"name": "turns", "is_parallelizable": False, "render_modes": []}

    def __init__(self):
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)


def env(**kwargs):
    return Turns()
