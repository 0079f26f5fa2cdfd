"""The start-up probes of an env, before training: what one step costs (wall time, and how much of it is CPU), and whether
copies of it may step from several threads at once. ``--env-backend auto`` and the stepping plan
(:mod:`fleetrl.envs.stepping`) are built on them; ``fleetrl bench-env`` (fleetrl/tools/bench_env.py) uses them too.

Every probe is bounded as training is: each call of the env (a step or a reset) gets ``--env-timeout`` seconds, its
construction at least ``MIN_BUILD_TIMEOUT_S`` (as the async backend's workers get). The probe runs in a thread of its
own, and the caller stops waiting for it when one call overruns: a hung env then ends the start with a clear error or
a safe choice, with the reason, instead of hanging it. The hung thread is left with the probe's copies of the env
until the process exits (a thread cannot be killed).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from fleetrl.envs.bounded import ProbeHung, Watch, run_bounded  # noqa: F401 - the probes' deadlines, below the registry
from fleetrl.envs.registry import EnvFactory, EnvFamily
from fleetrl.envs.wrappers import game_over
from fleetrl.errors import EnvOutputError, FleetError

PROBE_SECONDS = 1.0  # the longest a step probe runs (it stops earlier at PROBE_MAX_STEPS)
PROBE_MAX_STEPS = 2000
THREAD_CHECK_STEPS = 12  # steps each copy takes in the thread-safety check
ENV_TIMEOUT_S = 60.0  # what one env call of a probe may take when the caller gives no --env-timeout (its default)


class ProbeFailed(FleetError):
    """The env raised in a probe where the probe cannot measure around it (the thread-safety check's runs alone)."""


@dataclass(frozen=True)
class StepCost:
    """One env step, measured in the trainer's process with random actions: its wall time (median) and the CPU time
    the stepping thread used (mean). A step whose CPU share is low waits: on a simulator, a socket, a sleep."""

    wall_us: float
    cpu_us: float
    steps: int
    note: str = ""  # what cut the measurement short, said with it

    @property
    def cpu_share(self) -> float:
        return min(1.0, self.cpu_us / self.wall_us) if self.wall_us > 0 else 1.0

    def describe(self) -> str:
        """e.g. ``one step takes 5,120 us, 4% of it CPU``."""
        return f"one step takes {self.wall_us:,.0f} us, {self.cpu_share:.0%} of it CPU" + (f" ({self.note})" if self.note else "")


def measure_step(env_id: str, family: EnvFamily, seconds: float = PROBE_SECONDS, env_timeout: float | None = ENV_TIMEOUT_S,
                 make_env: Callable[[], gym.Env] | None = None) -> StepCost:
    """What one step of ``env_id`` costs (resets excluded), from at most ``seconds`` of stepping one copy. An env that
    raises or hangs (no answer within ``env_timeout``, the flag) after some steps is measured on those, and the cost
    says so (training meets the error in its own envs, which the async backend restarts); one that raises or hangs
    before its first step ends here with a clear error. ``make_env``: builds the copy instead of ``env_id``'s factory
    (make_vec's env functions; ``env_id`` then only names it)."""
    walls: list[float] = []
    cpu: list[float] = []

    def probe(watch: Watch) -> None:
        env = watch.call("construction", make_env or EnvFactory(env_id, family.name))
        try:
            watch.call("reset", env.reset, seed=0)
            env.action_space.seed(0)
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline and len(walls) < PROBE_MAX_STEPS:
                action = env.action_space.sample()
                c0, t0 = time.thread_time(), time.perf_counter()
                _, _, terminated, truncated, _ = watch.call("step", env.step, action)
                walls.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
                if game_over(terminated, truncated):  # a PettingZoo game's flags are per agent: over when every agent is done
                    watch.call("reset", env.reset)
        finally:
            watch.call("close", env.close)

    how_to_skip = ("choose --env-backend and, for async, --env-workers and --env-threads yourself (nothing is measured then, "
                   "and the async backend restarts a worker whose env hangs)")
    note = ""
    try:
        run_bounded(probe, env_timeout, name="fleetrl-step-probe")
    except EnvOutputError as exc:  # a NaN or a wrong shape: the env is at fault whichever backend runs it
        raise EnvOutputError(f"{exc} (Found while fleetrl timed the env's steps with random actions before training, to choose "
                             f"--env-backend auto and the env workers.)") from None
    except ProbeHung as exc:
        if not walls:
            raise FleetError(f"The env {env_id} hung while fleetrl timed it before training: {exc} (--env-timeout). Fix the "
                             f"env (it must build, reset and step with random actions), raise --env-timeout if it really takes "
                             f"that long, or {how_to_skip}.") from None
        note = f"measured on {len(walls)} steps: then {exc}"
        print(f"fleetrl: warning: the env {env_id} hung while fleetrl timed it before training: {exc} (--env-timeout); "
              f"its cost is measured on the {len(walls)} steps before.", file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - the env's own error: said in one paragraph, or measured around
        if not walls:
            raise FleetError(f"The env {env_id} raised before its first step was done, while fleetrl timed it before training: "
                             f"{type(exc).__name__}: {exc}. Fix the env (it must reset and step with random actions), or "
                             f"{how_to_skip}.") from None
        # a choice resting on a few steps must say so where it is printed (the backend's and the plan's reason)
        note = f"measured on {len(walls)} steps: then it raised {type(exc).__name__}: {exc}"
        print(f"fleetrl: warning: the env {env_id} raised while fleetrl timed it before training ({type(exc).__name__}: {exc}); "
              f"its cost is measured on the {len(walls)} steps before.", file=sys.stderr, flush=True)
    walls, cpu = walls[: len(cpu)], cpu[: len(walls)]  # (a step the probe was in when it was left: one list may be ahead)
    return StepCost(float(np.median(walls) * 1e6), sum(cpu) / len(walls) * 1e6, len(walls), note)


def declared_thread_safe(env: gym.Env) -> bool | None:
    """What the env says in ``metadata["thread_safe"]`` (True or False), or None when it says nothing."""
    value = (getattr(env, "metadata", None) or {}).get("thread_safe")
    return None if value is None else bool(value)


def steps_alike_in_threads(env_id: str, family: EnvFamily, steps: int = THREAD_CHECK_STEPS,
                           env_timeout: float | None = ENV_TIMEOUT_S, make_env: Callable[[], gym.Env] | None = None) -> bool | None:
    """Whether two copies stepped at once from two threads give exactly what one copy gives alone, for the same seed
    and actions (True), or not (False: state shared between copies, as in a C library with globals). None when two
    runs alone already differ: the env is not reproducible, so the check cannot tell. Raises :class:`ProbeHung` when
    an env call takes longer than ``env_timeout`` (its construction at least the workers' build time), and
    :class:`ProbeFailed` when one copy stepped alone raises (so nothing could be compared)."""
    make = make_env or EnvFactory(env_id, family.name)
    return run_bounded(lambda watch: _steps_alike_in_threads(make, steps, watch), env_timeout, name="fleetrl-thread-check")


def _steps_alike_in_threads(make_env: Callable[[], gym.Env], steps: int, watch: Watch) -> bool | None:
    copies: list[gym.Env] = []
    try:
        for _ in range(3):
            copies.append(watch.call("construction", make_env))
        copies[0].action_space.seed(0)
        actions = [copies[0].action_space.sample() for _ in range(steps)]
        try:
            alone = [_trajectory(copies[0], actions, watch), _trajectory(copies[0], actions, watch)]
        except Exception as exc:  # noqa: BLE001 - an env that fails alone cannot be checked; the reason says so
            raise ProbeFailed(f"one copy stepped alone raised {type(exc).__name__}: {exc}") from None
        if not _same(*alone):
            return None
        together: list[Any] = [None, None]
        start = threading.Barrier(2)

        def run(k: int) -> None:
            try:
                start.wait(timeout=30)
                together[k] = _trajectory(copies[k + 1], actions, watch)
            except Exception as exc:  # noqa: BLE001 - an env that breaks when stepped beside another is not thread-safe
                together[k] = exc

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()  # bounded by the watch: run_bounded leaves this thread when a copy's call is overdue
        return all(not isinstance(t, Exception) and _same(alone[0], t) for t in together)
    finally:
        for env in copies:
            watch.call("close", env.close)


def _trajectory(env: gym.Env, actions: list[Any], watch: Watch) -> list[tuple]:
    out = [(np.array(watch.call("reset", env.reset, seed=0)[0], copy=True),)]
    for action in actions:
        obs, reward, terminated, truncated, _ = watch.call("step", env.step, action)
        # arrays, not float()/bool(): a PettingZoo game gives a reward and a pair of flags per agent
        out.append(tuple(np.array(x, copy=True) for x in (obs, reward, terminated, truncated)))
        if game_over(terminated, truncated):
            out.append((np.array(watch.call("reset", env.reset)[0], copy=True),))
    return out


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))

