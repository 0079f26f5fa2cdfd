"""Process setup shared by the algorithms: device choice, seeding, and the thread plan (who gets the CPU cores)."""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fleetrl.cores import cores as machine_cores
from fleetrl.errors import FleetError


def pick_device(cuda: bool, warn: bool = True) -> torch.device:
    """CUDA when asked and present; otherwise the CPU, with one warning line if CUDA was asked for."""
    if cuda and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if cuda and warn:
        print("warning: --cuda is on but no CUDA GPU is available; training on the CPU (pass --no-cuda to silence this).", file=sys.stderr)
    return torch.device("cpu")


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


# Backends whose envs step in the trainer's own thread: they have no workers to plan.
IN_PROCESS_BACKENDS = ("sync", "gym-sync")
BUSY_CORE = 0.5  # another process's use from which a core counts as taken (rounded)
BUSY_SAMPLE_S = 0.2  # how long busy_cores_elsewhere watches


@dataclass(frozen=True)
class ThreadPlan:
    """Who gets this process's CPU cores: torch's intra-op threads, the env workers and the sampler thread.

    Built by :func:`plan_threads`; the measurements behind the rule are in docs/backends.md ("Thread plan").
    """

    cores: int  # this process's share of the machine: its cores / the processes on it
    torch_threads: int  # intra-op threads for acting and learning (one setting per process)
    env_workers: int  # worker processes (async backend) or C++ threads (ale, envpool); unused when envs step in-process
    sampler_thread: bool  # --policy-lag >= 1: a thread collects the next rollout while the learner trains
    lag_worker: str = "sampler thread"  # what --policy-lag 1 adds: PPO's sampler thread, or the off-policy learner process
    torch_threads_explicit: bool = False  # set with --torch-threads, not planned
    local_world_size: int = 1
    busy_elsewhere: float = 0.0  # cores other processes kept busy when the plan was made
    allocation: str = ""  # what limits the cores, when less than the machine's (fleetrl/cores.py), e.g. "affinity mask 1 of 2"

    def env_part(self, backend: str, stepping: Any = None) -> str:
        if backend in IN_PROCESS_BACKENDS:
            return "envs step in the trainer's thread"
        if stepping is not None:  # the async backend's plan (fleetrl/envs/stepping.py)
            return stepping.describe()
        if backend == "async":
            return f"{self.env_workers} env worker process{'es' if self.env_workers != 1 else ''}"
        if backend == "gym-async":
            return "a process per env (gymnasium)"
        if backend in ("ale", "envpool"):
            return f"{self.env_workers} {backend} thread{'s' if self.env_workers != 1 else ''}"
        return f"{self.env_workers} env workers if the backend has them"

    def describe(self, backend: str = "auto", stepping: Any = None) -> str:
        """One line for the start of a run, e.g. ``threads on 2 cores: torch 2 (planned), 2 env worker processes, no sampler thread``;
        ``stepping``: the async backend's plan of workers and threads, when it has one."""
        share = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        if self.allocation:
            share += f" ({self.allocation})"
        if self.local_world_size > 1:
            share += f" (this process's share of {self.local_world_size})"
        if self.torch_threads_explicit:
            why = "--torch-threads"
        elif self.busy_elsewhere >= BUSY_CORE:
            why = f"planned; {self.busy_elsewhere:.1f} cores busy with other processes at start"
        else:
            why = "planned"
        torch_part = f"torch {self.torch_threads} ({why})"
        sampler = f"1 {self.lag_worker} (--policy-lag)" if self.sampler_thread else f"no {self.lag_worker}"
        return f"threads on {share}: {torch_part}, {self.env_part(backend, stepping)}, {sampler}"


def plan_threads(
    cores: int | None = None,
    local_world_size: int = 1,
    num_envs: int = 1,
    cnn: bool = True,
    policy_lag: int = 0,
    torch_threads: int | None = None,
    busy_elsewhere: float = 0.0,
) -> ThreadPlan:
    """The thread plan for one training process; ``torch_threads`` (the flag) wins over the plan.

    ``cnn``: the network is a CNN (image observations); otherwise a small MLP. ``busy_elsewhere``:
    cores that other processes keep busy (:func:`busy_cores_elsewhere`). The rule, measured on 2 cores
    (docs/backends.md "Thread plan", ``benchmarks/speed.py threads``):

    - each process takes ``cores // local_world_size`` cores: torch processes that each take every
      core slow each other several times over (FACTS.md);
    - a CNN gets the cores of that share that no other process is using (``busy_elsewhere``, 0 when
      OpenMP waits passively). Spinning intra-op threads that share a core with another job stall
      each other: PPO Breakout with 2 threads ran 210-231 SPS when the other core was free and 35-100
      while other jobs ran; with 1 thread, 119-206 either way;
    - a small MLP gets 1 thread: its ops are too small to split, so a second thread gained nothing
      on a free core (CartPole 7,664 against 7,936 SPS) and cost up to 7x beside another job. SAC's and
      TD3's 256-wide MLPs at batch 256 are planned as a CNN (``Run.start(wide_network=True)``): an
      update took 10.2 ms with 2 threads against 13.4 ms with 1 (SAC; TD3 6.6 against 9.2);
    - env workers (async processes, ale/EnvPool threads): one per core of the share, at most one per
      env. Stepping, acting and learning take turns in the serial loop, so torch and the workers do
      not compete for the cores;
    - ``--policy-lag 1`` adds the sampler thread and keeps the rest: in an emulation on Breakout the
      learner with 2 threads beside the sampler still beat 1 thread.
    """
    allocation = ""
    if cores is None:  # this process's allocation: its affinity mask within its cgroup's quota
        found = machine_cores()
        cores, allocation = found.usable, found.limits()
    local_world_size = max(local_world_size, 1)
    share = max(1, cores // local_world_size)
    if torch_threads is not None:
        if torch_threads < 1:
            raise FleetError(f"--torch-threads must be at least 1, got {torch_threads}; leave it out to use the thread plan.")
        threads = int(torch_threads)
    elif cnn:
        free = cores - int(busy_elsewhere + (1 - BUSY_CORE))  # a core counts as taken from BUSY_CORE of use
        threads = min(share, max(1, free // local_world_size))
    else:
        threads = 1
    return ThreadPlan(cores=share, torch_threads=threads, env_workers=max(1, min(num_envs, share)), sampler_thread=policy_lag > 0,
                      torch_threads_explicit=torch_threads is not None, local_world_size=local_world_size,
                      busy_elsewhere=float(busy_elsewhere), allocation=allocation)


def threads_wait_passively() -> bool:
    """True when OpenMP's idle threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, read
    when torch loads). Spinning threads are what collapses beside other jobs: a Nature CNN minibatch
    with 2 threads took 670-910 ms there against 280-420 ms with passive waiting (docs/backends.md)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def busy_cores_elsewhere(seconds: float = BUSY_SAMPLE_S) -> float:
    """Cores that other processes kept busy over ``seconds``: this process, its children, its parent
    and its siblings (torchrun's other ranks, which start at the same time) are left out."""
    import psutil

    me = psutil.Process()
    parent = me.ppid()
    ours = {me.pid, parent, *(child.pid for child in me.children(recursive=True))}

    def cpu_seconds() -> dict[int, float]:
        used = {}
        for proc in psutil.process_iter(["pid", "ppid", "cpu_times"]):
            info = proc.info
            if info["pid"] in ours or (parent > 1 and info["ppid"] == parent) or info["cpu_times"] is None:
                continue
            used[info["pid"]] = info["cpu_times"].user + info["cpu_times"].system
        return used

    before, start = cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    after, elapsed = cpu_seconds(), time.perf_counter() - start
    return max(0.0, sum(t - before.get(pid, t) for pid, t in after.items()) / elapsed)


def apply_thread_plan(plan: ThreadPlan) -> None:
    """Set torch's intra-op threads explicitly (the env side is applied by make_vector_env)."""
    torch.set_num_threads(plan.torch_threads)


def set_torch_threads(threads: int | None, local_world_size: int = 1) -> int:
    """Set intra-op threads explicitly: default cores / processes on this machine (at least 1).

    Two torch processes that each take every core slow each other down several times over.
    """
    plan = plan_threads(local_world_size=local_world_size, torch_threads=threads)
    apply_thread_plan(plan)
    return plan.torch_threads
