"""The sampler: collects the rollouts the learner trains on, overlapping env stepping with acting or learning.

Modes (docs/sampling.md has what each guarantees and how to read the timings):

* **serial**: every env steps, then every env acts, in turn (CleanRL's loop).
* **split** (zero lag): the envs form two groups; one group steps while the other's actions are
  computed. Each env still steps exactly ``num_steps`` times a rollout, with the same weights and the
  same sampling noise as in the serial loop, so the batch is the serial loop's batch.
* **first-ready** (``--async-batch K``): each ``recv`` returns the first K envs ready, so a slow env
  does not idle the others. A rollout holds ``num_envs * num_steps`` transitions in arrival order,
  fast envs contributing more of them; GAE runs over each env's own trajectory.
* **lagged** (``--policy-lag 1``, combines with the above): a sampler thread collects rollout k+1 with
  the weights of k while the learner trains on k, so env stepping overlaps learning.

The algorithm writes the rollout loop itself, CleanRL's shape, as a function of the envs whose next action is due
(``Due``); the sampler decides which envs those are, steps them, and runs the function in the mode's thread::

    def rollout(steps):
        for due in steps:                                             # num_steps times every env: in turn, in two
            action, logprob, value = due.actor.act(due.obs, due.noise)  # groups, or the first K ready
            due.store(obs=due.obs, actions=action, logprobs=logprob, values=value)
            due.send(action)                                          # the envs step; rewards and dones are stored

    sampler = Sampler(envs, agent, num_steps, rollout=rollout, ...)
    buffer = sampler.collect()         # a filled RolloutBuffer (buffer.episodes, buffer.global_step, ...)
    ...                                # advantages and the update
    sampler.weights_updated()          # after the optimiser steps: the acting weights are refreshed
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any, Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.envs import episode_stats
from fleetrl.envs.vector import check_async_batch
from fleetrl.errors import FleetError
from fleetrl.monitor.timing import PhaseTimer
from fleetrl.nets import network_obs_dtype
from fleetrl.sampling.acting import choose_actor_device, make_actor
from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer
from fleetrl.sampling.rollout import RolloutBuffer

ACTOR_DEVICES = ("auto", "cpu", "learner")
ACTOR_PROBE_CALLS = 20  # timed acting calls per candidate device (after 3 warm-up calls): a few ms to a second
ACTING_THREADS = 1  # torch threads while acting: one step's batch gains little from more, and split/lag leave the rest to envs and learner (docs/sampling.md)
_POLL_S = 0.05  # how often a blocked sampler thread checks that it should stop
THREAD_JOIN_S = 60.0  # close() waits this long for the sampler thread (it stops within one env step)


class _Stopped(Exception):
    """Raised inside the sampler thread when the trainer closes the sampler."""


class TimedActor:
    """The acting copy of the agent, as the rollout loop calls it: ``act(obs, noise)`` and ``value(obs)``, timed as
    inference (fleetrl/sampling/acting.py holds the torch and numpy implementations)."""

    def __init__(self, actor: Any, timer: PhaseTimer):
        self._actor, self._timer = actor, timer

    def act(self, obs: np.ndarray, noise: np.ndarray | None = None, state: np.ndarray | None = None,
            starts: np.ndarray | None = None) -> tuple:
        """Actions sampled with ``noise``, their log-probabilities and the values of ``obs``; given a recurrent policy's
        ``state`` (and the episode ``starts``), also the states after the step."""
        with self._timer.inference:
            return self._actor.act(obs, noise) if state is None else self._actor.act(obs, noise, state, starts)

    def value(self, obs: np.ndarray, state: np.ndarray | None = None, starts: np.ndarray | None = None) -> np.ndarray:
        with self._timer.inference:
            return self._actor.value(obs) if state is None else self._actor.value(obs, state, starts)

    def greedy(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The greedy actions and values of ``obs`` (an agent acting from Q-values: PQN's), without a draw."""
        with self._timer.inference:
            return self._actor.greedy(obs)


class Due:
    """Envs whose next action is due, as the rollout loop sees them: their ids, observations (normalised where
    normalisation is on), the sampling noise drawn for them, and whether each observation starts an episode."""

    __slots__ = ("env_ids", "obs", "noise", "starts", "state", "actor", "_sampler", "_buffer", "_slot", "_sent")

    def __init__(self, sampler: "Sampler", env_ids: np.ndarray, obs: np.ndarray, noise: np.ndarray, buffer: RolloutBuffer,
                 slot: tuple):
        self.env_ids, self.obs, self.noise, self.actor = env_ids, obs, noise, sampler.timed_actor
        self.starts = sampler._episode_start[env_ids]
        # a recurrent policy's state per env, as the last step left it (the agent zeroes it where an episode starts)
        self.state = sampler._state[env_ids] if sampler._state is not None else None
        self._sampler, self._buffer, self._slot, self._sent = sampler, buffer, slot, False

    def store(self, **values: np.ndarray) -> None:
        """Store these envs' transitions' fields (``obs``, ``actions``, ``logprobs``, ``values``)."""
        for name, value in values.items():
            getattr(self._buffer, name)[self._slot] = value
        if self._buffer is self._sampler._pending:  # first-ready: acted now, moved into its row when the env returns
            self._sampler._pending_version[self.env_ids] = self._sampler.acting_version

    def keep_state(self, state: np.ndarray) -> None:
        """A recurrent policy's state after this step, carried to these envs' next one (and across rollouts)."""
        self._sampler._state[self.env_ids] = state

    def send(self, actions: np.ndarray) -> None:
        """Step these envs with ``actions`` (clipped to a Box's bounds); their results complete the transitions."""
        clip = self._sampler._clip
        self._sampler._send(actions if clip is None else np.clip(actions, *clip), self.env_ids)
        self._sent = True


class Sampler:
    """Owns the vector envs, the acting copy of the weights, the rollout buffers and the sampling RNG.

    ``agent``: the learner's network (called as ``agent(x) -> (actor output, value)``, see acting.py).
    ``device``: the learner's device; ``actor_device``: cpu, learner, or auto (measured once on this machine, cached;
    ``saved_actor_device``: a resumed checkpoint's choice, kept; ``acts_on`` says what to remember of it).
    ``async_batch``: first-ready batches of K envs when below ``num_envs``; ``split``: None chooses the
    zero-lag split where it runs exactly (tests force it with True). ``global_envs``: the envs of all
    ranks (episodes are tagged with the global step). ``seed`` seeds the sampling noise, ``env_seed``
    the envs.
    """

    def __init__(
        self,
        envs: Any,
        agent: nn.Module,
        num_steps: int,
        *,
        rollout: Callable[[Iterable[Due]], None],
        device: torch.device,
        seed: int,
        env_seed: int | None,
        timer: PhaseTimer,
        actor_device: str = "auto",
        saved_actor_device: str | None = None,
        policy_lag: int = 0,
        async_batch: int | None = None,
        split: bool | None = None,
        obs_norm: ObsNormalizer | None = None,
        reward_norm: RewardNormalizer | None = None,
        global_step: int = 0,
        global_envs: int | None = None,
        acting_threads: int = ACTING_THREADS,
        keep_next_obs: bool = False,
        verbose: bool = False,
    ):
        check_actor_device(actor_device)
        self.envs, self.agent, self.timer, self.rollout = envs, agent, timer, rollout
        self.num_envs, self.num_steps = envs.num_envs, num_steps
        self.lagged = policy_lag == 1
        self.obs_norm, self.reward_norm = obs_norm, reward_norm
        self.env_seed = env_seed
        self.acting_threads = acting_threads
        self.keep_next_obs = keep_next_obs  # rollouts keep what RolloutBuffer.next_obs needs (PPO-RND's curiosity)
        self._global_envs = global_envs or self.num_envs
        self._step = global_step

        self.mode, self.groups, mode_reason = self._choose_mode(async_batch, split)
        self.async_batch = self.num_envs if async_batch is None else async_batch
        if self.lagged:  # the sampler thread runs no collective: statistics merge once an iteration (normalize.py)
            for norm in (obs_norm, reward_norm):
                if norm is not None:
                    norm.defer()

        # the acting weights: the learner's module itself, or a copy that is only ever replaced whole
        # between rollouts (on another device, or while the learner trains on with --policy-lag 1)
        self.actor_device, device_reason, self.acts_on = self._choose_actor_device(actor_device, device, saved_actor_device)
        same = self.actor_device == device and not self.lagged
        self.acting_agent = agent if same else copy.deepcopy(agent).to(self.actor_device)
        self.actor = make_actor(self.acting_agent, self.actor_device, seed=seed)
        self.timed_actor = TimedActor(self.actor, timer)
        self.version = 0  # learner updates published so far (weights_updated calls)
        self.acting_version = 0  # the version the acting weights hold
        self._lag = 0
        if verbose:
            print(f"sampling: {mode_reason}{'; collected one update behind the learner (--policy-lag 1)' if self.lagged else ''}; "
                  f"acting on {self.actor_device} ({device_reason})", flush=True)

        # storage: one rollout buffer, or two that the sampler thread and the learner take turns with
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        obs_dtype = network_obs_dtype(obs_space.shape, obs_space.dtype)  # uint8 images stay compact; vectors are float32
        first_ready = self.mode == "first-ready"
        rows, cols = (self.num_envs * num_steps // self.async_batch, self.async_batch) if first_ready else (num_steps, self.num_envs)
        state_shape = getattr(agent, "state_shape", None)  # a recurrent policy carries a state per env
        self._buffers = [RolloutBuffer(rows, cols, obs_space.shape, obs_dtype, act_space.shape, act_space.dtype,
                                       total_envs=self.num_envs if first_ready else None, state_shape=state_shape)
                         for _ in range(2 if self.lagged else 1)]
        # per env: the transition acted on and not yet completed by the env's step result
        self._pending = RolloutBuffer(1, self.num_envs, obs_space.shape, obs_dtype, act_space.shape, act_space.dtype,
                                      state_shape=state_shape)
        self._state = None if state_shape is None else np.zeros((self.num_envs, *state_shape), np.float32)
        self._pending_version = np.zeros(self.num_envs)  # the weights' version that acted on each pending transition
        self._next_obs = np.zeros((self.num_envs, *obs_space.shape), obs_dtype)
        self._episode_start = np.ones(self.num_envs, bool)  # per env: its next observation begins an episode
        self._live = np.ones(self.num_envs, bool)  # per row: its next observation is a live agent's (PettingZoo games)
        self._agents = getattr(envs, "agent_rows", None)  # a game's agents: each episode is tagged with its agent's index
        self._clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        self._to_step: np.ndarray | None = None
        self._started = False
        self._in_flight = False  # first-ready: every env has been sent an action (they stay in flight)
        self._current: RolloutBuffer | None = None  # the rollout the learner holds

        # --policy-lag 1: the sampler thread and its queues (started by the first collect)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._free: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        self._published: queue.Queue = queue.Queue(maxsize=1)  # the learner's next weights, one version at a time

    # ---------------------------------------------------------------- the learner's calls
    def collect(self) -> RolloutBuffer:
        """The next rollout: ``num_envs * num_steps`` transitions, their episodes and the bootstrap values."""
        if not self.lagged:
            with _torch_threads(self.acting_threads):  # the learner's own threads come back for the update
                self._start()
                rollout = self._fill(self._buffers[0])
        else:
            if self._thread is None:
                self._start_thread()
            if self._current is not None:
                self._free.put(self._current)  # the learner is done with the previous rollout
            with self.timer.wait:
                rollout = self._ready.get()
            if isinstance(rollout, BaseException):
                raise rollout
        self._current = rollout
        self._lag = self.version - rollout.acting_version
        return rollout

    def _start_thread(self) -> None:
        """--policy-lag 1: the sampler thread starts collecting into the free buffers."""
        for buffer in self._buffers:
            self._free.put(buffer)
        self._thread = threading.Thread(target=self._run, name="fleetrl-sampler", daemon=True)
        self._thread.start()

    def weights_updated(self) -> None:
        """After the optimiser steps: publish the new weights (versioned) for the next rollout to act with."""
        self.version += 1
        if self.lagged:
            stats = self._merge_statistics(self._current)  # the trainer thread runs the collectives
            weights = [t.detach().to(self.actor_device, copy=True) for t in self.agent.state_dict().values()]
            self._put(self._published, (self.version, weights, stats))
        elif self.acting_agent is not self.agent:
            self._load_weights([t.detach() for t in self.agent.state_dict().values()])
            self.acting_version = self.version
        else:
            self.acting_version = self.version

    @property
    def policy_lag(self) -> float:
        """Learner updates between the weights that acted in the latest rollout and the weights that train on it,
        averaged over its transitions: 0 in the serial and split loops, 1 with --policy-lag 1, and a fraction more
        with first-ready batches, whose rollouts open with one transition per env acted on before the last update."""
        return self._lag

    def state_dict(self) -> dict[str, Any]:
        """The sampling RNG as it was after the latest rollout the learner got (what a resumed run continues from)."""
        return self._current.actor_state if self._current is not None else self.actor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state)
        if self._state is not None and "recurrent_state" in state:
            self._state[:] = state["recurrent_state"].numpy()
            self._episode_start[:] = state["episode_start"].numpy()

    def close(self) -> None:
        """Stop the sampler thread (within one env step), then close the envs. A thread that does not stop (an env
        step that hangs) keeps its envs: closing them under it would fail in it; the process's exit closes both."""
        self._stopping = True
        if self._thread is not None:
            self._thread.join(timeout=THREAD_JOIN_S)
            if self._thread.is_alive():
                print(f"fleetrl: warning: the sampler thread did not stop within {THREAD_JOIN_S:g} s (an env step hangs?); "
                      f"its envs are left to close when the process exits.", file=sys.stderr, flush=True)
                return
        self.envs.close()

    # ---------------------------------------------------------------- choices made at start
    def _choose_mode(self, async_batch: int | None, split: bool | None) -> tuple[str, list[slice], str]:
        n = self.num_envs
        everyone = [slice(0, n)]
        if async_batch is not None and async_batch < n:
            if getattr(self.envs, "async_batch", n) != async_batch:  # envs built without first-ready batches (or others)
                check_async_batch(n, async_batch, "sync" if getattr(self.envs, "async_batch", n) == n else "async")
                raise FleetError(f"The envs return first-ready batches of {self.envs.async_batch}, not --async-batch {async_batch}.")
            return "first-ready", everyone, f"first-ready batches of {async_batch} of {n} envs"
        if split is False or n < 2 or async_batch == n:
            why = " (--async-batch = --num-envs)" if async_batch == n else " (one env)" if n < 2 else ""
            return "serial", everyone, "serial" + why
        if split is None:
            if not getattr(self.envs, "steps_in_background", False):
                return "serial", everyone, f"serial (the {getattr(self.envs, 'backend', 'sync')} backend steps envs only when asked)"
            if self.obs_norm is not None and not self.lagged:
                # an exact split would need every env's statistics of a step before the first env's next action
                return "serial", everyone, "serial (observation normalisation updates every step)"
        groups = self.envs.split(2)  # before the envs are reset: a native backend builds one pool per group
        if len(groups) < 2:
            return "serial", everyone, "serial (the envs step as one group)"
        slices = [slice(int(g[0]), int(g[-1]) + 1) for g in groups]
        if any(s.stop - s.start != len(g) for s, g in zip(slices, groups)):
            raise FleetError("split() must return contiguous groups of env ids.")
        sizes = "+".join(str(s.stop - s.start) for s in slices)
        return "split", slices, f"split into {sizes} envs stepping while the other group acts (zero lag: the serial loop's batch)"

    def _choose_actor_device(self, choice: str, learner: torch.device, saved: str | None) -> tuple[torch.device, str, str]:
        batch = max(s.stop - s.start for s in self.groups) if self.mode != "first-ready" else self.async_batch
        space = self.envs.single_observation_space
        obs = np.zeros((batch, *space.shape), network_obs_dtype(space.shape, space.dtype))

        def key() -> str:
            from fleetrl.accel import cache_key

            with _torch_threads(self.acting_threads):  # as acting will run
                return cache_key(self.agent, ["acting on cpu", "acting on learner"], obs, learner)

        return choose_actor_device(choice, learner, lambda d: self._time_acting(d, obs), key, saved, f"acting on {batch} envs")

    def _time_acting(self, device: torch.device, obs: np.ndarray) -> float:
        """Median seconds of one acting call on ``device`` for ``obs``, on a throwaway copy of the network."""
        agent = copy.deepcopy(self.agent).to(device)
        actor = make_actor(agent, device, seed=0)
        batch = len(obs)
        times = []
        with _torch_threads(self.acting_threads):  # as acting will run
            for _ in range(3 + ACTOR_PROBE_CALLS):
                start = time.perf_counter()
                state = getattr(self.agent, "state_shape", None)  # a recurrent agent acts from each env's state
                args = () if state is None else (None, np.zeros((batch, *state), np.float32))
                actor.act(obs, *args)  # the result comes back to the host, so this includes the device's sync
                times.append(time.perf_counter() - start)
        return float(np.median(times[3:]))

    # ---------------------------------------------------------------- filling a rollout
    def begin(self, obs: np.ndarray) -> None:
        """Start the first rollout from ``obs``, the envs' observations after steps taken outside the sampler (PPO-RND's
        random-action start), instead of resetting them again (EnvPool rebuilds its pools at every reset)."""
        self._started = True
        self._next_obs[:] = self.obs_norm(obs) if self.obs_norm is not None else obs

    def _start(self) -> None:
        """Reset the envs once; first-ready sampling then keeps every env in flight across rollouts."""
        if self._started:
            return
        self._started = True
        obs, _ = self.envs.reset(seed=self.env_seed)
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        self._next_obs[:] = obs

    def _fill(self, b: RolloutBuffer) -> RolloutBuffer:
        """Run the algorithm's rollout loop over the envs as this mode schedules them, filling ``b``."""
        self.acting_agent.eval()
        b.episodes, b.policy_version, b.final_obs = [], self.acting_version, []
        start = self._step
        steps = self._due_first_ready(b, start) if self.mode == "first-ready" else self._due_in_turns(b, start)
        self.rollout(steps)
        if next(steps, None) is not None:
            raise FleetError("The rollout loop stopped before the rollout was full: it must take every group of envs it is given.")
        self._step = start + self.num_steps * self._global_envs
        b.global_step = self._step
        b.actor_state = self.actor.state_dict()
        if self._state is not None:  # the recurrent state in flight, as of this rollout's end (what a resume continues)
            b.actor_state = {**b.actor_state, "recurrent_state": torch.from_numpy(self._state.copy()),
                             "episode_start": torch.from_numpy(self._episode_start.copy())}
        if self.lagged:
            b.norm_sums = [norm.take_pending() if norm is not None else None for norm in (self.obs_norm, self.reward_norm)]
        return b

    def _due(self, env_ids: np.ndarray, obs: np.ndarray, noise: np.ndarray, buffer: RolloutBuffer, slot: tuple) -> Iterator[Due]:
        """Hand the rollout loop one group of envs; it must have sent them their actions when it asks for the next."""
        due = Due(self, env_ids, obs, noise, buffer, slot)
        yield due
        if not due._sent:
            raise FleetError("The rollout loop took envs whose action was due and did not call due.send(actions): every env "
                             "it is given must be stepped before the next are due.")

    def _due_in_turns(self, b: RolloutBuffer, start: int) -> Iterator[Due]:
        """Serial (one group) or split (two): row t is step t and every env steps ``num_steps`` times.

        The noise of a step is drawn once for all envs, and each group acts with its slice of it, so
        the split gives the serial loop's actions. While one group steps, the other acts.
        """
        ids = [np.arange(g.start, g.stop) for g in self.groups]
        noise = self._noise(self.num_envs)
        for g, env_ids in zip(self.groups, ids):
            yield from self._due(env_ids, self._next_obs[g], noise[g], b, (0, g))
        for t in range(self.num_steps):
            noise = self._noise(self.num_envs) if t + 1 < self.num_steps else None
            tag = start + (t + 1) * self._global_envs  # the global step at the end of step t, as CleanRL counts
            for g, env_ids in zip(self.groups, ids):
                obs = self._complete(b, (t, g), env_ids, self._recv(env_ids), tag)
                if noise is not None:
                    yield from self._due(env_ids, obs, noise[g], b, (t + 1, g))
                else:
                    self._next_obs[g] = obs
        b.last_values[:] = self.timed_actor.value(self._next_obs, self._state, self._episode_start)
        if self.keep_next_obs:
            b.last_obs = self._next_obs.copy()
        b.acting_version = float(self.acting_version)

    def _due_first_ready(self, b: RolloutBuffer, start: int) -> Iterator[Due]:
        """Row r is the r-th batch that arrived. Every env stays in flight across rollouts: an env's last
        transition here bootstraps from the value of its next observation, already acted on, and that
        action's transition opens the env's trajectory in the next rollout."""
        if not self._in_flight:  # the first rollout: every env acts once before any can arrive
            self._in_flight = True
            everyone = np.arange(self.num_envs)
            yield from self._due(everyone, self._next_obs, self._noise(self.num_envs), self._pending, (0, everyone))
        acted = 0.0  # the versions that acted on this rollout's transitions, summed
        for r in range(b.num_steps):
            *result, env_ids = self._recv(None)
            tag = start + ((r + 1) * self.async_batch * self._global_envs) // self.num_envs
            acted += float(self._pending_version[env_ids].sum())
            obs = self._complete(b, (r, slice(None)), env_ids, result, tag, pending=True)
            b.env_ids[r] = env_ids
            yield from self._due(env_ids, obs, self._noise(len(env_ids)), self._pending, (0, env_ids))
        b.last_values[:] = self._pending.values[0]
        b.acting_version = acted / (b.num_steps * b.num_envs)

    def _noise(self, n: int) -> np.ndarray:
        with self.timer.inference:
            return self.actor.noise(n)

    def _complete(self, b: RolloutBuffer, slot: tuple, ids: np.ndarray, result: tuple, tag: int, pending: bool = False) -> np.ndarray:
        """Complete envs ``ids``' transitions at ``slot`` with their step result (moving them there from the
        pending ones first, with ``pending``); returns their next observations (normalised)."""
        obs, reward, terminated, truncated, info = result[:5]
        done = terminated | truncated
        acted = self._live[ids]  # False: an agent that had left its game acted on a blank row, not a transition
        # --normalize's statistics count live rows only (the blank rows of PettingZoo agents that left are zeros)
        if self.reward_norm is not None:
            reward = self.reward_norm(reward, done, ids, live=None if acted.all() else acted)
        if self.obs_norm is not None:
            obs = self.obs_norm(obs, live=info["live"] if "live" in info else None)
        if pending:  # the transitions acted on when these envs were last sent, now in their row
            for name in ("obs", "actions", "logprobs", "values", "states", "starts"):
                if hasattr(b, name):
                    getattr(b, name)[slot] = getattr(self._pending, name)[0, ids]
        b.rewards[slot], b.terminated[slot], b.dones[slot] = reward, terminated, done
        b.live[slot] = acted
        self._live[ids] = info["live"] if "live" in info else True
        self._episode_start[ids] = done
        final_values = np.zeros(len(done), np.float32)
        if truncated.any():  # bootstrap a time limit from the value of the final observation
            final_obs = info["final_obs"][truncated]
            if self.obs_norm is not None:
                final_obs = self.obs_norm.normalize(final_obs)
            state = None if self._state is None else self._state[ids[truncated]]  # after the step that ended the episode
            final_values[truncated] = self.timed_actor.value(final_obs, state)
        b.final_values[slot] = final_values
        if self.keep_next_obs and done.any():  # the episodes' last observations (the next rows hold their successors' first)
            final_obs = np.stack(list(info["final_obs"][done]))
            b.final_obs.append((slot[0], ids[done], self.obs_norm.normalize(final_obs) if self.obs_norm is not None else final_obs))
        b.episodes += [(tag, *stats) for stats in episode_stats(info, *(("agent",) if self._agents else ()))]
        return obs

    def _send(self, actions: np.ndarray, ids: np.ndarray) -> None:
        if self.mode == "serial":
            self._to_step = actions  # stepped by the next _recv
            return
        with self.timer.env:
            self.envs.send(actions, ids)

    def _recv(self, ids: np.ndarray | None) -> tuple:
        if self._stopping:
            raise _Stopped
        with self.timer.env:
            if self.mode == "serial":
                return self.envs.step(self._to_step)
            return self.envs.recv(ids)

    # ---------------------------------------------------------------- --policy-lag 1
    def _run(self) -> None:
        """The sampler thread: rollout k+1 acts with the weights (and statistics) published after update k-1."""
        torch.set_num_threads(self.acting_threads)  # per thread: the learner keeps its own
        try:
            self._start()
            for rollout in range(1, 1 << 62):
                buffer = self._take(self._free)
                if rollout >= 3:  # rollouts 1 and 2 act with the initial weights, as in Cleanba
                    self._apply(*self._take(self._published))
                self._ready.put(self._fill(buffer))
        except _Stopped:
            pass
        except BaseException as exc:  # an env error reaches the learner at its next collect()
            self._ready.put(exc)

    def _take(self, q: queue.Queue) -> Any:
        while True:
            if self._stopping:
                raise _Stopped
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                pass

    def _put(self, q: queue.Queue, item: Any) -> None:
        while not self._stopping:
            if self._thread is not None and not self._thread.is_alive():
                return  # the thread failed; the learner hears of it at its next collect()
            try:
                q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                pass

    def _merge_statistics(self, rollout: RolloutBuffer | None) -> list:
        """Merge the rollout's normalisation sums (all-reduced over ranks): the statistics to act with next."""
        stats = []
        for norm, sums in zip((self.obs_norm, self.reward_norm), rollout.norm_sums if rollout is not None else (None, None)):
            if norm is not None:
                if sums is not None:
                    norm.merge(sums)
                stats.append(norm.acting_stats())
            else:
                stats.append(None)
        return stats

    def _apply(self, version: int, weights: list[torch.Tensor], stats: list) -> None:
        """Sampler thread, between rollouts: swap in a published version of the weights and statistics."""
        self._load_weights(weights)
        for norm, s in zip((self.obs_norm, self.reward_norm), stats):
            if norm is not None:
                norm.use_stats(s)
        self.acting_version = version

    def _load_weights(self, weights: list[torch.Tensor]) -> None:
        # in place, so the numpy actor's views of the acting copy's parameters stay valid
        with torch.no_grad():
            for dst, src in zip(self.acting_agent.state_dict().values(), weights):
                dst.copy_(src, non_blocking=False)


def check_actor_device(actor_device: str) -> None:
    if actor_device not in ACTOR_DEVICES:
        raise FleetError(f"Unknown --actor-device {actor_device!r}; choose one of: {', '.join(ACTOR_DEVICES)}.")


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op threads for this thread, for the block only (set per thread: OpenMP)."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def local_async_batch(async_batch: int | None, num_envs: int, local_num_envs: int) -> int | None:
    """This process's share of ``--async-batch`` (a share of ``--num-envs`` under torchrun, as the envs are)."""
    if async_batch is None:
        return None
    batch, rest = divmod(async_batch * local_num_envs, num_envs)
    if rest or batch < 1:
        raise FleetError(
            f"--async-batch {async_batch} of --num-envs {num_envs} does not split evenly over the processes "
            f"({local_num_envs} envs here); choose --num-envs and --async-batch that both divide by the process count."
        )
    return batch
