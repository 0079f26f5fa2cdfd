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
    * **FIRE after a lost life** (training, games with FIRE): ALE presses FIRE only on a real reset,
      never after a lost life, so Breakout stalls with the ball unserved until the agent presses FIRE
      (a NOOP policy loses one life and then idles until the frame cap). fleetrl therefore replaces the
      action of that env by FIRE on the next step. The gymnasium chain instead takes three hidden
      steps (NOOP, FIRE, action 2) inside its reset; here the FIRE step is a visible agent step, so the
      learner sees one transition per lost life whose executed action was FIRE, not its own.
      Evaluation (``training=False``) presses nothing, as the gymnasium chain does.
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
    ``seed + i``. For Atari, EnvPool's own ``episodic_life`` is used in training: on a lost life it
    reports done without resetting the game, and its hidden reset step runs 0-29 NOOP frames and one
    FIRE frame in the same game (so the game does not stall); the rewards of those few hidden frames
    are not reported (EnvPool drops them). Rewards are clipped in Python (training only) and the
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
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs import atari
from fleetrl.errors import FleetError, require

ATARI_MAX_EPISODE_STEPS = atari.MAX_FRAMES_PER_EPISODE // atari.FRAME_SKIP  # 27,000 agent steps
PROCGEN_DEFAULT_MODE = "Hard"  # procgen's own default distribution mode, for bare ids like Bigfish-v0

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

    def add(self, raw_reward: np.ndarray, mask: np.ndarray | None = None) -> None:
        if mask is None:
            self.returns += raw_reward
            self.lengths += 1
        else:
            self.returns[mask] += raw_reward[mask]
            self.lengths[mask] += 1

    def finish(self, ended: np.ndarray, info: dict[str, Any]) -> None:
        if not ended.any():
            return
        info["episode"] = {"r": np.where(ended, self.returns, 0.0), "l": np.where(ended, self.lengths, 0)}
        info["_episode"] = ended.copy()
        self.returns[ended] = 0.0
        self.lengths[ended] = 0


def _final_obs_info(info: dict[str, Any], obs: np.ndarray, ended: np.ndarray, final: np.ndarray, where: np.ndarray) -> None:
    """Fill info["final_obs"]/"_final_obs" (ended mask) with ``final`` at ``where`` and ``obs`` elsewhere."""
    final_obs = np.zeros_like(obs)
    final_obs[where] = final[where]
    rest = ended & ~where
    final_obs[rest] = obs[rest]
    info["final_obs"], info["_final_obs"] = final_obs, ended.copy()


# ----------------------------------------------------------------------------------------------
# ALE


class AleVectorEnv:
    """Atari on ale-py's C++ ``AtariVectorEnv`` (threads, same-step autoreset), with fleetrl's semantics.

    ``sticky_actions``: None takes the id's rule (0 for ``NoFrameskip-v4``, 0.25 for ``ALE/...-v5``).
    ``num_threads``: ALE's worker threads (0: its default). ``fire_on_life_loss``: press FIRE on the
    step after a lost life (default: when training, as the gymnasium chain does). See the module
    docstring for how episodic life and FIRE are handled.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        training: bool,
        sticky_actions: float | None = None,
        num_threads: int = 0,
        max_num_frames_per_episode: int = atari.MAX_FRAMES_PER_EPISODE,
        fire_on_life_loss: bool | None = None,
    ):
        vector_env = require("ale_py.vector_env", "atari", "The ALE vector backend (--env-backend ale)")
        from ale_py import Action, roms

        self.env_id = env_id
        self.training = training
        self.game = atari_game_name(env_id)
        if roms.get_rom_path(self.game) is None:
            raise FleetError(f"ale-py has no ROM {self.game!r} for {env_id!r}; --env-backend ale cannot run it.")
        sticky = atari.default_sticky_actions(env_id) if sticky_actions is None else float(sticky_actions)
        self._env = vector_env.AtariVectorEnv(
            game=self.game,
            num_envs=num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=max_num_frames_per_episode,
            repeat_action_probability=sticky,
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
        )
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(
            0, 255, (atari.FRAME_STACK, atari.SCREEN_SIZE, atari.SCREEN_SIZE), dtype=np.uint8
        )
        self.single_action_space = gym.spaces.Discrete(int(self._env.single_action_space.n))
        action_set = list(self._env.ale.get_action_set())
        self.fire_action = action_set.index(Action.FIRE) if Action.FIRE in action_set else None
        fire = training if fire_on_life_loss is None else fire_on_life_loss
        self._fire_on_life_loss = bool(fire) and self.fire_action is not None
        self._lives = np.zeros(num_envs, np.int32)
        self._pending_fire = np.zeros(num_envs, bool)
        self._since_reset = np.zeros(num_envs, np.int64)  # agent steps since the game's first obs
        self._stats = _EpisodeTracker(num_envs)

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
        obs, info = self._env.reset(seed=None if seed is None else int(seed))
        self._lives[:] = info["lives"]
        self._pending_fire[:] = False
        self._since_reset[:] = 0
        self._stats.reset()
        return self._pad_stack(obs, self._since_reset), {}

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions)
        if actions.dtype != np.int64 and actions.dtype != np.int32:
            actions = actions.astype(np.int64)
        if self._pending_fire.any():
            actions = actions.copy()
            actions[self._pending_fire] = self.fire_action
        obs, reward, game_over, truncated, ale_info = self._env.step(actions)
        raw = reward.astype(np.float64)
        self._stats.add(raw)
        real_end = game_over | truncated
        lives = ale_info["lives"]  # after an autoreset: the new game's lives
        life_lost = (lives < self._lives) & (lives > 0) & ~real_end
        self._pending_fire = life_lost & self._fire_on_life_loss
        if self.training:  # episodic life and reward clipping
            terminated = game_over | life_lost
            reward = np.sign(raw)
        else:
            terminated = game_over.copy()
            reward = raw
        self._lives = lives.astype(np.int32, copy=True)
        self._since_reset += 1
        final = None
        if real_end.any():  # ALE's final obs of a finished game, padded by its own step count
            final = self._pad_stack(np.array(ale_info["final_obs"]), self._since_reset)
            self._since_reset[real_end] = 0
        obs = self._pad_stack(obs, self._since_reset)
        info: dict[str, Any] = {}
        ended = terminated | truncated
        if ended.any():
            # a real end: ALE's final obs; a lost life only: the game goes on, so the current obs
            _final_obs_info(info, obs, ended, obs if final is None else final, real_end)
            self._stats.finish(real_end, info)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None  # the C++ threads go with the last reference
            gc.collect()


# ----------------------------------------------------------------------------------------------
# EnvPool


def _import_envpool():
    envpool = require("envpool", "envpool", "The EnvPool backend (--env-backend envpool)")
    return envpool


class EnvPoolVectorEnv:
    """EnvPool's C++ thread pool with same-step autoreset emulated by stepping finished envs once more.

    ``family``: "atari" | "mujoco" | "classic" | "procgen" (None: inferred from the id).
    ``sticky_actions`` (Atari): None takes the id's rule. ``num_threads``: EnvPool's threads (0: default).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        training: bool,
        sticky_actions: float | None = None,
        family: str | None = None,
        num_threads: int = 0,
        max_episode_steps: int | None = None,
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
        kwargs: dict[str, Any] = {"num_envs": num_envs, "batch_size": num_envs, "num_threads": num_threads}
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
                episodic_life=training,
                reward_clip=False,  # clipped in Python, so the statistics see the raw score
                repeat_action_probability=sticky,
                full_action_space=False,
                max_episode_steps=ATARI_MAX_EPISODE_STEPS,
            )
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = int(max_episode_steps)
        self._kwargs = kwargs
        try:
            spec = self._envpool.make_spec(self.task_id, **kwargs)
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
        self._pool = None
        self._env_ids = np.arange(num_envs, dtype=np.int32)
        self._stats = _EpisodeTracker(num_envs)

    def _build(self, seed: int) -> None:
        self._drop_pool()
        self._pool = self._envpool.make(self.task_id, env_type="gymnasium", seed=int(seed), **self._kwargs)

    def _drop_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None  # EnvPool's threads go with the last reference
            gc.collect()

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        # EnvPool ignores reset(seed=...), and with episodic life its reset would not restart a game
        # that is not over: a fresh pool gives a true reset of every env, seeded seed + i.
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - self.num_envs))
        self._build(seed)
        obs, info = self._pool.reset()
        if not self._in_order(info["env_id"]):
            obs = obs[np.argsort(info["env_id"])]
        self._stats.reset()
        return obs, {}

    def _in_order(self, env_ids: np.ndarray) -> bool:
        return len(env_ids) == self.num_envs and bool((env_ids == self._env_ids).all())

    def step(self, actions: np.ndarray):
        if self._pool is None:
            raise FleetError("EnvPoolVectorEnv.step() was called before reset().")
        actions = np.asarray(actions, dtype=self._action_dtype)
        obs, reward, terminated, truncated, ep_info = self._pool.step(actions)
        ids = ep_info["env_id"]
        if not self._in_order(ids):  # sync mode (batch_size == num_envs) returns env order; be safe
            order = np.argsort(ids)
            obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
            ep_info = {k: v[order] for k, v in ep_info.items() if isinstance(v, np.ndarray)}
        raw = reward.astype(np.float64)
        terminated = terminated.astype(bool)
        truncated = truncated.astype(bool)
        self._stats.add(raw)
        if self.family == "atari":
            game_over = ep_info["terminated"].astype(bool)
            real_end = truncated | (terminated & game_over)
            reward = np.sign(raw) if self.training else raw
        else:
            real_end = terminated | truncated
            reward = raw
        info: dict[str, Any] = {}
        ended = terminated | truncated
        if ended.any():
            final_obs = np.zeros_like(obs)
            final_obs[ended] = obs[ended]
            info["final_obs"], info["_final_obs"] = final_obs, ended
            # EnvPool's next step on a done env is its reset step (reward 0, the action ignored):
            # take it now, for those envs only, so obs holds their first observation (same-step)
            done_ids = np.flatnonzero(ended).astype(np.int32)
            dummy = np.zeros((len(done_ids), *self.single_action_space.shape), self._action_dtype)
            reset_obs, _, _, _, reset_info = self._pool.step(dummy, env_id=done_ids)
            obs = np.array(obs)
            obs[reset_info["env_id"]] = reset_obs
            self._stats.finish(real_end, info)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._drop_pool()
