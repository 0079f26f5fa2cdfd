"""Measurements of an env before training: what one step costs (wall time, and how much of it is CPU), whether copies
of it may step from several threads at once, and a random-action stepper of vector envs. ``--env-backend auto``, the
stepping plan (:mod:`fleetrl.envs.stepping`) and ``fleetrl bench-env`` are built on them."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.registry import EnvFactory, EnvFamily
from fleetrl.errors import EnvOutputError, FleetError

PROBE_SECONDS = 1.0  # the longest a step probe runs (it stops earlier at PROBE_MAX_STEPS)
PROBE_MAX_STEPS = 2000
THREAD_CHECK_STEPS = 12  # steps each copy takes in the thread-safety check


@dataclass(frozen=True)
class StepCost:
    """One env step, measured in the trainer's process with random actions: its wall time (median) and the CPU time
    the stepping thread used (mean). A step whose CPU share is low waits: on a simulator, a socket, a sleep."""

    wall_us: float
    cpu_us: float
    steps: int

    @property
    def cpu_share(self) -> float:
        return min(1.0, self.cpu_us / self.wall_us) if self.wall_us > 0 else 1.0

    def describe(self) -> str:
        """e.g. ``one step takes 5,120 us, 4% of it CPU``."""
        return f"one step takes {self.wall_us:,.0f} us, {self.cpu_share:.0%} of it CPU"


def random_actions(space: gym.Space, count: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=count)
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high, size=(count, *space.shape)).astype(space.dtype)
    raise FleetError(f"fleetrl cannot sample random actions of {space} to measure the env; choose --env-backend yourself.")


def measure_step(env_id: str, family: EnvFamily, seconds: float = PROBE_SECONDS) -> StepCost:
    """What one step of ``env_id`` costs (resets excluded), from at most ``seconds`` of stepping one copy. An env that
    raises after some steps is measured on those (training meets the error in its own envs, which the async backend
    restarts); one that raises before its first step ends here with a clear error."""
    env = EnvFactory(env_id, family.name)()
    walls, cpu = [], 0.0
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(walls) < PROBE_MAX_STEPS:
            action = env.action_space.sample()
            c0, t0 = time.thread_time(), time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            walls.append(time.perf_counter() - t0)
            cpu += time.thread_time() - c0
            if terminated or truncated:
                env.reset()
    except EnvOutputError as exc:  # a NaN or a wrong shape: the env is at fault whichever backend runs it
        raise EnvOutputError(f"{exc} (Found while fleetrl timed the env's steps with random actions before training, to choose "
                             f"--env-backend auto and the env workers.)") from None
    except Exception as exc:  # noqa: BLE001 - the env's own error: said in one paragraph, or measured around
        if not walls:
            raise FleetError(f"The env {env_id} raised before its first step was done, while fleetrl timed it before training: "
                             f"{type(exc).__name__}: {exc}. Fix the env (it must reset and step with random actions), or "
                             f"choose --env-backend and, for async, --env-workers and --env-threads yourself.") from None
    finally:
        env.close()
    return StepCost(float(np.median(walls) * 1e6), cpu / len(walls) * 1e6, len(walls))


def declared_thread_safe(env: gym.Env) -> bool | None:
    """What the env says in ``metadata["thread_safe"]`` (True or False), or None when it says nothing."""
    value = (getattr(env, "metadata", None) or {}).get("thread_safe")
    return None if value is None else bool(value)


def steps_alike_in_threads(env_id: str, family: EnvFamily, steps: int = THREAD_CHECK_STEPS) -> bool | None:
    """Whether two copies stepped at once from two threads give exactly what one copy gives alone, for the same seed
    and actions (True), or not (False: state shared between copies, as in a C library with globals). None when two
    runs alone already differ: the env is not reproducible, so the check cannot tell."""
    copies = [EnvFactory(env_id, family.name)() for _ in range(3)]
    try:
        copies[0].action_space.seed(0)
        actions = [copies[0].action_space.sample() for _ in range(steps)]
        try:
            alone = [_trajectory(copies[0], actions), _trajectory(copies[0], actions)]
        except Exception:  # noqa: BLE001 - an env that fails alone cannot be checked here; training meets its error
            return None
        if not _same(*alone):
            return None
        together: list[Any] = [None, None]
        start = threading.Barrier(2)

        def run(k: int) -> None:
            try:
                start.wait(timeout=30)
                together[k] = _trajectory(copies[k + 1], actions)
            except Exception as exc:  # noqa: BLE001 - an env that breaks when stepped beside another is not thread-safe
                together[k] = exc

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return all(not isinstance(t, Exception) and _same(alone[0], t) for t in together)
    finally:
        for env in copies:
            env.close()


def _trajectory(env: gym.Env, actions: list[Any]) -> list[tuple]:
    out = [(np.array(env.reset(seed=0)[0], copy=True),)]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((np.array(obs, copy=True), float(reward), bool(terminated), bool(truncated)))
        if terminated or truncated:
            out.append((np.array(env.reset()[0], copy=True),))
    return out


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))


class RandomStepper:
    """Steps a vector env with random actions: by ``step``, or by ``send``/``recv``.

    ``groups``: env-id groups (from ``envs.split``) sent in turn, each received by its ids before it is
    sent again: the zero-lag sampler's halves. Each :meth:`run` sends them all first and receives
    them all before it returns, so no work done between runs is counted. ``first_ready``: every env
    stays in flight and each ``recv`` takes the first batch ready (EnvPool's async model,
    ``async_batch`` < ``num_envs``); meant for one long run after a warm-up.
    """

    def __init__(self, envs: Any, rng: np.random.Generator, groups: list[np.ndarray] | None = None, first_ready: bool = False):
        self.envs, self.groups, self.first_ready = envs, groups, first_ready
        self._actions = [random_actions(envs.single_action_space, envs.num_envs, rng) for _ in range(16)]
        self._i = 0
        self._primed = False  # first-ready: every env has been sent once

    def _next_actions(self) -> np.ndarray:
        self._i += 1
        return self._actions[self._i % 16]

    def run(self, seconds: float, min_batches: int = 1) -> int:
        """Step for ``seconds`` (at least ``min_batches`` batches); returns the env steps taken."""
        envs, steps, batches = self.envs, 0, 0
        deadline = time.perf_counter() + seconds
        if self.groups:
            sent = deque(self.groups)
            for ids in sent:
                envs.send(self._next_actions()[: len(ids)], ids)
            while sent:
                ids = sent.popleft()
                envs.recv(ids)
                steps += len(ids)
                batches += 1
                if batches < min_batches or time.perf_counter() < deadline:
                    envs.send(self._next_actions()[: len(ids)], ids)
                    sent.append(ids)
            return steps
        if self.first_ready and not self._primed:
            envs.send(self._actions[0], np.arange(envs.num_envs))
            self._primed = True
        while batches < min_batches or time.perf_counter() < deadline:
            if self.first_ready:
                *_, ids = envs.recv()
                envs.send(self._next_actions()[: len(ids)], ids)
                steps += len(ids)
            else:
                envs.step(self._next_actions())
                steps += envs.num_envs
            batches += 1
        return steps
