"""Agent ``quitter`` leaves the game (terminated) after its 3rd step while ``stayer`` plays on to step 8, where the
game ends by its time limit. Every step pays each agent playing 1, and the observation counts the game's steps. A game
depends on nothing but its step, so a run resumed at a game's start sees what an uninterrupted one does.
``LEAVE_EARLY_STEP_S`` (an environment variable): seconds each step sleeps (so that a SIGTERM lands mid-run)."""

from __future__ import annotations

import os
import time

import numpy as np

from fleetrl_test_games._base import TestGame

QUITS_AFTER, LENGTH = 3, 8


class LeaveEarly(TestGame):
    def __init__(self):
        super().__init__(("stayer", "quitter"))

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(self.agents), {a: {} for a in self.agents}

    def _observe(self, agents):
        return {a: np.array([self.t / LENGTH, k, 1.0, 0.0, 0.0], np.float32) for k, a in enumerate(self.possible_agents) if a in agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)} while {self.agents} play"
        time.sleep(float(os.environ.get("LEAVE_EARLY_STEP_S", "0")))
        self.t += 1
        playing = list(self.agents)
        obs = self._observe(playing)
        rewards = {a: 1.0 for a in playing}
        terminations = {a: a == "quitter" and self.t == QUITS_AFTER for a in playing}
        truncations = {a: self.t >= LENGTH for a in playing}
        self.agents = [a for a in playing if not (terminations[a] or truncations[a])]
        return obs, rewards, terminations, truncations, {a: {} for a in playing}


def parallel_env(**kwargs):
    return LeaveEarly()
