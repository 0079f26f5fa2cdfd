"""Two agents whose observations differ in length (5 and 3): fleetrl pads the shorter with zeros."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fleetrl_test_games.coordinate import Coordinate


class Padded(Coordinate):
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (5 if agent == "player_0" else 3,), np.float32)

    def _observe(self):
        return {a: obs if a == "player_0" else obs[:3] for a, obs in super()._observe().items()}


def parallel_env(**kwargs):
    return Padded()
