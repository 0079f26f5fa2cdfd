"""How many worker processes, and how many stepping threads in each, step the async backend's envs: sized by what
one step does, measured at start, not by the core count alone.

* An env that computes (most of its step is CPU) gets one worker process per core, each stepping its envs one
  after another: more would only take turns on the same cores, and threads would queue on the GIL.
* An env that waits (a simulator in another process, a server, a robot, a tool call: little of its step is CPU)
  gets a stepper per env, so that every wait of a step overlaps (up to ``MAX_STEPPERS_PER_CORE`` a core). They are
  threads inside the worker processes, at most ``MAX_THREADS_PER_WORKER`` a process: a thread costs far less memory
  than a process, but a process's threads take turns on its GIL before and after each wait.
* An env that is not safe to step from several threads (it says ``metadata["thread_safe"] = False``, or two copies
  stepped at once from two threads disagree with one stepped alone) gets processes only, at most as many as fit in a
  quarter of the free memory. So does an env whose thread safety could not be checked (it is not reproducible for a
  seed): threads on a wrong guess would corrupt its data without a sign, processes only cost memory.

``--env-workers N`` and ``--env-threads T`` override the plan (docs/backends.md, "Envs that wait").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym

from fleetrl.envs.probe import ENV_TIMEOUT_S, ProbeFailed, ProbeHung, StepCost, declared_thread_safe, measure_step, steps_alike_in_threads
from fleetrl.envs.registry import EnvFactory, EnvFamily, built_and_read
from fleetrl.errors import FleetError

WAITS_BELOW = 0.5  # a step whose CPU share is below this waits more than it computes
# Threads per worker process, measured (benchmarks/speed.py envs wait, 5 ms sleeping envs, 2 cores, 2026-12-05): 64 envs ran
# 8.4k steps/s as 2 x 32, 9.5k as 4 x 16 and 10.1k as 8 x 8; 128 envs 11.2k as 2 x 64, 15.4k as 8 x 16 and 16.4k as
# 16 x 8. A process's threads take turns on its GIL around each wait, and the more of them, the longer the queue.
MAX_THREADS_PER_WORKER = 8
# Fewer steppers than envs would wait in rounds. The CPU share measured on one env in the trainer overstates what a
# step costs among many (on a VM, a vCPU that idles through every wait pays to wake up: 150-220 us of "CPU" a 5 ms
# step alone, 70-100 us a step among 64 threads), so it does not cap the steppers; this does, for huge --num-envs.
MAX_STEPPERS_PER_CORE = 64
WORKER_MEMORY_BYTES = 60 * 2**20  # a worker process without torch: Python, numpy, gymnasium (~45 MB measured) and an env
MEMORY_SHARE = 0.25  # processes-only plans keep their workers within this share of the free memory


@dataclass(frozen=True)
class SteppingPlan:
    """The async backend's worker processes and stepping threads per worker, and why."""

    workers: int
    threads: int
    reason: str
    cost: StepCost | None = None

    def describe(self) -> str:
        """e.g. ``4 env worker processes x 16 stepping threads``."""
        processes = f"{self.workers} env worker process{'es' if self.workers != 1 else ''}"
        return processes + (f" x {self.threads} stepping threads" if self.threads > 1 else " (each steps its envs in turn)")


def check_flags(num_envs: int, backend: str, workers: int | None, threads: int | None) -> None:
    """The one check of ``--env-workers`` and ``--env-threads`` against each other, the envs and the backend."""
    if workers is not None and not 1 <= workers <= num_envs:
        raise FleetError(f"--env-workers {workers} must be between 1 and the envs of this process ({num_envs}): each worker "
                         f"steps at least one env. Lower it, or leave it out to size the workers from a measured step.")
    if threads is not None and threads > 1 and backend not in ("async", "auto"):
        raise FleetError(f"--env-threads {threads} sets the stepping threads of the async backend's worker processes, and "
                         f"--env-backend {backend} has none. Use --env-backend async (or auto), or leave --env-threads out.")
    if threads is not None and workers is not None and threads > math.ceil(num_envs / workers):
        raise FleetError(f"--env-threads {threads} is more than the {math.ceil(num_envs / workers)} envs each of --env-workers "
                         f"{workers} steps ({num_envs} envs): a thread steps at least one env. Lower it, or leave it out.")


def plan_stepping(env_id: str, family: EnvFamily, num_envs: int, cores: int, cost: StepCost | None = None,
                  workers: int | None = None, threads: int | None = None, per_core_workers: int | None = None,
                  free_memory: int | None = None, async_batch: int | None = None,
                  env_timeout: float | None = ENV_TIMEOUT_S, make_env: Callable[[], gym.Env] | None = None) -> SteppingPlan:
    """The workers and threads for ``num_envs`` envs on ``cores`` cores. ``cost``: the step measured already (by the
    auto backend's probe), else measured here unless both flags are given; ``workers``/``threads``: the flags;
    ``per_core_workers``: the thread plan's workers for an env that computes (default one per core, at most one per env);
    ``env_timeout`` (the flag): the longest one env call of the probes may take; ``make_env``: builds the probes' copies
    instead of ``env_id``'s factory (make_vec's env functions)."""
    check_flags(num_envs, "async", workers, threads)
    plan = _plan(env_id, family, num_envs, cores, cost, workers, threads, per_core_workers, free_memory, env_timeout, make_env)
    if async_batch is None or async_batch == num_envs or workers is not None:
        return plan
    # first-ready batches of K return whole worker groups: the fewest more workers whose groups divide K
    fits = next(w for w in range(plan.workers, num_envs + 1) if num_envs % w == 0 and async_batch % (num_envs // w) == 0)
    if fits == plan.workers:
        return plan
    threads = max(1, min(plan.threads, num_envs // fits))
    return SteppingPlan(fits, threads, f"{plan.reason}; {fits} workers, so that --async-batch {async_batch} is whole worker groups",
                        plan.cost)


def _plan(env_id: str, family: EnvFamily, num_envs: int, cores: int, cost: StepCost | None, workers: int | None,
          threads: int | None, per_core_workers: int | None, free_memory: int | None, env_timeout: float | None,
          make_env: Callable[[], gym.Env] | None = None) -> SteppingPlan:
    if workers is not None and threads is not None:
        return SteppingPlan(workers, threads, "--env-workers and --env-threads", cost)
    cost = cost or measure_step(env_id, family, env_timeout=env_timeout, make_env=make_env)
    if cost.cpu_share >= WAITS_BELOW:
        workers = workers or min(num_envs, per_core_workers or cores)
        if threads is not None:  # the user's threads, one worker per core unless they said otherwise
            return SteppingPlan(workers, min(threads, math.ceil(num_envs / workers)), f"{cost.describe()}; --env-threads", cost)
        return SteppingPlan(workers, 1, f"{cost.describe()}: it computes, so one worker process per core", cost)

    # it waits: every env at once, in as few rounds of waits a step as the cap allows
    rounds = math.ceil(num_envs / (cores * MAX_STEPPERS_PER_CORE))
    steppers = math.ceil(num_envs / rounds)
    why = f"{cost.describe()}: it waits, so {'all ' if steppers == num_envs else ''}{steppers} of its {num_envs} envs step at once"
    if threads is None:
        safe, how = _thread_safety(env_id, family, env_timeout, make_env)
        if safe is False:
            threads = 1
            why += f"; {how}, so processes only"
        elif how:
            why += f"; {how}"
    if threads == 1:  # processes only: one per stepper, as many as fit in memory
        fit = max(1, int((free_memory if free_memory is not None else _free_memory()) * MEMORY_SHARE // WORKER_MEMORY_BYTES))
        workers = workers or max(1, min(steppers, max(cores, fit)))
        return SteppingPlan(workers, 1, why + (f" (at most {fit} worker processes fit in a quarter of the free memory)"
                                                if workers < steppers else ""), cost)
    if workers is None:
        per_worker = threads or MAX_THREADS_PER_WORKER
        workers = min(num_envs, max(min(cores, num_envs), math.ceil(steppers / per_worker)))
    threads = threads or math.ceil(steppers / workers)
    return SteppingPlan(workers, max(1, min(threads, math.ceil(num_envs / workers))), why, cost)


def _thread_safety(env_id: str, family: EnvFamily, env_timeout: float | None = ENV_TIMEOUT_S,
                   make_env: Callable[[], gym.Env] | None = None) -> tuple[bool | None, str]:
    """Whether copies of the env may step from several threads at once (False also when that cannot be told), and how
    that was found out."""
    make = make_env or EnvFactory(env_id, family.name)
    try:
        declared = built_and_read(make, declared_thread_safe, env_timeout, name="fleetrl-thread-check")
        if declared is not None:
            return declared, f"its metadata says thread_safe={declared}"
        alike = steps_alike_in_threads(env_id, family, env_timeout=env_timeout, make_env=make)
    except ProbeHung as exc:  # a hung env: stepping it beside another was never seen to work
        return False, f"its thread-safety check was left unfinished ({exc}, --env-timeout)"
    except ProbeFailed as exc:  # nothing to compare: unknown, so processes, with the env's error in the reason
        return False, f"its thread-safety check failed ({exc})"
    if alike is False:
        return False, "two copies stepped at once from two threads disagreed with one stepped alone (not thread-safe)"
    if alike is None:  # unknown counts as unsafe: threads on a wrong guess corrupt data silently, processes only cost memory
        return False, ('it is not reproducible for a seed, so its thread safety could not be checked (declare '
                       'metadata["thread_safe"] = True in the env, or pass --env-threads, to step it in threads)')
    return True, ""


def _free_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)
