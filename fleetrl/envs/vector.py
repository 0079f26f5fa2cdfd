"""The vector interface every backend produces, and the in-process synchronous backend.

The interface (the one contract between environments and algorithms)
--------------------------------------------------------------------
A vector env steps ``num_envs`` copies of one environment:

    obs, info = envs.reset(seed=s)            # env i is seeded with s + i
    obs, reward, terminated, truncated, info = envs.step(actions)

* ``obs`` is an array ``(num_envs, *single_observation_space.shape)``; ``reward`` is float,
  ``terminated`` and ``truncated`` are bool arrays of length ``num_envs``. Terminated and truncated
  are kept apart: truncation is a time limit, and the learner bootstraps through it.
* **Same-step autoreset** (gymnasium 1.x ``AutoresetMode.SAME_STEP``): when env ``i`` finishes,
  ``obs[i]`` is already the first observation of its next episode, and
  ``info["final_obs"][i]`` holds the last observation of the finished one (valid where the mask
  ``info["_final_obs"]`` is true). ``reward[i]`` is the reward of the finishing transition.
* **Episode statistics**: when an episode really ends (for Atari: game over, not a lost life),
  ``info["episode"]["r"][i]`` is its undiscounted return (for Atari the unclipped game score) and
  ``info["episode"]["l"][i]`` its length in agent steps, with the mask ``info["_episode"]``.
* These info keys are present only on steps where at least one env finished.

docs/backends.md holds the same spec with the backend-by-backend details.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np


class SyncVectorEnv:
    """fleetrl's in-process backend: steps the envs in turn, with same-step autoreset.

    It does what gymnasium's ``SyncVectorEnv`` in SAME_STEP mode does (the tests check they agree
    step for step) at a third of its per-step overhead, which matters for cheap envs like CartPole.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self._obs_shape = (self.num_envs, *self.single_observation_space.shape)
        self._obs_dtype = self.single_observation_space.dtype

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs = np.empty(self._obs_shape, self._obs_dtype)
        for i, env in enumerate(self.envs):
            obs[i], _ = env.reset(seed=None if seed is None else seed + i)
        return obs, {}

    def step(self, actions: np.ndarray):
        n = self.num_envs
        obs = np.empty(self._obs_shape, self._obs_dtype)
        reward = np.empty(n, np.float64)
        terminated = np.empty(n, bool)
        truncated = np.empty(n, bool)
        info: dict[str, Any] = {}
        for i, env in enumerate(self.envs):
            ob, reward[i], terminated[i], truncated[i], env_info = env.step(actions[i])
            if terminated[i] or truncated[i]:
                if not info:
                    info = {"final_obs": np.zeros_like(obs), "_final_obs": np.zeros(n, bool)}
                info["final_obs"][i], info["_final_obs"][i] = ob, True
                if "episode" in env_info:
                    if "episode" not in info:
                        info["episode"] = {"r": np.zeros(n, np.float64), "l": np.zeros(n, np.int64)}
                        info["_episode"] = np.zeros(n, bool)
                    info["episode"]["r"][i] = env_info["episode"]["r"]
                    info["episode"]["l"][i] = env_info["episode"]["l"]
                    info["_episode"][i] = True
                ob, _ = env.reset()
            obs[i] = ob
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        for env in self.envs:
            env.close()


class GymSyncVectorEnv:
    """gymnasium's ``SyncVectorEnv`` in same-step autoreset mode, with its infos put in fleetrl's form.

    Each sub-env must carry :class:`fleetrl.envs.wrappers.EpisodeStats`, which reports
    ``info["episode"] = {"r": ..., "l": ...}`` when the episode really ends.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        self._envs = gym.vector.SyncVectorEnv(list(env_fns), autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.num_envs = self._envs.num_envs
        self.single_observation_space = self._envs.single_observation_space
        self.single_action_space = self._envs.single_action_space
        self.envs = self._envs.envs  # the sub-envs, for video capture and tests

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs, _ = self._envs.reset(seed=seed)
        return obs, {}

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, gym_info = self._envs.step(actions)
        info: dict[str, Any] = {}
        if "_final_obs" in gym_info:
            done = gym_info["_final_obs"]
            final_obs = np.zeros_like(obs)
            for i in np.flatnonzero(done):
                final_obs[i] = gym_info["final_obs"][i]
            info["final_obs"], info["_final_obs"] = final_obs, done
            finished = gym_info["final_info"]
            if "_episode" in finished:
                info["episode"] = {"r": finished["episode"]["r"], "l": finished["episode"]["l"]}
                info["_episode"] = finished["_episode"]
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._envs.close()


def episode_stats(info: dict[str, Any]) -> list[tuple[float, int]]:
    """The (return, length) of every episode that finished on this step."""
    if "_episode" not in info:
        return []
    mask = info["_episode"]
    return list(zip(info["episode"]["r"][mask].tolist(), info["episode"]["l"][mask].tolist()))
