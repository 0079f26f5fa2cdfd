"""Native vector backends: ale-py's C++ ``AtariVectorEnv`` and EnvPool, behind fleetrl's vector interface.

Both classes produce exactly the interface of :mod:`fleetrl.envs.vector` (same-step autoreset,
``info["final_obs"]``/``"_final_obs"``, ``info["episode"]``/``"_episode"`` only at a real episode end),
with the attributes ``num_envs``, ``single_observation_space``, ``single_action_space`` and the methods
``reset(seed=None) -> (obs, {})``, ``step(actions)`` and ``close()``.

:class:`AleVectorEnv` (Atari only)
    ALE runs noop-30 starts, frameskip 4 with max-pool, 84x84 grayscale (area resize), stack 4,
    sticky actions, the 108,000-frame cap and same-step autoreset in C++. It is built with
    ``reward_clipping=False`` and ``episodic_life=False``; fleetrl does both in Python, for training
    only, so that the episode statistics are the unclipped full-game score and length:

    * **Episodic life** (training): when ``info["lives"]`` drops (and the game is not over) the env
      reports ``terminated=True`` to the learner, with ``final_obs`` = the current obs, and the
      returned obs is that same obs: the game is *not* reset, it goes on underneath (the DeepMind
      semantics). ALE's own ``episodic_life=True`` is not used because it resets the whole game on a
      lost life.
    * **FIRE after a lost life** (games with FIRE): ALE presses FIRE only on a real reset,
      never after a lost life, so Breakout stalls with the ball unserved until the agent presses FIRE
      (a NOOP policy loses one life and then idles until the frame cap). fleetrl therefore replaces the
      action of that env by FIRE on the next step. The gymnasium chain instead takes three hidden
      steps (NOOP, FIRE, action 2) inside its reset; here the FIRE step is a visible agent step, so the
      learner sees one transition per lost life whose executed action was FIRE, not its own.
      Evaluation (``training=False``) presses it too, as the gymnasium chain's evaluation does: a greedy
      policy that never chooses FIRE must not idle to the frame cap.
    * **Reward clipping** (training): ``np.sign`` of the raw reward.
    * Game over is ALE's ``terminated``; truncation is the 108,000-frame cap (frames counted from the
      end of the noop start). ``info["episode"]`` is reported only then.
    * **Frame stack padding**: after a reset ALE fills the older stack slots with zeros, while the
      gymnasium chain (``FrameStackObservation``) and EnvPool repeat the first frame. fleetrl pads
      them with the first frame for the first three steps of each game, so the observations agree.

:class:`EnvPoolVectorEnv` (Atari, MuJoCo, classic control, Procgen)
    EnvPool autoresets on the *next* step (at ``done`` it returns the final obs; the next step
    returns the reset obs with reward 0 and ignores the action). fleetrl emulates same-step
    autoreset: after a step where some envs are done it immediately steps exactly those env ids once
    more (``step(action, env_id)``) to get their first obs, and puts the final obs into
    ``info["final_obs"]``. EnvPool seeds are fixed when the pool is made (``reset(seed=...)`` is
    ignored by EnvPool), so :meth:`EnvPoolVectorEnv.reset` rebuilds the pool: env ``i`` gets seed
    ``seed + i``. For Atari, EnvPool's own ``episodic_life`` is used: on a lost life it reports done
    without resetting the game, and its hidden reset step runs 0-29 NOOP frames and one FIRE frame in
    the same game (so the game does not stall); the rewards of those few hidden frames are not reported
    (EnvPool drops them). Evaluation takes that reset step too, but reports no end to the caller. Rewards are clipped in Python (training only) and the
    statistics use the raw reward, counting a real game over (``info["terminated"]``, ALE's
    game-over flag) or the 27,000-agent-step cap (= 108,000 frames) as the episode end.

:func:`native_backend_support` says which of the two can run an env id on this machine.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import re
import warnings
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs import atari
from fleetrl.errors import FleetError, require

ATARI_MAX_EPISODE_STEPS = atari.MAX_FRAMES_PER_EPISODE // atari.FRAME_SKIP  # 27,000 agent steps
PROCGEN_DEFAULT_MODE = "Hard"  # procgen's own default distribution mode, for bare ids like Bigfish-v0

Ids = slice | np.ndarray  # which envs a batch of results belongs to, in its order

_ATARI_NAME = re.compile(r"(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip-v4|-v5)")


# ----------------------------------------------------------------------------------------------
# id mapping


def atari_game_name(env_id: str) -> str:
    """The ALE ROM id of an Atari env id: ``BreakoutNoFrameskip-v4`` / ``ALE/Breakout-v5`` -> ``breakout``."""
    try:
        atari.register_ale()
        game = gym.spec(env_id).kwargs.get("game")
        if game:
            return str(game)
    except Exception:  # unregistered id: fall back to the naming rule
        pass
    match = _ATARI_NAME.fullmatch(env_id)
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


def _infer_family(env_id: str) -> str:
    from fleetrl.envs.registry import env_family

    return env_family(env_id).name


# ----------------------------------------------------------------------------------------------
# support probe


@functools.lru_cache(maxsize=None)
def native_backend_support(env_id: str, family: str) -> dict[str, bool]:
    """Which native backends can run ``env_id``: ``{"ale": bool, "envpool": bool}``.

    True means the package is installed and imports here, and the id is one it provides (for
    Procgen: EnvPool's Procgen module also loads, which needs the system Qt 5 runtime). Never raises.
    """
    return {"ale": _ale_supports(env_id, family), "envpool": _envpool_supports(env_id, family)}


def _ale_supports(env_id: str, family: str) -> bool:
    if family != "atari" or importlib.util.find_spec("ale_py") is None:
        return False
    try:
        importlib.import_module("ale_py.vector_env")
        from ale_py import roms

        with warnings.catch_warnings():  # ale-py warns "Rom ... not supported" for unknown games
            warnings.simplefilter("ignore")
            return roms.get_rom_path(atari_game_name(env_id)) is not None
    except Exception:
        return False


def _envpool_supports(env_id: str, family: str) -> bool:
    if importlib.util.find_spec("envpool") is None:
        return False
    try:
        envpool = importlib.import_module("envpool")
        task = envpool_task_id(env_id, family)
        if task not in envpool.list_all_envs():
            return False
        envpool.make_spec(task)  # loads the task's module: fails e.g. for Procgen without Qt 5
        return True
    except Exception:
        return False


# ----------------------------------------------------------------------------------------------
# shared bookkeeping


class _EpisodeTracker:
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


def _final_obs_info(info: dict[str, Any], obs: np.ndarray, ended: np.ndarray, final: np.ndarray, where: np.ndarray) -> None:
    """Fill info["final_obs"]/"_final_obs" (ended mask) with ``final`` at ``where`` and ``obs`` elsewhere."""
    final_obs = np.zeros_like(obs)
    final_obs[where] = final[where]
    rest = ended & ~where
    final_obs[rest] = obs[rest]
    info["final_obs"], info["_final_obs"] = final_obs, ended.copy()


class _SubPools:
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


def _concat_results(parts: list[tuple]) -> tuple:
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


def _result_rows(obs, reward, terminated, truncated, info) -> list[tuple]:
    """A step result split into one-env results (that :func:`_concat_results` puts back together)."""
    rows = []
    for k in range(len(obs)):
        row_info = {key: ({n: v[k : k + 1] for n, v in value.items()} if key == "episode" else value[k : k + 1])
                    for key, value in info.items()}
        rows.append((obs[k : k + 1], reward[k : k + 1], terminated[k : k + 1], truncated[k : k + 1], row_info))
    return rows


def _group_count(num_envs: int, async_batch: int | None, backend: str) -> int:
    """Sub-pools for ``async_batch``: one, or two halves stepped apart (the only first-ready batch ale has)."""
    if async_batch is None or async_batch == num_envs:
        return 1
    if 2 * async_batch == num_envs:
        return 2
    raise FleetError(
        f"The {backend} backend returns envs in two fixed halves at most, so --async-batch must be {num_envs} or "
        f"{num_envs // 2} with --num-envs {num_envs}, got {async_batch}. For first-ready batches of other sizes use "
        f"--env-backend async or envpool."
    )


# ----------------------------------------------------------------------------------------------
# ALE


def _ale_action_set(game: str) -> list:
    """The game's minimal action set, read from the ROM once (a pool is only built at reset)."""
    from ale_py import ALEInterface, LoggerMode, roms

    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.loadROM(roms.get_rom_path(game))
    return list(ale.getMinimalActionSet())


class AleVectorEnv:
    """Atari on ale-py's C++ ``AtariVectorEnv`` (threads, same-step autoreset), with fleetrl's semantics.

    ``sticky_actions``: None takes the id's rule (0 for ``NoFrameskip-v4``, 0.25 for ``ALE/...-v5``).
    ``num_threads``: ALE's worker threads (0: its default), shared by the sub-pools. ``fire_on_life_loss``:
    press FIRE on the step after a lost life (default: yes, in training and evaluation alike). See
    the module docstring for how episodic life and FIRE are handled.

    ``send``/``recv`` step groups of envs apart. ALE's own asynchronous mode can only send actions to the
    envs it returned last, so the groups are sub-pools (:class:`_SubPools`): ``split(2)`` (or
    ``async_batch = num_envs / 2``) runs two, built at the next ``reset``. Env ``i`` is seeded
    ``seed + i`` however the envs are grouped, so the groups step exactly as one pool would.
    """

    steps_in_background = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        training: bool,
        sticky_actions: float | None = None,
        num_threads: int = 0,
        max_num_frames_per_episode: int = atari.MAX_FRAMES_PER_EPISODE,
        fire_on_life_loss: bool | None = None,
        async_batch: int | None = None,
    ):
        self._vector_env = require("ale_py.vector_env", "atari", "The ALE vector backend (--env-backend ale)")
        from ale_py import Action, roms

        self.env_id = env_id
        self.training = training
        self.game = atari_game_name(env_id)
        if roms.get_rom_path(self.game) is None:
            raise FleetError(f"ale-py has no ROM {self.game!r} for {env_id!r}; --env-backend ale cannot run it.")
        self._sticky = atari.default_sticky_actions(env_id) if sticky_actions is None else float(sticky_actions)
        self._num_threads, self._max_frames = num_threads, max_num_frames_per_episode
        self.num_envs = num_envs
        self.async_batch = num_envs if async_batch is None else int(async_batch)
        self._groups = _SubPools(num_envs, _group_count(num_envs, async_batch, "ale"))
        self._pools: list = []  # one AtariVectorEnv per group, built by reset()
        self.single_observation_space = gym.spaces.Box(
            0, 255, (atari.FRAME_STACK, atari.SCREEN_SIZE, atari.SCREEN_SIZE), dtype=np.uint8
        )
        action_set = _ale_action_set(self.game)
        self.single_action_space = gym.spaces.Discrete(len(action_set))
        self.fire_action = action_set.index(Action.FIRE) if Action.FIRE in action_set else None
        fire = True if fire_on_life_loss is None else fire_on_life_loss
        self._fire_on_life_loss = bool(fire) and self.fire_action is not None
        self._lives = np.zeros(num_envs, np.int32)
        self._pending_fire = np.zeros(num_envs, bool)
        self._since_reset = np.zeros(num_envs, np.int64)  # agent steps since the game's first obs
        self._stats = _EpisodeTracker(num_envs)

    def _build(self) -> None:
        self._drop_pools()
        count = len(self._groups.ranges)
        threads = max(1, self._num_threads // count) if self._num_threads else 0
        for lo, hi in self._groups.ranges:
            self._pools.append(self._vector_env.AtariVectorEnv(
                game=self.game,
                num_envs=hi - lo,
                num_threads=threads,
                max_num_frames_per_episode=self._max_frames,
                repeat_action_probability=self._sticky,
                full_action_space=False,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
                img_height=atari.SCREEN_SIZE,
                img_width=atari.SCREEN_SIZE,
                grayscale=True,
                stack_num=atari.FRAME_STACK,
                frameskip=atari.FRAME_SKIP,
                maxpool=True,
                noop_max=atari.NOOP_MAX,
                episodic_life=False,
                life_loss_info=False,
                reward_clipping=False,
                use_fire_reset=True,
            ))

    def split(self, count: int) -> list[np.ndarray]:
        """``count`` groups of env ids to step apart (sub-pools, rebuilt at the next ``reset``)."""
        if count != len(self._groups.ranges):
            self._groups = _SubPools(self.num_envs, count)
            self._drop_pools()
        return [np.arange(lo, hi) for lo, hi in self._groups.ranges]

    @staticmethod
    def _pad_stack(obs: np.ndarray, since_reset: np.ndarray) -> np.ndarray:
        """Replace ALE's zero slots (the first ``stack - 1 - k`` frames, k steps after a reset) by the first frame."""
        stack = obs.shape[1]
        if (since_reset >= stack - 1).all():
            return obs
        if not obs.flags.writeable:
            obs = obs.copy()
        for k in range(stack - 1):
            mask = since_reset == k
            if mask.any():
                first = stack - 1 - k  # the slot of the game's first frame
                obs[mask, :first] = obs[mask, first : first + 1]
        return obs

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        if not self._pools:
            self._build()
        self._groups.sent.clear()
        parts, lives = [], []
        for (lo, _), pool in zip(self._groups.ranges, self._pools):
            obs, info = pool.reset(seed=None if seed is None else int(seed) + lo)  # env i: seed + i, as one pool
            parts.append(obs)
            lives.append(info["lives"])
        self._lives[:] = np.concatenate(lives)
        self._pending_fire[:] = False
        self._since_reset[:] = 0
        self._stats.reset()
        return self._pad_stack(np.concatenate(parts) if len(parts) > 1 else parts[0], self._since_reset), {}

    def step(self, actions: np.ndarray):
        self.send(actions)
        return _concat_results([self.recv() for _ in self._pools])

    def send(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> None:
        """Start stepping ``env_ids``: one group from :meth:`split`, or all envs (None)."""
        if not self._pools:
            raise FleetError("AleVectorEnv.send() was called before reset().")
        actions = np.asarray(actions)
        if actions.dtype != np.int64 and actions.dtype != np.int32:
            actions = actions.astype(np.int64)
        pools = self._groups.named(env_ids, "send()")
        self._groups.check_ordered(env_ids, pools)
        start = self._groups.ranges[pools[0]][0]
        for p in pools:
            lo, hi = self._groups.ranges[p]
            group_actions = actions[lo - start : hi - start]
            if self._pending_fire[lo:hi].any():
                group_actions = group_actions.copy()
                group_actions[self._pending_fire[lo:hi]] = self.fire_action
            self._pools[p].send(group_actions)
            self._groups.sent.append(p)

    def recv(self, env_ids: np.ndarray | None = None):
        """The results of the group sent first (or of ``env_ids``): ``obs, ..., info, env_ids``."""
        p = self._groups.next_to_receive(env_ids)
        lo, hi = self._groups.ranges[p]
        obs, reward, game_over, truncated, ale_info = self._pools[p].recv()
        ids = slice(lo, hi)
        raw = reward.astype(np.float64)
        self._stats.add(raw, ids)
        real_end = game_over | truncated
        lives = ale_info["lives"]  # after an autoreset: the new game's lives
        life_lost = (lives < self._lives[ids]) & (lives > 0) & ~real_end
        self._pending_fire[ids] = life_lost & self._fire_on_life_loss
        if self.training:  # episodic life and reward clipping
            terminated = game_over | life_lost
            reward = np.sign(raw)
        else:
            terminated = game_over.copy()
            reward = raw
        self._lives[ids] = lives
        since_reset = self._since_reset[ids]  # a view: updated in place
        since_reset += 1
        final = None
        if real_end.any():  # ALE's final obs of a finished game, padded by its own step count
            final = self._pad_stack(np.array(ale_info["final_obs"]), since_reset)
            since_reset[real_end] = 0
        obs = self._pad_stack(obs, since_reset)
        info: dict[str, Any] = {}
        ended = terminated | truncated
        if ended.any():
            # a real end: ALE's final obs; a lost life only: the game goes on, so the current obs
            _final_obs_info(info, obs, ended, obs if final is None else final, real_end)
            self._stats.finish(real_end, info, ids)
        return obs, reward, terminated, truncated, info, np.arange(lo, hi)

    def _drop_pools(self) -> None:
        if self._pools:
            for pool in self._pools:
                pool.close()
            self._pools = []  # the C++ threads go with the last reference
            gc.collect()

    def close(self) -> None:
        self._drop_pools()


# ----------------------------------------------------------------------------------------------
# EnvPool


def _import_envpool():
    envpool = require("envpool", "envpool", "The EnvPool backend (--env-backend envpool)")
    return envpool


class EnvPoolVectorEnv:
    """EnvPool's C++ thread pool with same-step autoreset emulated by stepping finished envs once more.

    ``family``: "atari" | "mujoco" | "classic" | "procgen" (None: inferred from the id).
    ``sticky_actions`` (Atari): None takes the id's rule. ``num_threads``: EnvPool's threads (0: default).

    ``send``/``recv`` in two ways:
    * ``async_batch`` K below ``num_envs``: one asynchronous pool, and ``recv`` returns the first K envs
      ready (EnvPool's own mode). An env that finishes an episode is sent its reset step at once and
      returned when that comes back, so K must be at most half the envs (else the pool could wait for
      more envs than are stepping) and divide them.
    * ``split(2)``: two synchronous sub-pools (:class:`_SubPools`), the zero-lag sampler's fixed halves.
    """

    steps_in_background = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        training: bool,
        sticky_actions: float | None = None,
        family: str | None = None,
        num_threads: int = 0,
        max_episode_steps: int | None = None,
        async_batch: int | None = None,
    ):
        self._envpool = _import_envpool()
        self.env_id = env_id
        self.training = training
        self.family = family or _infer_family(env_id)
        self.task_id = envpool_task_id(env_id, self.family)
        if self.task_id not in self._envpool.list_all_envs():
            raise FleetError(
                f"EnvPool has no task {self.task_id!r} (for --env-id {env_id!r}); use another --env-backend "
                f"(sync, async or auto)."
            )
        kwargs: dict[str, Any] = {}
        if self.family == "atari":
            sticky = atari.default_sticky_actions(env_id) if sticky_actions is None else float(sticky_actions)
            kwargs.update(
                img_height=atari.SCREEN_SIZE,
                img_width=atari.SCREEN_SIZE,
                gray_scale=True,
                use_inter_area_resize=True,
                stack_num=atari.FRAME_STACK,
                frame_skip=atari.FRAME_SKIP,
                noop_max=atari.NOOP_MAX,
                use_fire_reset=True,
                episodic_life=True,  # its reset after a lost life presses FIRE; evaluation hides the end (_process)
                reward_clip=False,  # clipped in Python, so the statistics see the raw score
                repeat_action_probability=sticky,
                full_action_space=False,
                max_episode_steps=ATARI_MAX_EPISODE_STEPS,
            )
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = int(max_episode_steps)
        self._kwargs, self._num_threads = kwargs, num_threads
        try:
            spec = self._envpool.make_spec(self.task_id, num_envs=num_envs, **kwargs)
        except ImportError as exc:  # e.g. Procgen without the system Qt 5 runtime
            raise FleetError(
                f"EnvPool cannot load {self.task_id!r}: {exc} (on Debian/Ubuntu: apt-get install libqt5gui5)"
            ) from None
        self.num_envs = num_envs
        if not hasattr(spec, "gymnasium_observation_space"):
            raise FleetError(
                f"envpool {getattr(self._envpool, '__version__', '?')} is too old for fleetrl (it has no gymnasium "
                f"spaces); fleetrl is tested with envpool 1.2.5: pip install -U envpool"
            )
        self.single_observation_space = spec.gymnasium_observation_space
        self.single_action_space = spec.gymnasium_action_space
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._action_dtype = np.int32 if self._discrete else self.single_action_space.dtype
        self.async_batch = num_envs if async_batch is None else int(async_batch)
        if self.async_batch != num_envs and not (1 <= self.async_batch <= num_envs // 2 and num_envs % self.async_batch == 0):
            raise FleetError(
                f"EnvPool's first-ready batches need --async-batch to divide --num-envs {num_envs} and be at most half of it "
                f"(an env that ends an episode takes one more step, its reset, before it is returned), got {self.async_batch}. "
                f"Choose one of {[k for k in range(1, num_envs // 2 + 1) if num_envs % k == 0]}, or use --env-backend async."
            )
        self._groups = _SubPools(num_envs, 1)
        self._pools: list = []  # built by reset(): EnvPool seeds a pool when it is made
        self._stats = _EpisodeTracker(num_envs)
        # first-ready mode: envs whose reset step is in flight, and finished results waiting for recv()
        self._resetting = np.zeros(num_envs, bool)
        self._held: dict[int, tuple] = {}
        self._ready: deque[int] = deque()

    def split(self, count: int) -> list[np.ndarray]:
        """``count`` groups of env ids to step apart (synchronous sub-pools, built at the next ``reset``)."""
        if self.async_batch != self.num_envs:
            raise FleetError("split() steps fixed groups of envs; it does not combine with first-ready batches (async_batch).")
        if count != len(self._groups.ranges):
            self._groups = _SubPools(self.num_envs, count)
            self._drop_pools()
        return [np.arange(lo, hi) for lo, hi in self._groups.ranges]

    def _build(self, seed: int) -> None:
        self._drop_pools()
        count = len(self._groups.ranges)
        threads = max(1, self._num_threads // count) if self._num_threads else 0
        for lo, hi in self._groups.ranges:
            batch = self.async_batch if self.async_batch != self.num_envs else hi - lo
            self._pools.append(self._envpool.make(self.task_id, env_type="gymnasium", seed=int(seed) + lo, num_envs=hi - lo,
                                                  batch_size=batch, num_threads=threads, **self._kwargs))

    def _drop_pools(self) -> None:
        if self._pools:
            for pool in self._pools:
                pool.close()
            self._pools = []  # EnvPool's threads go with the last reference
            gc.collect()

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        # EnvPool ignores reset(seed=...), and with episodic life its reset would not restart a game
        # that is not over: fresh pools give a true reset of every env, seeded seed + i.
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - self.num_envs))
        self._build(seed)
        self._groups.sent.clear()
        self._resetting[:] = False
        self._held.clear()
        self._ready.clear()
        obs = np.zeros((self.num_envs, *self.single_observation_space.shape), self.single_observation_space.dtype)
        for (lo, hi), pool in zip(self._groups.ranges, self._pools):
            part, info = pool.reset()
            seen = len(part)
            obs[lo + info["env_id"]] = part
            while seen < hi - lo:  # a first-ready pool returns its reset observations a batch at a time
                part, *_, info = pool.recv()
                obs[lo + info["env_id"]] = part
                seen += len(part)
        self._stats.reset()
        return obs, {}

    def step(self, actions: np.ndarray):
        if self.async_batch != self.num_envs:
            raise FleetError("step() steps every env, which a first-ready EnvPool (async_batch) does not; use send()/recv().")
        self.send(actions)
        return _concat_results([self.recv() for _ in self._pools])

    def send(self, actions: np.ndarray, env_ids: np.ndarray | None = None) -> None:
        """Start stepping ``env_ids`` (all if None): any envs in first-ready mode, else one group from :meth:`split`."""
        if not self._pools:
            raise FleetError("EnvPoolVectorEnv.send() was called before reset().")
        actions = np.asarray(actions, dtype=self._action_dtype)
        if self.async_batch != self.num_envs:
            ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids).reshape(-1)
            self._pools[0].send(actions, ids.astype(np.int32))
            return
        pools = self._groups.named(env_ids, "send()")
        self._groups.check_ordered(env_ids, pools)
        start = self._groups.ranges[pools[0]][0]
        for p in pools:
            lo, hi = self._groups.ranges[p]
            self._pools[p].send(actions[lo - start : hi - start])
            self._groups.sent.append(p)

    def recv(self, env_ids: np.ndarray | None = None):
        """First-ready mode: the first ``async_batch`` envs ready; else the group sent first (or ``env_ids``)."""
        if self.async_batch != self.num_envs:
            if env_ids is not None:
                raise FleetError("A first-ready EnvPool returns the first envs ready; recv() takes no env_ids here.")
            return self._recv_first_ready()
        p = self._groups.next_to_receive(env_ids)
        lo, hi = self._groups.ranges[p]
        pool = self._pools[p]
        obs, reward, terminated, truncated, info, local, restart = self._process(*pool.recv(), lo)
        if restart.any():
            # EnvPool's next step on a done env is its reset step (reward 0, the action ignored):
            # take it now, for those envs only, so obs holds their first observation (same-step)
            done = np.flatnonzero(restart).astype(np.int32)
            reset_obs, *_, reset_info = pool.step(self._dummy_actions(len(done)), env_id=local[done])
            obs = np.array(obs)
            obs[np.searchsorted(local, reset_info["env_id"])] = reset_obs
        return obs, reward, terminated, truncated, info, local + lo

    def _dummy_actions(self, n: int) -> np.ndarray:
        return np.zeros((n, *self.single_action_space.shape), self._action_dtype)

    def _process(self, obs, reward, terminated, truncated, ep_info, offset: int = 0):
        """EnvPool's step results in fleetrl's form, ordered by env id, and the envs whose reset step (EnvPool's
        done) is still to take, which is the caller's: in evaluation a lost life takes it without ending."""
        local = ep_info["env_id"]
        if len(local) > 1 and (np.diff(local) < 0).any():  # sync mode returns env order; be safe
            order = np.argsort(local)
            obs, reward, terminated, truncated, local = obs[order], reward[order], terminated[order], truncated[order], local[order]
            ep_info = {k: v[order] for k, v in ep_info.items() if isinstance(v, np.ndarray)}
        ids = local + offset
        raw = reward.astype(np.float64)
        terminated = terminated.astype(bool)
        truncated = truncated.astype(bool)
        self._stats.add(raw, ids)
        restart = terminated | truncated
        if self.family == "atari":
            game_over = ep_info["terminated"].astype(bool)
            real_end = truncated | (terminated & game_over)
            reward = np.sign(raw) if self.training else raw
            if not self.training:  # a lost life is no end in evaluation: the game goes on after the reset step
                terminated = terminated & real_end
        else:
            real_end = terminated | truncated
            reward = raw
        info: dict[str, Any] = {}
        ended = terminated | truncated
        if ended.any():
            final_obs = np.zeros_like(obs)
            final_obs[ended] = obs[ended]
            info["final_obs"], info["_final_obs"] = final_obs, ended
            self._stats.finish(real_end, info, ids)
        return obs, reward, terminated, truncated, info, local, restart

    def _recv_first_ready(self):
        """Hold each env that ended an episode until its reset step returns, then return it same-step."""
        pool = self._pools[0]
        while len(self._ready) < self.async_batch:
            obs, reward, terminated, truncated, ep_info = pool.recv()
            obs = np.array(obs)  # rows of it wait in _held past the next recv
            resets = self._resetting[ep_info["env_id"]]
            if resets.any():  # reset steps: the held final results get their first observation
                for env, first in zip(ep_info["env_id"][resets].tolist(), obs[resets]):
                    self._held[env] = (first[None], *self._held[env][1:])
                    self._ready.append(env)
                self._resetting[ep_info["env_id"][resets]] = False
                keep = ~resets
                obs, reward, terminated, truncated = obs[keep], reward[keep], terminated[keep], truncated[keep]
                ep_info = {k: v[keep] for k, v in ep_info.items() if isinstance(v, np.ndarray)}
            if not len(obs):
                continue
            *result, ids, ended = self._process(obs, reward, terminated, truncated, ep_info)
            self._held.update(zip(ids.tolist(), _result_rows(*result)))
            if ended.any():
                done = ids[ended].astype(np.int32)
                pool.send(self._dummy_actions(len(done)), done)
                self._resetting[done] = True
            self._ready.extend(ids[~ended].tolist())
        batch = [self._ready.popleft() for _ in range(self.async_batch)]
        return (*_concat_results([self._held.pop(env) for env in batch]), np.array(batch))

    def close(self) -> None:
        self._drop_pools()

