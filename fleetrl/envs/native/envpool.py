"""EnvPool's C++ thread pool (Atari, MuJoCo, classic control, Procgen), behind fleetrl's vector interface.

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

    ``next_step=True`` (make_vec's gymnasium NEXT_STEP; training never sets it) keeps EnvPool's own
    next-step autoreset instead: an env that ends an episode returns its last obs as ``obs`` (no
    ``info["final_obs"]``), and its next step, whose action EnvPool ignores, is its reset step (the
    first obs, reward 0, both flags false), returned to the caller as it is and left out of the
    episode statistics. Only the hidden reset step of evaluation's lost life is still taken at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs import atari
from fleetrl.envs.native.common import (
    ATARI_MAX_EPISODE_STEPS,
    EpisodeTracker,
    SubPools,
    close_pools,
    concat_results,
    envpool_task_id,
    infer_family,
    result_rows,
)
from fleetrl.envs.vector import check_async_batch
from fleetrl.errors import FleetError, require


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
    * ``split(2)``: two synchronous sub-pools (:class:`SubPools`), the zero-lag sampler's fixed halves.

    ``next_step``: EnvPool's own next-step autoreset, for make_vec's NEXT_STEP (module docstring); every env stepped
    together only, so a first-ready ``async_batch`` is refused with it.
    """

    steps_in_background = True

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        family: str | None = None,
        training: bool,
        sticky_actions: float | None = None,
        num_threads: int = 0,
        max_episode_steps: int | None = None,
        async_batch: int | None = None,
        frame_stack: int = atari.FRAME_STACK,
        next_step: bool = False,
    ):
        self._envpool = _import_envpool()
        self.env_id = env_id
        self.training = training
        self.family = family or infer_family(env_id)
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
                stack_num=frame_stack,
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
        check_async_batch(num_envs, self.async_batch, "envpool")
        self._groups = SubPools(num_envs, 1)
        self._pools: list = []  # built by reset(): EnvPool seeds a pool when it is made
        self._stats = EpisodeTracker(num_envs)
        # first-ready mode: envs whose reset step is in flight, and finished results waiting for recv()
        self._resetting = np.zeros(num_envs, bool)
        self._held: dict[int, tuple] = {}
        self._ready: deque[int] = deque()
        # next-step mode: envs whose next step is EnvPool's reset step (the caller takes it)
        self._reset_next = np.zeros(num_envs, bool)
        self.next_step = next_step

    @property
    def next_step(self) -> bool:
        """EnvPool's own next-step autoreset (see the module's docstring); set it before :meth:`reset`."""
        return self._next_step

    @next_step.setter
    def next_step(self, on: bool) -> None:
        if on and self.async_batch != self.num_envs:
            raise FleetError(
                f"EnvPool's next-step autoreset (next_step=True, make_vec's NEXT_STEP) hands each env's reset step to the "
                f"caller as the step after its episode ends, which needs every env stepped together, and this EnvPool returns "
                f"the first {self.async_batch} of {self.num_envs} envs ready (async_batch={self.async_batch}). Leave "
                f"async_batch out (or set it to num_envs) for next_step=True, or keep next_step=False (same-step autoreset)."
            )
        if self._pools and bool(on) != getattr(self, "_next_step", False):
            raise FleetError("EnvPoolVectorEnv.next_step changes how the envs autoreset, and these envs have been reset in the "
                             "other mode already: pass next_step=... when you build the EnvPoolVectorEnv (or set it before its "
                             "first reset()).")
        self._next_step = bool(on)

    def split(self, count: int) -> list[np.ndarray]:
        """``count`` groups of env ids to step apart (synchronous sub-pools, built at the next ``reset``)."""
        if self.async_batch != self.num_envs:
            raise FleetError("split() steps fixed groups of envs; it does not combine with first-ready batches (async_batch).")
        if count != len(self._groups.ranges):
            self._groups = SubPools(self.num_envs, count)
            self._pools = close_pools(self._pools)
        return [np.arange(lo, hi) for lo, hi in self._groups.ranges]

    def _build(self, seed: int) -> None:
        self._pools = close_pools(self._pools)
        count = len(self._groups.ranges)
        threads = max(1, self._num_threads // count) if self._num_threads else 0
        for lo, hi in self._groups.ranges:
            batch = self.async_batch if self.async_batch != self.num_envs else hi - lo
            self._pools.append(self._envpool.make(self.task_id, env_type="gymnasium", seed=int(seed) + lo, num_envs=hi - lo,
                                                  batch_size=batch, num_threads=threads, **self._kwargs))

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
        self._reset_next[:] = False
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
        return concat_results([self.recv() for _ in self._pools])

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
        if self._next_step:  # an env shown ended keeps its last obs; its next step (the caller's) is its reset step
            ended = terminated | truncated
            self._reset_next[local + lo] = ended
            restart = restart & ~ended  # evaluation's lost life: its hidden reset step is still taken now
            for key in ("final_obs", "_final_obs"):  # obs is the last observation itself
                info.pop(key, None)
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
        acted = ~self._reset_next[ids]  # next-step mode: a reset step is no step of the next episode
        self._stats.add(raw[acted], ids[acted])
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
            self._held.update(zip(ids.tolist(), result_rows(*result)))
            if ended.any():
                done = ids[ended].astype(np.int32)
                pool.send(self._dummy_actions(len(done)), done)
                self._resetting[done] = True
            self._ready.extend(ids[~ended].tolist())
        batch = [self._ready.popleft() for _ in range(self.async_batch)]
        return (*concat_results([self._held.pop(env) for env in batch]), np.array(batch))

    def close(self) -> None:
        self._pools = close_pools(self._pools)
