"""What the native backends (ale, EnvPool) share: id mapping, per-env episode statistics, sub-pools for groups of envs
stepped apart, and putting step results together in fleetrl's info form."""

from __future__ import annotations

import gc
import re
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs import atari
from fleetrl.errors import FleetError

ATARI_MAX_EPISODE_STEPS = atari.MAX_FRAMES_PER_EPISODE // atari.FRAME_SKIP  # 27,000 agent steps
PROCGEN_DEFAULT_MODE = "Hard"  # procgen's own default distribution mode, for bare ids like Bigfish-v0

Ids = slice | np.ndarray  # which envs a batch of results belongs to, in its order

ATARI_NAME = re.compile(r"(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip-v4|-v5)")



def atari_game_name(env_id: str) -> str:
    """The ALE ROM id of an Atari env id: ``BreakoutNoFrameskip-v4`` / ``ALE/Breakout-v5`` -> ``breakout``."""
    try:
        atari.register_ale()
        game = gym.spec(env_id).kwargs.get("game")
        if game:
            return str(game)
    except Exception:  # unregistered id: fall back to the naming rule
        pass
    match = ATARI_NAME.fullmatch(env_id)
    if not match:
        raise FleetError(f"{env_id!r} is not an Atari id; use e.g. BreakoutNoFrameskip-v4 or ALE/Breakout-v5.")
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", match.group(1)).lower()


def envpool_task_id(env_id: str, family: str) -> str:
    """EnvPool's task name for a fleetrl env id (it may not exist in EnvPool; see native_backend_support)."""
    if family == "atari":
        # EnvPool names its Atari tasks after the ROM id in CamelCase: tic_tac_toe_3d -> TicTacToe3d-v5
        return "".join(part.capitalize() for part in atari_game_name(env_id).split("_")) + "-v5"
    if family == "procgen":
        match = re.fullmatch(r"([A-Za-z]+?)(Easy|Hard|Memory|Exploration)?-v0", env_id)
        if match and not match.group(2):
            return f"{match.group(1)}{PROCGEN_DEFAULT_MODE}-v0"
    return env_id


def infer_family(env_id: str) -> str:
    from fleetrl.envs.registry import env_family

    return env_family(env_id).name


class EpisodeTracker:
    """Per-env raw return and agent-step length, reported in fleetrl's info form at real episode ends."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)

    def reset(self) -> None:
        self.returns[:] = 0.0
        self.lengths[:] = 0

    def add(self, raw_reward: np.ndarray, ids: Ids = slice(None)) -> None:
        """One step of the envs ``ids`` (``raw_reward`` in their order)."""
        self.returns[ids] += raw_reward
        self.lengths[ids] += 1

    def finish(self, ended: np.ndarray, info: dict[str, Any], ids: Ids = slice(None)) -> None:
        if not ended.any():
            return
        returns, lengths = self.returns[ids], self.lengths[ids]
        info["episode"] = {"r": np.where(ended, returns, 0.0), "l": np.where(ended, lengths, 0)}
        info["_episode"] = ended.copy()
        self.returns[ids] = np.where(ended, 0.0, returns)
        self.lengths[ids] = np.where(ended, 0, lengths)


def final_obs_info(info: dict[str, Any], obs: np.ndarray, ended: np.ndarray, final: np.ndarray, where: np.ndarray) -> None:
    """Fill info["final_obs"]/"_final_obs" (ended mask) with ``final`` at ``where`` and ``obs`` elsewhere."""
    final_obs = np.zeros_like(obs)
    final_obs[where] = final[where]
    rest = ended & ~where
    final_obs[rest] = obs[rest]
    info["final_obs"], info["_final_obs"] = final_obs, ended.copy()


class SubPools:
    """The env-id ranges of a wrapper's sub-pools and the order they were sent in.

    A native pool in sync mode returns all its envs at once, so a wrapper that steps two groups of envs
    apart (the zero-lag sampler's halves) runs one pool per group: ``send`` starts one pool, ``recv``
    waits for the oldest one sent (or the one named), while the other steps on.
    """

    def __init__(self, num_envs: int, count: int):
        self.ranges = [(int(ids[0]), int(ids[-1]) + 1) for ids in np.array_split(np.arange(num_envs), count) if len(ids)]
        self.sent: deque[int] = deque()

    def named(self, env_ids: Any, what: str) -> list[int]:
        """The pools that ``env_ids`` names (all for None): each must be one pool's whole range."""
        ids = None if env_ids is None else np.asarray(env_ids).reshape(-1)
        if ids is None or np.array_equal(ids, np.arange(self.ranges[-1][1])):
            return list(range(len(self.ranges)))
        for p, (lo, hi) in enumerate(self.ranges):
            if np.array_equal(np.sort(ids), np.arange(lo, hi)):
                return [p]
        groups = ", ".join(f"{lo}..{hi - 1}" for lo, hi in self.ranges)
        raise FleetError(f"{what} takes the env ids of one group of envs (the groups are {groups}), got {ids.tolist()}; "
                         f"pass the ids from split().")

    def check_ordered(self, env_ids: Any, pools: list[int]) -> None:
        """The actions of ``pools`` are taken in env-id order: ``env_ids`` must come ascending."""
        lo, hi = self.ranges[pools[0]][0], self.ranges[pools[-1]][1]
        if env_ids is not None and not np.array_equal(np.asarray(env_ids).reshape(-1), np.arange(lo, hi)):
            raise FleetError(f"send() takes env ids in ascending order ({lo}..{hi - 1}), as split() and recv() give them.")

    def next_to_receive(self, env_ids: Any) -> int:
        if not self.sent:
            raise FleetError("recv() has nothing in flight: send() actions first.")
        p = self.sent[0] if env_ids is None else self.named(env_ids, "recv()")[0]
        if p not in self.sent:
            lo, hi = self.ranges[p]
            raise FleetError(f"recv() waits for envs {lo}..{hi - 1}, which were not sent; send() them first.")
        self.sent.remove(p)
        return p


def concat_results(parts: list[tuple]) -> tuple:
    """One step result ``(obs, reward, terminated, truncated, info)`` from the results of consecutive groups of envs."""
    if len(parts) == 1:
        return parts[0][:5]
    obs, reward, terminated, truncated = (np.concatenate([p[k] for p in parts]) for k in range(4))
    info: dict[str, Any] = {}
    if any("_final_obs" in p[4] for p in parts):
        info["final_obs"] = np.concatenate([p[4]["final_obs"] if "_final_obs" in p[4] else np.zeros_like(p[0]) for p in parts])
        info["_final_obs"] = np.concatenate([p[4].get("_final_obs", np.zeros(len(p[0]), bool)) for p in parts])
    if any("_episode" in p[4] for p in parts):
        none = {"r": np.zeros(0), "l": np.zeros(0, np.int64)}
        info["episode"] = {k: np.concatenate([p[4]["episode"][k] if "_episode" in p[4] else np.zeros(len(p[0]), none[k].dtype)
                                              for p in parts]) for k in ("r", "l")}
        info["_episode"] = np.concatenate([p[4].get("_episode", np.zeros(len(p[0]), bool)) for p in parts])
    return obs, reward, terminated, truncated, info


def result_rows(obs, reward, terminated, truncated, info) -> list[tuple]:
    """A step result split into one-env results (that :func:`concat_results` puts back together)."""
    rows = []
    for k in range(len(obs)):
        row_info = {key: ({n: v[k : k + 1] for n, v in value.items()} if key == "episode" else value[k : k + 1])
                    for key, value in info.items()}
        rows.append((obs[k : k + 1], reward[k : k + 1], terminated[k : k + 1], truncated[k : k + 1], row_info))
    return rows


def close_pools(pools: list) -> list:
    """Close native pools; their C++ threads go with the last reference, collected now. Returns the empty list."""
    for pool in pools:
        pool.close()
    if pools:
        gc.collect()
    return []
