"""Vector-backend throughput: GymSyncVectorEnv vs gymnasium AsyncVectorEnv vs fleetrl's SharedMemoryVectorEnv.

    python benchmarks/async_vector.py [--seconds 1.0] [--repeats 3] [--slow-workers 8]

Prints markdown tables of env steps per second (summed over envs; fixed random actions, no network),
the median of ``--repeats`` timed windows per backend, the backends' windows interleaved so drift
hits them alike. Scenarios:

(a) CartPole-v1 x 8: an env far cheaper than a wake-up of another process.
(b) a pure-Python env whose step is a 200 us busy loop (not a sleep) x 8; SharedMemoryVectorEnv with
    2 workers (one per core here). Targets: >= 1.6x sync and >= 1.3x gymnasium AsyncVectorEnv.
(c) 8 such envs where env 0 takes 10x longer (2 ms): SharedMemoryVectorEnv with async_batch=4
    against the same setup with all envs fast. Target: >= 70% of the all-fast throughput.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from fleetrl.envs.registry import EnvFactory  # noqa: E402
from fleetrl.envs.shm import SharedMemoryVectorEnv  # noqa: E402
from fleetrl.envs.vector import GymSyncVectorEnv  # noqa: E402
from fleetrl.envs.wrappers import EpisodeStats  # noqa: E402

NUM_ENVS = 8
FAST_US, SLOW_US = 200.0, 2000.0
EPISODE_LENGTH = 500  # the busy env truncates here, so resets are part of the measurement


class BusyEnv(gym.Env):
    """A stand-in for a pure-Python simulator: each step burns ``step_us`` of CPU."""

    def __init__(self, step_us: float):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_us = step_us
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(8, np.float32), {}

    def step(self, action):
        end = time.perf_counter() + self.step_us * 1e-6
        while time.perf_counter() < end:
            pass
        self._t += 1
        return np.full(8, self._t / EPISODE_LENGTH, np.float32), 1.0, False, self._t >= EPISODE_LENGTH, {}


@dataclass(frozen=True)
class Busy:
    """A picklable env function (workers import it from this script, re-run as ``__mp_main__``)."""

    step_us: float

    def __call__(self) -> gym.Env:
        return EpisodeStats(BusyEnv(self.step_us))


class GymAsync:
    """gymnasium's AsyncVectorEnv (shared memory, same-step autoreset) behind step/close."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]]):
        self._envs = gym.vector.AsyncVectorEnv(env_fns, shared_memory=True, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.num_envs = len(env_fns)

    def reset(self, seed: int | None = None):
        return self._envs.reset(seed=seed)

    def step(self, actions):
        return self._envs.step(actions)

    def close(self) -> None:
        self._envs.close()


def _burn_steps(seconds: float, results: Any) -> None:
    """Count 200 us busy-loop steps for ``seconds``, with no inter-process traffic at all."""
    env, steps = BusyEnv(FAST_US), 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(0)
        steps += 1
    results.put(steps)


def parallel_ceiling(seconds: float, processes: int = 2) -> float:
    """How much faster ``processes`` busy processes step than one: the best any backend can do here.

    On a shared VM this swings (vCPUs are stolen by the host), so it is printed beside the results.
    """
    ctx = mp.get_context("spawn")
    counts = []
    for n in (1, processes):
        results = ctx.Queue()
        procs = [ctx.Process(target=_burn_steps, args=(seconds, results)) for _ in range(n)]
        for p in procs:
            p.start()
        counts.append(sum(results.get() for _ in procs))
        for p in procs:
            p.join()
    return counts[1] / counts[0]


def steps_per_second(envs: Any, seconds: float, actions: np.ndarray, use_recv: bool) -> float:
    """Env steps per second over one window of about ``seconds``."""
    steps, k = 0, 0
    if use_recv:  # EnvPool's loop: act on whichever envs are ready
        envs.send(actions[0], np.arange(envs.num_envs))
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            *_, env_ids = envs.recv()
            k = (k + 1) % len(actions)
            envs.send(actions[k][: len(env_ids)], env_ids)
            steps += len(env_ids)
        elapsed = time.perf_counter() - start
        envs.reset(seed=0)  # waits out the sends in flight
        return steps / elapsed
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions[k])
        k = (k + 1) % len(actions)
        steps += envs.num_envs
    return steps / (time.perf_counter() - start)


def measure(backends: dict[str, tuple[Any, bool]], seconds: float, repeats: int) -> dict[str, float]:
    """Median steps/s of each backend; windows interleaved across backends, a short warm-up first."""
    actions = np.random.default_rng(0).integers(0, 2, (64, NUM_ENVS))
    samples: dict[str, list[float]] = {name: [] for name in backends}
    for envs, use_recv in backends.values():
        envs.reset(seed=0)
        steps_per_second(envs, min(0.2, seconds), actions, use_recv)
    for _ in range(repeats):
        for name, (envs, use_recv) in backends.items():
            samples[name].append(steps_per_second(envs, seconds, actions, use_recv))
    for envs, _ in backends.values():
        envs.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per backend (the median is shown)")
    parser.add_argument("--slow-workers", type=int, default=8, help="SharedMemoryVectorEnv workers in scenario (c)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, {NUM_ENVS} envs, median of "
          f"{args.repeats} x {args.seconds:.1f} s windows; env steps per second\n")
    ceiling_before = parallel_ceiling(args.seconds)

    cartpole = [EnvFactory("CartPole-v1", "classic")] * NUM_ENVS
    fast = [Busy(FAST_US)] * NUM_ENVS
    one_slow = [Busy(SLOW_US)] + [Busy(FAST_US)] * (NUM_ENVS - 1)

    rows = []
    for label, fns, workers in [
        (f"(a) CartPole-v1 x{NUM_ENVS}", cartpole, 2),
        (f"(b) busy {FAST_US:.0f} us x{NUM_ENVS}, 2 workers", fast, 2),
    ]:
        r = measure(
            {
                "sync": (GymSyncVectorEnv(fns), False),
                "gym_async": (GymAsync(fns), False),
                "shm": (SharedMemoryVectorEnv(fns, num_workers=workers), False),
            },
            args.seconds,
            args.repeats,
        )
        rows.append((label, r["sync"], r["gym_async"], r["shm"]))

    print("| scenario | GymSyncVectorEnv | gymnasium AsyncVectorEnv | SharedMemoryVectorEnv | shm / sync | shm / gym async |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, sync, gym_async, shm in rows:
        print(f"| {label} | {sync:,.0f} | {gym_async:,.0f} | {shm:,.0f} | {shm / sync:.2f}x | {shm / gym_async:.2f}x |")
    ceiling_after = parallel_ceiling(args.seconds)
    print(f"\nTargets for (b): shm / sync >= 1.6x and shm / gym async >= 1.3x. The ceiling for (b), two "
          f"processes of the same busy loop with no communication against one: {ceiling_before:.2f}x before, "
          f"{ceiling_after:.2f}x after.\n")

    # (c) dynamic scheduling: does one slow env hold the others back?
    w = args.slow_workers
    r = measure(
        {
            "sync_slow": (GymSyncVectorEnv(one_slow), False),
            "gym_async_slow": (GymAsync(one_slow), False),
            "shm_step_slow": (SharedMemoryVectorEnv(one_slow, num_workers=w), False),
            "shm_fast": (SharedMemoryVectorEnv(fast, num_workers=w, async_batch=4), True),
            "shm_slow": (SharedMemoryVectorEnv(one_slow, num_workers=w, async_batch=4), True),
        },
        args.seconds,
        args.repeats,
    )
    print(f"(c) {NUM_ENVS} busy envs ({FAST_US:.0f} us), env 0 {SLOW_US / FAST_US:.0f}x slower "
          f"({SLOW_US:.0f} us); SharedMemoryVectorEnv with {w} workers\n")
    print("| backend | all envs fast | env 0 10x slower | slow / fast |")
    print("|---|---:|---:|---:|")
    print(f"| GymSyncVectorEnv, step() | | {r['sync_slow']:,.0f} | |")
    print(f"| gymnasium AsyncVectorEnv, step() | | {r['gym_async_slow']:,.0f} | |")
    print(f"| SharedMemoryVectorEnv, step() (waits for all) | | {r['shm_step_slow']:,.0f} | |")
    print(f"| SharedMemoryVectorEnv, send/recv async_batch=4 | {r['shm_fast']:,.0f} | {r['shm_slow']:,.0f} | "
          f"{r['shm_slow'] / r['shm_fast']:.0%} |")
    print("\nTarget for (c): async_batch=4 with one slow env >= 70% of the all-fast run.")


if __name__ == "__main__":
    main()
