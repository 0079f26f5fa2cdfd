"""Atari on ale-py's C++ vector, behind fleetrl's vector interface (same-step autoreset, episode statistics at real
ends).

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
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs import atari
from fleetrl.envs.native.common import (
    EpisodeTracker,
    SubPools,
    atari_game_name,
    close_pools,
    concat_results,
    final_obs_info,
)
from fleetrl.envs.vector import check_async_batch
from fleetrl.errors import FleetError, require


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
    envs it returned last, so the groups are sub-pools (:class:`SubPools`): ``split(2)`` (or
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
        frame_stack: int = atari.FRAME_STACK,
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
        check_async_batch(num_envs, self.async_batch, "ale")
        self._groups = SubPools(num_envs, 1 if self.async_batch == num_envs else 2)  # first-ready: the two halves
        self._pools: list = []  # one AtariVectorEnv per group, built by reset()
        self.single_observation_space = gym.spaces.Box(
            0, 255, (frame_stack, atari.SCREEN_SIZE, atari.SCREEN_SIZE), dtype=np.uint8
        )
        action_set = _ale_action_set(self.game)
        self.single_action_space = gym.spaces.Discrete(len(action_set))
        self.fire_action = action_set.index(Action.FIRE) if Action.FIRE in action_set else None
        fire = True if fire_on_life_loss is None else fire_on_life_loss
        self._fire_on_life_loss = bool(fire) and self.fire_action is not None
        self._lives = np.zeros(num_envs, np.int32)
        self._pending_fire = np.zeros(num_envs, bool)
        self._since_reset = np.zeros(num_envs, np.int64)  # agent steps since the game's first obs
        self._stats = EpisodeTracker(num_envs)

    def _build(self) -> None:
        self._pools = close_pools(self._pools)
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
                stack_num=self.single_observation_space.shape[0],
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
            self._groups = SubPools(self.num_envs, count)
            self._pools = close_pools(self._pools)
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
        return concat_results([self.recv() for _ in self._pools])

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
            final_obs_info(info, obs, ended, obs if final is None else final, real_end)
            self._stats.finish(real_end, info, ids)
        return obs, reward, terminated, truncated, info, np.arange(lo, hi)

    def close(self) -> None:
        self._pools = close_pools(self._pools)
