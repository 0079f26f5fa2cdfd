"""Atari preprocessing on gymnasium + ale-py, in-process: the standard DQN/PPO chain.

Order (as in CleanRL's ppo_atari.py): noop reset -> skip 4 with max-pool -> episode statistics
-> [episodic life] -> fire reset -> (fire after a lost life) -> [reward clipping] -> 84x84 grayscale
-> stack 4. The bracketed ones are for training only; the parenthesised one for evaluation only, where
it takes the steps training's reset takes after a lost life, so a game that waits for FIRE goes on as
it did in training. Statistics sit below them, so the reported return is the unclipped full-game score
and the length counts agent steps.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np

from fleetrl.envs.wrappers import EpisodeStats
from fleetrl.errors import require

FRAME_SKIP = 4
NOOP_MAX = 30
SCREEN_SIZE = 84
FRAME_STACK = 4
MAX_FRAMES_PER_EPISODE = 108_000  # 30 minutes of play, the cap on every backend
LIFE_LOSS_STEPS = (0, 1, 2)  # what training's reset takes after a lost life: NOOP (EpisodicLife), FIRE and 2 (FireReset)


def is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or bool(re.fullmatch(r"[A-Za-z]+NoFrameskip-v4", env_id))


def default_sticky_actions(env_id: str) -> float:
    """0 for the `NoFrameskip-v4` ids, 0.25 for `ALE/...-v5` as ALE defines it."""
    return 0.25 if env_id.startswith("ALE/") and env_id.endswith("-v5") else 0.0


def register_ale() -> None:
    ale_py = require("ale_py", "atari", "Atari environments")
    gym.register_envs(ale_py)


class NoopReset(gym.Wrapper):
    """Start each game after a random number (1..noop_max) of no-ops, so starts differ."""

    def __init__(self, env: gym.Env, noop_max: int = NOOP_MAX):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.unwrapped.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat the action for `skip` frames, sum the rewards, and max-pool the last two frames."""

    def __init__(self, env: gym.Env, skip: int = FRAME_SKIP):
        super().__init__(env)
        self.skip = skip
        self._frames = np.zeros((2, *env.observation_space.shape), dtype=np.uint8)

    def step(self, action):
        total_reward, terminated, truncated, info = 0.0, False, False, {}
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i >= self.skip - 2:
                self._frames[i - (self.skip - 2)] = obs
            total_reward += float(reward)
            if terminated or truncated:
                break
        if i < self.skip - 1:  # the episode ended early: the pool was not filled, use the last frame
            return obs, total_reward, terminated, truncated, info
        return self._frames.max(axis=0), total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Training only: a lost life ends the episode for the learner; the game goes on underneath."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self._game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # only a life was lost: continue the same game with a no-op
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self._lives = self.unwrapped.ale.lives()
        self._game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after a reset, for games that wait for it to start."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class FireAfterLifeLoss(gym.Wrapper):
    """Evaluation only: after a lost life, take the hidden steps training's reset takes then (episodic life's
    NOOP, fire reset's FIRE and action 2), so a policy that never chooses FIRE plays on as in training
    instead of idling to the frame cap. Their rewards count, as they do in training's statistics."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._lives = self.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            for hidden in LIFE_LOSS_STEPS:
                if terminated or truncated:
                    break
                obs, hidden_reward, terminated, truncated, info = self.env.step(hidden)
                reward += hidden_reward
        self._lives = self.unwrapped.ale.lives()
        return obs, reward, terminated, truncated, info


class ClipReward(gym.RewardWrapper):
    """Training only: the sign of the reward, so games with different scales share one learning rate."""

    def reward(self, reward):
        return float(np.sign(reward))


class Resize(gym.ObservationWrapper):
    """Downscale the grayscale screen to 84x84 with area interpolation."""

    def __init__(self, env: gym.Env, size: int = SCREEN_SIZE):
        super().__init__(env)
        self._cv2 = require("cv2", "atari", "Atari preprocessing")
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), dtype=np.uint8)

    def observation(self, obs):
        return self._cv2.resize(obs, (self.size, self.size), interpolation=self._cv2.INTER_AREA)


def make_atari(env_id: str, training: bool, sticky_actions: float | None = None, render_mode: str | None = None,
               frame_stack: int = FRAME_STACK) -> gym.Env:
    """One preprocessed Atari env: (frame_stack, 84, 84) uint8 observations."""
    register_ale()
    sticky = default_sticky_actions(env_id) if sticky_actions is None else sticky_actions
    env = gym.make(
        env_id,
        obs_type="grayscale",
        frameskip=1,
        repeat_action_probability=sticky,
        full_action_space=False,
        max_num_frames_per_episode=MAX_FRAMES_PER_EPISODE,
        render_mode=render_mode,
    )
    env = NoopReset(env)
    env = MaxAndSkip(env)
    env = EpisodeStats(env)
    if training:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
        if not training:
            env = FireAfterLifeLoss(env)
    if training:
        env = ClipReward(env)
    env = Resize(env)
    return gym.wrappers.FrameStackObservation(env, frame_stack)
