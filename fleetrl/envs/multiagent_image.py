"""Frames for the CNN from a PettingZoo game whose agents see images, without SuperSuit (whose vector wrappers no
longer fit current Gymnasium, docs/multi-agent.md).

PettingZoo's Atari games get the chain of CleanRL's ``ppo_pettingzoo_ma_atari.py``, in its order: the maximum of the
last 2 frames, each action repeated for 4 frames (rewards summed), the blue channel (SuperSuit's
``color_reduction_v0(env, "B")``), a bilinear resize to 84x84 (SuperSuit's, tinyscaler's filter), the last 4 frames stacked, then one indicator channel per
agent, full (255) in the channel of the agent that sees it. Reward clipping is left to the vector
(:class:`fleetrl.envs.multiagent.AgentRows`), which first counts the unclipped score. Other image games (Pistonball)
get greyscale, 84x84 and 4 frames. Frames are channels first, ``(C, 84, 84)`` uint8, as fleetrl's CNNs take them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.errors import require

SIZE = 84
FRAME_SKIP = 4
MAX_OVER = 2
GREY = np.array([0.299, 0.587, 0.114], np.float32)  # SuperSuit's color_reduction_v0 "full" weights


class ImagePreprocessing:
    """A PettingZoo parallel env (``possible_agents``, ``agents``, ``observation_space(agent)``, ``action_space(agent)``,
    ``reset``, ``step``) whose observations are the stacked 84x84 frames above."""

    def __init__(self, game: Any, frame_stack: int = 4, atari: bool = True):
        self._scale = require("tinyscaler", "multiagent", "Image preprocessing of PettingZoo games").scale
        self.game, self.frame_stack, self.atari = game, frame_stack, atari
        self.possible_agents = list(game.possible_agents)
        indicators = len(self.possible_agents) if atari else 0
        self._space = gym.spaces.Box(0, 255, (frame_stack + indicators, SIZE, SIZE), np.uint8)
        self._indicator = {a: k for k, a in enumerate(self.possible_agents)} if atari else {}
        self._stacks: dict[str, deque] = {}
        self._raw: dict[str, deque] = {}

    @property
    def agents(self) -> list[str]:
        return self.game.agents

    @property
    def metadata(self) -> dict:
        return getattr(self.game, "metadata", {})

    def observation_space(self, agent: str) -> gym.Space:
        return self._space

    def action_space(self, agent: str) -> gym.Space:
        return self.game.action_space(agent)

    def render(self):
        return self.game.render()

    def close(self) -> None:
        self.game.close()

    def reset(self, seed: int | None = None, options: dict | None = None):
        observations, infos = self.game.reset(seed=seed, options=options)
        blank = np.zeros((SIZE, SIZE), np.uint8)
        self._stacks = {a: deque([blank] * self.frame_stack, maxlen=self.frame_stack) for a in self.possible_agents}
        self._raw = {a: deque(maxlen=MAX_OVER) for a in self.possible_agents}
        return {a: self._observe(a, o) for a, o in observations.items()}, infos

    def step(self, actions: dict[str, Any]):
        if not self.atari:
            observations, rewards, terminations, truncations, infos = self.game.step(actions)
            return {a: self._observe(a, o) for a, o in observations.items()}, rewards, terminations, truncations, infos
        total = {a: 0.0 for a in self.game.agents}
        last_obs: dict[str, np.ndarray] = {}
        terminations: dict[str, bool] = {}
        truncations: dict[str, bool] = {}
        infos: dict[str, Any] = {}
        for _ in range(FRAME_SKIP):  # SuperSuit's frame_skip_v0: stop early only when every agent is done
            observations, rewards, term, trunc, info = self.game.step(actions)
            for agent, reward in rewards.items():
                total[agent] = total.get(agent, 0.0) + reward
                terminations[agent], truncations[agent], infos[agent] = term[agent], trunc[agent], info[agent]
            for agent, obs in observations.items():
                self._raw[agent].append(obs)  # max_observation_v0(2) sees every frame
                last_obs[agent] = obs
            if all(terminations.get(a, False) or truncations.get(a, False) for a in total):
                break
        return {a: self._observe(a, None) for a in last_obs}, total, terminations, truncations, infos

    def _observe(self, agent: str, obs: np.ndarray | None) -> np.ndarray:
        """The agent's stacked frames after its newest raw frame (``obs`` at reset; after a step, the frames of
        ``self._raw``, whose maximum is taken)."""
        if self.atari:
            raw = self._raw[agent]
            if obs is not None:
                raw.append(obs)
            frame = raw[-1] if len(raw) == 1 else np.maximum(raw[-2], raw[-1])
            frame = np.ascontiguousarray(frame[:, :, 2])  # the blue channel
        else:
            frame = (obs.astype(np.float32) @ GREY).astype(np.uint8)
        # SuperSuit's resize_v1: tinyscaler's bilinear filter (cv2's INTER_LINEAR differs in about 1 pixel in 20)
        frame = self._scale(frame[:, :, None], size=(SIZE, SIZE), mode="bilinear")[:, :, 0]
        stack = self._stacks[agent]
        stack.append(frame)
        out = np.empty(self._space.shape, np.uint8)
        out[: self.frame_stack] = np.stack(stack)
        if self.atari:
            out[self.frame_stack :] = 0
            out[self.frame_stack + self._indicator[agent]] = 255
        return out
