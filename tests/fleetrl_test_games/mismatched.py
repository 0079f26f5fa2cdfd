"""Two agents with different action counts: one shared network cannot act for both, so fleetrl refuses it."""

from __future__ import annotations

import gymnasium as gym

from fleetrl_test_games.coordinate import Coordinate


class Mismatched(Coordinate):
    def action_space(self, agent):
        return gym.spaces.Discrete(3 if agent == "player_0" else 4)


def parallel_env(**kwargs):
    return Mismatched()
