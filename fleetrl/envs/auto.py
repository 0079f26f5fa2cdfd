"""`--env-backend auto`: pick a backend for this env family, machine and installed extras, the same one for the same
command whatever the load, and say why.

The decision tree (numbers measured on a 2-core machine, docs/backends.md and docs/benchmarks.md):

1. Procgen ids exist only in EnvPool -> ``envpool``.
   ``--env-threads T`` above 1 asks for stepping threads, which only the async backend's workers have -> ``async``,
   before anything is measured: the flag decides, never the load.
2. Atari: a C++ vector steps about 2x faster than Python wrappers (Breakout x8: sync 1.6k, ale 2.8-3.1k steps/s).
   ``ale`` when ale-py is installed and has the game, else ``envpool``. The two do not give the agent the same data
   for a seed (EnvPool drops the rewards of its hidden reset frames; ale's FIRE after a lost life is a visible step),
   so auto never chooses between them by a timing at start, which would make one command train on different data
   depending on the machine's load. Which is faster depends on the host (EnvPool 1,307 against ale 988 steps/s on
   one, ale ahead on another): ``fleetrl bench-env`` measures both, and ``--env-backend envpool`` pins it.
3. Everything else (classic control, MuJoCo, custom envs): measure one env's step
   (:func:`fleetrl.envs.probe.measure_step`, at most a second). Multi-process stepping pays only when a step costs
   more than a wake-up round trip plus the copy: gymnasium's AsyncVectorEnv ran CartPole at 15k steps/s against 109k
   in-process, and EnvPool ran HalfCheetah at 12k against 18k for sync. So: ``async`` when a step takes at least
   ``ASYNC_MIN_STEP_US`` and there are at least 2 cores and 2 envs (or 1 core and an env that waits, whose waits
   overlap in threads), else ``sync``. The measured step then sizes the async backend's workers and stepping threads
   (:mod:`fleetrl.envs.stepping`). sync and async give the same data for a seed, so the timing never changes a run.

The backend chosen is written into the run's arguments, so its checkpoints and config name it and a resume uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gymnasium as gym

from fleetrl.cores import available_cores
from fleetrl.envs.probe import ENV_TIMEOUT_S, StepCost, measure_step
from fleetrl.envs.registry import EnvFamily
from fleetrl.envs.stepping import WAITS_BELOW

ASYNC_MIN_STEP_US = 100.0  # below this, one in-process loop beats waking worker processes
ATARI_CANDIDATES = ("ale", "envpool")  # in order of preference


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    reason: str
    cost: StepCost | None = None  # one env's step, when it was measured (the async backend's stepping plan uses it)


def choose_backend(
    env_id: str,
    family: EnvFamily,
    num_envs: int,
    cores: int | None = None,
    need_frames: bool = False,
    async_batch: int | None = None,
    env_threads: int | None = None,
    env_timeout: float | None = ENV_TIMEOUT_S,
    make_env: Callable[[], gym.Env] | None = None,
) -> BackendChoice:
    """``need_frames``: video capture renders Python envs, so the C++ backends are left out. ``async_batch`` below
    ``num_envs`` (first-ready batches) needs a backend that returns the first envs ready: async, or for Atari EnvPool
    (ale only when the batch is half the envs). ``env_threads`` above 1 (the flag) asks for stepping threads, which
    only the async backend has: it is chosen whatever the step measures, so the same command never runs on a quiet
    machine and is refused on a busy one. ``env_timeout`` (the flag): the longest one env call of the step probe may take.
    ``make_env``: the probe builds its env with it instead of ``env_id``'s factory (make_vec's env functions)."""
    from fleetrl.envs.native import native_backend_support

    cores = cores or available_cores()
    # only Atari chooses between C++ backends; probing EnvPool imports all of it (~1 s), so other families skip it
    native = native_backend_support(env_id, family.name) if family.name == "atari" and not need_frames else {}
    if family.name == "procgen":
        return BackendChoice("envpool", "Procgen envs exist only in EnvPool")
    first_ready = async_batch is not None and async_batch < num_envs
    if env_threads is not None and env_threads > 1:
        return BackendChoice("async", f"--env-threads {env_threads}: stepping threads run in the async backend's worker processes")
    if family.name == "atari":
        installed = [b for b in ATARI_CANDIDATES if native.get(b) and (not first_ready or b == "envpool" or 2 * async_batch == num_envs)]
        if installed:
            missing = "" if len(installed) == 2 else f"; {next(b for b in ATARI_CANDIDATES if b not in installed)} cannot run it here"
            return BackendChoice(installed[0], f"Atari: a C++ vector, about 2x the Python wrappers; {installed[0]} whatever the load, "
                                               f"since ale and envpool differ in the data they give{missing} (docs/backends.md)")
    cost = measure_step(env_id, family, env_timeout=env_timeout, make_env=make_env)
    if first_ready:
        return BackendChoice("async", f"{cost.describe()}; --async-batch {async_batch} needs worker processes that return the first "
                                      f"envs ready", cost=cost)
    if cost.wall_us >= ASYNC_MIN_STEP_US and cores >= 2 and num_envs >= 2:
        return BackendChoice("async", f"{cost.describe()} (>= {ASYNC_MIN_STEP_US:.0f} us): worker processes pay off", cost=cost)
    if cost.wall_us >= ASYNC_MIN_STEP_US and cost.cpu_share < WAITS_BELOW and num_envs >= 2:
        # one core, but an env that waits: its waits still overlap in worker threads
        return BackendChoice("async", f"{cost.describe()} (>= {ASYNC_MIN_STEP_US:.0f} us) and it waits: stepping threads overlap "
                                      f"the waits", cost=cost)
    why = (f"{cost.describe()}, less than a worker wake-up pays for" if cost.wall_us < ASYNC_MIN_STEP_US
           else f"{cores} core(s) / {num_envs} env(s)")
    return BackendChoice("sync", f"{why}: stepping in-process is fastest", cost=cost)
