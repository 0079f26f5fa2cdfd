"""Single-env wrappers shared by every family: episode statistics that survive training-only changes, and the
check that stops a run with a clear message when an env returns what the learner cannot use."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.errors import EnvOutputError


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


class CheckOutputs(gym.Wrapper):
    """Stops the run with an :class:`fleetrl.errors.EnvOutputError` when the env returns an observation of
    another shape than its observation space says, or a NaN or inf observation or reward.

    One NaN would poison the network (a NaN loss many updates later, far from its cause), so the error
    names the env id, its index in the vector (set by the vector, :func:`set_env_index`) and the step.
    With EpisodeStats it adds about 1.5 µs to a step (CartPole: 10.1 µs against 8.6 for gymnasium's plain env;
    benchmarks/costs.py micro): a shape compare, one dot product of a float
    observation with itself (non-finite when a value is; integer and bool observations cannot be NaN) and
    one scalar test of the reward. Only when a test fails does it look closer, to say what is wrong.
    """

    def __init__(self, env: gym.Env, env_id: str, env_index: int | None = None):
        super().__init__(env)
        self.env_id, self.env_index = env_id, env_index
        self._shape = env.observation_space.shape
        self._vector = len(self._shape) == 1
        self.steps = 0  # since the env was made
        self.episode = 0  # episodes begun (resets)
        self.episode_step = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.episode += 1
        self.episode_step = 0
        return self._inspect(obs, 0.0, "reset"), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.episode_step += 1
        # obs . obs is NaN or inf when a value is (or, rarely, when it overflows: then _inspect looks closer); for
        # CartPole's 4 floats it is a third of a sum (python -m timeit -s "import numpy as np; o=np.random.rand(4)
        # .astype(np.float32)" "o.dot(o)", then "o.sum()": 0.29 against 0.98 us on the AMD EPYC of 2026-12-05)
        if (type(obs) is not np.ndarray or obs.shape != self._shape or not math.isfinite(reward)
                or (obs.dtype.kind == "f" and not math.isfinite(obs.dot(obs) if self._vector else np.add.reduce(obs, None)))):
            obs = self._inspect(obs, reward, "step")
        return obs, reward, terminated, truncated, info

    def _inspect(self, obs, reward, phase: str) -> np.ndarray:
        """Raise the error that says what is wrong; else (a sum that overflowed, a list) the observation as an array."""
        obs = np.asarray(obs)
        if obs.shape != self._shape:
            self._fail(f"an observation of shape {obs.shape}", phase,
                       f", but its observation space {self.observation_space} says {self._shape}")
        if not np.isfinite(np.asarray(reward, np.float64)).all():
            self._fail(f"a non-finite reward ({reward})", phase)
        if obs.dtype.kind in "fc" and not np.isfinite(obs).all():
            first = tuple(int(i) for i in np.argwhere(~np.isfinite(obs))[0])
            self._fail(f"a non-finite observation ({int(np.isnan(obs).sum())} NaN and "
                       f"{int(np.isinf(obs).sum())} inf of its {obs.size} values; the first, {obs[first]}, "
                       f"at index {list(first)})", phase)
        return obs

    def _fail(self, what: str, phase: str, why: str = ""):
        index = f" (env {self.env_index} of the vector)" if self.env_index is not None else ""
        when = (f"at reset (the start of its episode {self.episode})" if phase == "reset" else
                f"at step {self.episode_step} of its episode {self.episode} (its step {self.steps} since it was made)")
        raise EnvOutputError(
            f"Env {self.env_id!r}{index} returned {what} {when}{why}. fleetrl stops here, since one NaN or inf, or a wrong shape, "
            f"would break the network; the fix is in the env (its step/reset code or its observation space).",
            env_index=self.env_index,
        )


def set_env_index(env: gym.Env, index: int) -> None:
    """Tell ``env``'s :class:`CheckOutputs` (if it has one) its index in the vector, for its error messages."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, CheckOutputs):
            env.env_index = index
            return
        env = env.env


def game_over(terminated: Any, truncated: Any) -> bool:
    """Whether an env's episode ended: a flag each, or for a multi-agent game (fleetrl/envs/multiagent.py) a flag per
    agent, every agent's set once the game is over."""
    if type(terminated) is bool or type(terminated) is np.bool_:
        return bool(terminated or truncated)
    return bool(np.all(np.logical_or(terminated, truncated)))
