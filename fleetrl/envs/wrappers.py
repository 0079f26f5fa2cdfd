"""Single-env wrappers shared by every family: episode statistics that survive training-only changes."""

from __future__ import annotations

import gymnasium as gym


class EpisodeStats(gym.Wrapper):
    """Reports the true return and length of an episode in ``info["episode"]`` when it ends.

    It sits innermost, right above the raw game, so the statistics see the real reward (before
    any clipping or normalisation) and the real end of the episode (for Atari: game over, not a
    lost life).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._return = 0.0
        self._length = 0

    def reset(self, **kwargs):
        self._return, self._length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            info = dict(info)
            info["episode"] = {"r": self._return, "l": self._length}
        return obs, reward, terminated, truncated, info
