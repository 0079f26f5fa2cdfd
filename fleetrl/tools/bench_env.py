"""`fleetrl bench-env`: environment throughput per backend and number of envs, and what `auto` would pick.

    fleetrl bench-env --env-id BreakoutNoFrameskip-v4 --backends sync,async,ale,envpool --num-envs 8,16 --seconds 5
    fleetrl bench-env --env-id mypkg:MySim-v0 --backends async,gym-async --num-envs 32,128   # an env that waits

Random actions, no network: env steps/s (summed over envs), frames/s (Atari: x4 frame skip), the CPU utilisation
and the memory (RSS) of the whole process tree, each the median of ``--repeats`` runs. The async backend's workers
and stepping threads are planned once per number of envs from a measured step and ``--async-batch``, by the function
training plans them with (:func:`fleetrl.envs.stepping.plan_stepping`), or set with ``--env-workers``/``--env-threads``;
``gym-async`` is gymnasium's AsyncVectorEnv, a process per env.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from fleetrl import config
from fleetrl.cores import available_cores, cores
from fleetrl.envs import BACKENDS, env_family, make_vector_env
from fleetrl.envs.atari import FRAME_SKIP
from fleetrl.envs.stepping import SteppingPlan, plan_stepping
from fleetrl.envs.vector import check_async_batch
from fleetrl.errors import FleetError


@dataclass
class BenchEnvArgs:
    env_id: str = "CartPole-v1"
    """the environment to measure"""
    backends: str = "sync,async,gym-async,ale,envpool"
    """comma-separated backends to compare (the ones that cannot run this env are skipped with a note)"""
    num_envs: str = "8"
    """comma-separated numbers of envs"""
    seconds: float = 3.0
    """stepping time per measurement"""
    repeats: int = 3
    """measurements per combination; the median is reported"""
    async_batch: int | None = None
    """async backend: return the first K ready envs each step (EnvPool's send/recv model)"""
    env_workers: int | None = None
    """async backend: worker processes [planned from a measured step, as in training]"""
    env_threads: int | None = None
    """async backend: stepping threads in each worker [planned from a measured step, as in training]"""
    json: bool = False
    """print the results as JSON"""


@dataclass
class Measurement:
    backend: str
    num_envs: int
    steps_per_s: float
    frames_per_s: float
    cpu_percent: float
    rss_mb: float  # the whole process tree's resident memory while it stepped
    runs: list[float]
    stepping: str = ""  # the async backend's workers and threads


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    return [proc, *proc.children(recursive=True)]


def _tree_cpu_seconds(proc: psutil.Process) -> dict[tuple[int, float], float]:
    """CPU seconds of each process in the tree, keyed by (pid, start time) so that a reused pid is another process."""
    seconds = {}
    for p in _tree(proc):
        try:
            t = p.cpu_times()
            seconds[(p.pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            pass
    return seconds


def _cpu_used_since(before: dict[tuple[int, float], float], after: dict[tuple[int, float], float]) -> float:
    """CPU seconds the tree used between two readings, process by process: a process that ended in between (an earlier
    measurement's worker still shutting down) drops out of both sides instead of making the total negative."""
    return sum(seconds - before.get(key, 0.0) for key, seconds in after.items())


def _tree_rss_mb(proc: psutil.Process) -> float:
    total = 0
    for p in _tree(proc):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def random_actions(space: gym.Space, count: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=count)
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high, size=(count, *space.shape)).astype(space.dtype)
    raise FleetError(f"fleetrl cannot sample random actions of {space} to measure the env; choose --env-backend yourself.")


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


def measure(env_id: str, backend: str, num_envs: int, seconds: float, async_batch: int | None = None,
            stepping: SteppingPlan | None = None) -> tuple[float, float, float]:
    """(env steps/s, CPU %, tree RSS in MB) of one backend, stepping with random actions for ``seconds`` after a warm-up."""
    workers, threads = (stepping.workers, stepping.threads) if stepping is not None else (None, None)
    envs = make_vector_env(env_id, num_envs, backend, training=True, async_batch=async_batch, env_workers=workers, env_threads=threads)
    proc = psutil.Process()
    try:
        envs.reset(seed=0)
        # EnvPool-style: keep every env busy, collect the first K
        stepper = RandomStepper(envs, np.random.default_rng(0), first_ready=bool(async_batch and async_batch < num_envs))
        stepper.run(0.0, min_batches=5)  # warm-up
        cpu0, t0 = _tree_cpu_seconds(proc), time.perf_counter()
        steps = stepper.run(seconds)
        elapsed = time.perf_counter() - t0
        cpu = 100.0 * _cpu_used_since(cpu0, _tree_cpu_seconds(proc)) / elapsed
        return steps / elapsed, cpu, _tree_rss_mb(proc)
    finally:
        envs.close()


RANGES = {
    "seconds": config.positive("stepping time per measurement, in seconds"),
    "repeats": config.count("measurements per combination"),
    "async_batch": config.count("envs returned per step", optional=True, hint="Leave it out to step every env each time."),
    "env_workers": config.count("async env worker processes", high=4096, optional=True, hint="Leave it out to plan them."),
    "env_threads": config.count("stepping threads in each async env worker", high=4096, optional=True, hint="Leave it out to plan them."),
}


def bench_env(args: BenchEnvArgs, quiet: bool = False) -> dict:
    backends, counts = check_args(args)
    family = env_family(args.env_id)
    frames = FRAME_SKIP if family.name == "atari" else 1
    results: list[Measurement] = []
    skipped: dict[str, str] = {}
    for backend in backends:
        for n in counts:
            runs, cpus, rss = [], [], []
            try:
                check_async_batch(n, args.async_batch, backend)  # a backend that steps all its envs together is skipped, saying so
                # planned once per count, as a training run plans it (the plan measures a step; with --async-batch, workers
                # whose groups make up the batch)
                stepping = (plan_stepping(args.env_id, family, n, available_cores(), workers=args.env_workers, threads=args.env_threads,
                                          async_batch=args.async_batch) if backend == "async" else None)
                for _ in range(args.repeats):
                    sps, cpu, mb = measure(args.env_id, backend, n, args.seconds, args.async_batch, stepping)
                    runs.append(sps)
                    cpus.append(cpu)
                    rss.append(mb)
            except FleetError as exc:
                skipped[backend] = str(exc).split(". ")[0]
                break
            median = statistics.median(runs)
            results.append(Measurement(backend, n, median, median * frames, statistics.median(cpus), max(rss), runs,
                                       stepping.describe() if stepping is not None else ""))
    from fleetrl.envs.auto import choose_backend

    picks = {n: choose_backend(args.env_id, family, n) for n in counts}
    best = max(results, key=lambda m: m.steps_per_s) if results else None
    report = {
        "env_id": args.env_id,
        "family": family.name,
        "cores": cores().describe(),
        "results": [asdict(m) for m in results],
        "skipped": skipped,
        "fastest": asdict(best) if best else None,
        "auto": {str(n): {"backend": c.backend, "reason": c.reason} for n, c in picks.items()},
    }
    if args.json:
        print(json.dumps(report))
    elif not quiet:
        _print_table(report, frames)
    return report


def check_args(args: BenchEnvArgs) -> tuple[list[str], list[int]]:
    """The backends and numbers of envs to measure; refuses what cannot run, before anything is measured."""
    config.check_ranges(args, RANGES)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if not backends or unknown:
        raise FleetError(f"--backends takes comma-separated backends from: {', '.join(BACKENDS)}; got {args.backends!r}"
                         f"{' (unknown: ' + ', '.join(unknown) + ')' if unknown else ''}. Example: --backends sync,async")
    try:
        counts = [int(n) for n in args.num_envs.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise FleetError(f"--num-envs takes comma-separated whole numbers of at least 1, e.g. 8,16,32; got {args.num_envs!r}.")
    for n in counts:  # the one rule of --async-batch; what each backend allows is checked as it comes to be measured
        check_async_batch(n, args.async_batch, "auto")
    return backends, counts


def _print_table(report: dict, frames: int) -> None:
    best = report["fastest"]
    print(f"\n{report['env_id']} ({report['family']}), random actions, {report['cores']}, median of repeats\n")
    print("| backend | envs | env steps/s | frames/s | CPU % | tree RSS MB | all runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in report["results"]:
        mark = " **fastest**" if best and (m["backend"], m["num_envs"]) == (best["backend"], best["num_envs"]) else ""
        runs = ", ".join(f"{r:,.0f}" for r in m["runs"])
        name = m["backend"] + (f" ({m['stepping']})" if m["stepping"] else "")
        print(f"| {name}{mark} | {m['num_envs']} | {m['steps_per_s']:,.0f} | {m['frames_per_s']:,.0f} | {m['cpu_percent']:.0f} | "
              f"{m['rss_mb']:,.0f} | {runs} |")
    for backend, why in report["skipped"].items():
        print(f"skipped {backend}: {why}")
    for n, pick in report["auto"].items():
        print(f"auto with {n} envs picks: {pick['backend']} ({pick['reason']})")
    sys.stdout.flush()
