"""`--env-backend auto`: pick the fastest backend for this env family, machine and installed extras.

The decision tree (numbers measured on a 2-core machine, docs/backends.md and docs/benchmarks.md):

1. Procgen ids exist only in EnvPool -> ``envpool``.
2. Atari: a C++ vector steps about 2x faster than Python wrappers (Breakout x8: sync 1.6k, ale
   2.8-3.1k steps/s). ``ale`` ships with the atari extra; fleetrl's EnvPool backend runs EnvPool in
   sync mode and measured no faster than ale here, so ``envpool`` is the pick only without ale-py.
3. Everything else (classic control, MuJoCo, custom envs): probe one env's step cost (at most
   ``PROBE_SECONDS``). Multi-process stepping pays only when a step costs more than a wake-up
   round trip plus the copy: gymnasium's AsyncVectorEnv ran CartPole at 15k steps/s against 109k
   in-process, and EnvPool ran HalfCheetah at 12k against 18k for sync. So: ``async`` when a step
   costs at least ``ASYNC_MIN_STEP_US`` and there are at least 2 cores and 2 envs, else ``sync``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from fleetrl.envs.registry import EnvFactory, EnvFamily

PROBE_SECONDS = 1.0
ASYNC_MIN_STEP_US = 100.0  # below this, one in-process loop beats waking worker processes


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    reason: str


def probe_step_cost_us(env_id: str, family: EnvFamily, seconds: float = PROBE_SECONDS) -> float:
    """Median wall time of one env step with random actions, in microseconds (resets excluded)."""
    env = EnvFactory(env_id, family.name)()
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        costs = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(costs) < 2000:
            action = env.action_space.sample()
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            costs.append(time.perf_counter() - t0)
            if terminated or truncated:
                env.reset()
        return float(np.median(costs) * 1e6)
    finally:
        env.close()


def choose_backend(env_id: str, family: EnvFamily, num_envs: int, cores: int | None = None, need_frames: bool = False) -> BackendChoice:
    """``need_frames``: video capture renders Python envs, so the C++ backends are left out."""
    from fleetrl.envs.native import native_backend_support

    cores = cores or os.cpu_count() or 1
    native = {} if need_frames else native_backend_support(env_id, family.name)
    if family.name == "procgen":
        return BackendChoice("envpool", "Procgen envs exist only in EnvPool")
    if family.name == "atari":
        if native.get("ale"):
            return BackendChoice("ale", "Atari: ale-py's C++ AtariVectorEnv steps about 2x faster than Python wrappers (docs/backends.md)")
        if native.get("envpool"):
            return BackendChoice("envpool", "Atari: EnvPool's C++ pool steps about 2x faster than Python wrappers (ale-py not installed)")
    cost = probe_step_cost_us(env_id, family)
    if cost >= ASYNC_MIN_STEP_US and cores >= 2 and num_envs >= 2:
        return BackendChoice("async", f"one step costs {cost:.0f} us (>= {ASYNC_MIN_STEP_US:.0f} us): worker processes on {cores} cores pay off")
    why = f"one step costs {cost:.0f} us, less than a worker wake-up pays for" if cost < ASYNC_MIN_STEP_US else f"{cores} core(s) / {num_envs} env(s)"
    return BackendChoice("sync", f"{why}: stepping in-process is fastest")
