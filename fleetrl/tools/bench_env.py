"""`fleetrl bench-env`: environment throughput per backend and number of envs, and what `auto` would pick.

    fleetrl bench-env --env-id BreakoutNoFrameskip-v4 --backends sync,async,ale,envpool --num-envs 8,16 --seconds 5

Random actions, no network: env steps/s (summed over envs), frames/s (Atari: x4 frame skip) and
the CPU utilisation of the process tree, each the median of ``--repeats`` runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import psutil

from fleetrl.envs import env_family, make_vector_env
from fleetrl.envs.atari import FRAME_SKIP
from fleetrl.errors import FleetError


@dataclass
class BenchEnvArgs:
    env_id: str = "CartPole-v1"
    """the environment to measure"""
    backends: str = "sync,async,ale,envpool"
    """comma-separated backends to compare (the ones that cannot run this env are skipped with a note)"""
    num_envs: str = "8"
    """comma-separated numbers of envs"""
    seconds: float = 3.0
    """stepping time per measurement"""
    repeats: int = 3
    """measurements per combination; the median is reported"""
    async_batch: int | None = None
    """async backend: return the first K ready envs each step (EnvPool's send/recv model)"""
    json: bool = False
    """print the results as JSON"""


@dataclass
class Measurement:
    backend: str
    num_envs: int
    steps_per_s: float
    frames_per_s: float
    cpu_percent: float
    runs: list[float]


def _tree_cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def random_actions(space: gym.Space, count: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=count)
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high, size=(count, *space.shape)).astype(space.dtype)
    raise FleetError(f"bench-env cannot sample actions of {space}.")


def measure(env_id: str, backend: str, num_envs: int, seconds: float, async_batch: int | None = None) -> tuple[float, float]:
    """(env steps/s, CPU %) of one backend, stepping with random actions for ``seconds`` after a warm-up."""
    envs = make_vector_env(env_id, num_envs, backend, training=True, async_batch=async_batch)
    rng = np.random.default_rng(0)
    proc = psutil.Process()
    try:
        envs.reset(seed=0)
        actions = [random_actions(envs.single_action_space, num_envs, rng) for _ in range(16)]
        batch = async_batch if async_batch else num_envs
        if async_batch and async_batch < num_envs:  # EnvPool-style: keep every env busy, collect the first K
            envs.send(actions[0])
            for _ in range(5):
                *_, ids = envs.recv()
                envs.send(actions[1][: len(ids)], ids)
        else:
            for i in range(5):
                envs.step(actions[i % 16])
        steps, i = 0, 0
        cpu0, t0 = _tree_cpu_seconds(proc), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if async_batch and async_batch < num_envs:
                *_, ids = envs.recv()
                envs.send(actions[i % 16][: len(ids)], ids)
            else:
                envs.step(actions[i % 16])
            steps += batch
            i += 1
        elapsed = time.perf_counter() - t0
        cpu = 100.0 * (_tree_cpu_seconds(proc) - cpu0) / elapsed
        return steps / elapsed, cpu
    finally:
        envs.close()


def bench_env(args: BenchEnvArgs, quiet: bool = False) -> dict:
    family = env_family(args.env_id)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    try:
        counts = [int(n) for n in args.num_envs.split(",") if n.strip()]
    except ValueError:
        raise FleetError(f"--num-envs takes comma-separated integers, e.g. 8,16,32; got {args.num_envs!r}.") from None
    if not counts or min(counts) <= 0 or args.seconds <= 0 or args.repeats <= 0:
        raise FleetError("--num-envs, --seconds and --repeats must be positive.")
    frames = FRAME_SKIP if family.name == "atari" else 1
    results: list[Measurement] = []
    skipped: dict[str, str] = {}
    for backend in backends:
        for n in counts:
            runs, cpus = [], []
            try:
                for _ in range(args.repeats):
                    sps, cpu = measure(args.env_id, backend, n, args.seconds, args.async_batch)
                    runs.append(sps)
                    cpus.append(cpu)
            except FleetError as exc:
                skipped[backend] = str(exc).split(". ")[0]
                break
            median = statistics.median(runs)
            results.append(Measurement(backend, n, median, median * frames, statistics.median(cpus), runs))
    from fleetrl.envs.auto import choose_backend

    picks = {n: choose_backend(args.env_id, family, n) for n in counts}
    best = max(results, key=lambda m: m.steps_per_s) if results else None
    report = {
        "env_id": args.env_id,
        "family": family.name,
        "cores": os.cpu_count(),
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


def _print_table(report: dict, frames: int) -> None:
    best = report["fastest"]
    print(f"\n{report['env_id']} ({report['family']}), random actions, {report['cores']} CPU cores, median of repeats\n")
    print("| backend | envs | env steps/s | frames/s | CPU % | all runs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in report["results"]:
        mark = " **fastest**" if best and (m["backend"], m["num_envs"]) == (best["backend"], best["num_envs"]) else ""
        runs = ", ".join(f"{r:,.0f}" for r in m["runs"])
        print(f"| {m['backend']}{mark} | {m['num_envs']} | {m['steps_per_s']:,.0f} | {m['frames_per_s']:,.0f} | {m['cpu_percent']:.0f} | {runs} |")
    for backend, why in report["skipped"].items():
        print(f"skipped {backend}: {why}")
    for n, pick in report["auto"].items():
        print(f"auto with {n} envs picks: {pick['backend']} ({pick['reason']})")
    sys.stdout.flush()
