"""Two agents see the same cue (one of 3) and their own index; the team scores 1 when agent 0 plays the cue and agent 1
the next one. One shared network can only win by telling the agents apart: a random team scores 1/9 of the time, so
about 1.1 in a 10-step game, and a perfect one 10."""

from __future__ import annotations

import numpy as np

from fleetrl_test_games._base import TestGame

LENGTH = 10


class Coordinate(TestGame):
    def reset(self, seed=None, options=None):
        self.seed_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.cue = int(self._rng.integers(3))
        return self._observe(), {a: {} for a in self.agents}

    def _observe(self):
        out = {}
        for k, agent in enumerate(self.agents):
            obs = np.zeros(5, np.float32)
            obs[self.cue] = 1.0
            obs[3 + k] = 1.0
            out[agent] = obs
        return out

    def step(self, actions):
        win = actions["player_0"] == self.cue and actions["player_1"] == (self.cue + 1) % 3
        self.t += 1
        self.cue = int(self._rng.integers(3))
        over = self.t >= LENGTH
        obs = self._observe()
        rewards = {a: float(win) for a in self.agents}
        terminations = {a: False for a in self.agents}
        truncations = {a: over for a in self.agents}
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


def parallel_env(**kwargs):
    return Coordinate()
