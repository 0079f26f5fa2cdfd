"""The thread plan: who gets the cores (torch, env workers, sampler thread), applied at start and printed in one line."""

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
import types

import psutil
import pytest
import torch

from conftest import require_module
from fleetrl import runtime
from fleetrl.cores import Cores
from fleetrl.envs import make_vector_env
from fleetrl.errors import FleetError
from fleetrl.runtime import ThreadPlan, plan_threads


def test_a_cnn_gets_every_core_of_its_share_and_an_mlp_one_thread():
    assert plan_threads(cores=8, num_envs=16, cnn=True).torch_threads == 8
    assert plan_threads(cores=8, num_envs=16, cnn=False).torch_threads == 1


def test_processes_on_one_machine_split_its_cores():
    plan = plan_threads(cores=16, local_world_size=4, num_envs=8, cnn=True)
    assert (plan.cores, plan.torch_threads, plan.env_workers) == (4, 4, 4)
    assert plan_threads(cores=2, local_world_size=4, num_envs=8).torch_threads == 1  # never below 1


def test_env_workers_are_one_per_core_and_at_most_one_per_env():
    assert plan_threads(cores=2, num_envs=8).env_workers == 2
    assert plan_threads(cores=16, num_envs=4).env_workers == 4


def test_a_cnn_leaves_the_cores_other_processes_keep_busy():
    assert plan_threads(cores=2, num_envs=8, cnn=True, busy_elsewhere=0.3).torch_threads == 2
    plan = plan_threads(cores=2, num_envs=8, cnn=True, busy_elsewhere=0.9)
    assert plan.torch_threads == 1 and plan.env_workers == 2
    assert "0.9 cores busy with other processes" in plan.describe("ale")
    assert plan_threads(cores=16, local_world_size=2, num_envs=8, busy_elsewhere=4.0).torch_threads == 6
    assert plan_threads(cores=2, num_envs=8, cnn=True, busy_elsewhere=0.9, torch_threads=2).torch_threads == 2


class _Listed:
    """One row of a scripted ``psutil.process_iter(["pid", "ppid", "cpu_times"])``."""

    def __init__(self, pid: int, ppid: int, cpu: float | None = None):
        self.pid = pid
        self.info = {"pid": pid, "ppid": ppid, "cpu_times": None if cpu is None else types.SimpleNamespace(user=cpu - 0.25, system=0.25)}


@pytest.mark.parametrize("under_init", [False, True], ids=["under-a-shell", "under-init"])
def test_busy_cores_elsewhere_counts_other_processes_cpu_over_the_sample_and_leaves_out_this_family(monkeypatch, under_init):
    """Exact accounting on a scripted process table and clock: the CPU seconds others used over the sample, per wall
    second; this process, its parent, its children and its siblings (torchrun's other ranks) are never counted. Under
    init (a container's first process) every orphan is init's child, so siblings are no family there."""
    me, child, sibling, elsewhere = os.getpid(), 10**7, 10**7 + 1, 10**7 + 9  # pids no real process has
    parent = 1 if under_init else os.getppid()
    table = {  # pid: (ppid, cpu seconds before the sample, after it); 2 s of wall time pass in between
        me: (parent, 10.0, 12.0),  # this process, a core busy: left out
        parent: (0, 5.0, 7.0),  # its parent: left out
        child: (me, 0.0, 2.0),  # a child (an env worker): left out
        10**7 + 2: (elsewhere, 100.0, 101.5),  # an unrelated job: 0.75 cores, counted
        10**7 + 3: (elsewhere, 50.0, 50.5),  # another: 0.25 cores, counted
        10**7 + 4: (elsewhere, None, None),  # no CPU times readable: skipped
    }
    if not under_init:
        table[sibling] = (parent, 1.0, 3.0)  # a sibling (another rank): left out
    listings = iter([[_Listed(pid, ppid, before) for pid, (ppid, before, _) in table.items()],
                     [_Listed(pid, ppid, after) for pid, (ppid, _, after) in table.items()]
                     + [_Listed(10**7 + 5, elsewhere, 9.0)]])  # started during the sample: no before, so no share
    clock = {"now": 1000.0}
    monkeypatch.setattr(psutil, "process_iter", lambda attrs: next(listings))
    monkeypatch.setattr(psutil.Process, "ppid", lambda self: parent)
    monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [_Listed(child, me)])
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(runtime.time, "sleep", lambda seconds: clock.update(now=clock["now"] + 2 * seconds))  # it overran 2x
    assert runtime.busy_cores_elsewhere(1.0) == pytest.approx((1.5 + 0.5) / 2.0, abs=1e-12)


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@pytest.mark.serial  # real time and real load: run alone (Makefile)
def test_busy_cores_elsewhere_sees_a_real_busy_process_but_not_its_own_busy_child():
    """Real processes and psutil: an unrelated process burning a core is counted at the rate it ran; a child of this
    process burning a core beside it is not. Only these processes are listed, so other load on the machine is no noise."""
    burn = [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]  # ends by itself too
    pids: list[int] = []
    try:
        child = subprocess.Popen(burn)
        pids.append(child.pid)
        # an unrelated process: the shell that starts it exits at once, so it is nobody's child here (init adopts it)
        other = int(subprocess.run(["sh", "-c", f"{shlex.join(burn)} >/dev/null 2>&1 & echo $!"], capture_output=True,
                                   text=True, timeout=30).stdout)
        pids.append(other)
        assert psutil.Process(other).ppid() != os.getppid() and other not in [p.pid for p in psutil.Process().children(True)]
        deadline = time.time() + 30
        while _cpu_seconds(other) < 0.05 or _cpu_seconds(child.pid) < 0.05:  # both burning
            assert time.time() < deadline, "the busy processes did not start within 30 s"
            time.sleep(0.02)
        watched, real_iter = {os.getpid(), child.pid, other}, psutil.process_iter
        before, start = {pid: _cpu_seconds(pid) for pid in watched}, time.perf_counter()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(psutil, "process_iter", lambda attrs: [p for p in real_iter(attrs) if p.info["pid"] in watched])
            busy = runtime.busy_cores_elsewhere(0.5)
        elapsed = time.perf_counter() - start
        used = {pid: (_cpu_seconds(pid) - before[pid]) / elapsed for pid in watched}
        assert min(used[other], used[child.pid]) > 0.05, f"the burners barely ran (cores used: {used})"
        # the unrelated burner's own rate (to the few ms between its readings and the function's), not 0 and not with
        # the child's added
        assert abs(busy - used[other]) < 0.4 * min(used[other], used[child.pid]), \
            f"{busy:.2f} cores busy elsewhere, where the unrelated process used {used[other]:.2f} and the child {used[child.pid]:.2f}"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
                psutil.Process(pid).wait(timeout=10)


def test_an_explicit_torch_threads_flag_wins_and_is_named():
    plan = plan_threads(cores=2, num_envs=8, cnn=False, torch_threads=2)
    assert plan.torch_threads == 2 and plan.torch_threads_explicit
    assert "--torch-threads" in plan.describe("sync")
    with pytest.raises(FleetError, match="at least 1"):
        plan_threads(cores=2, torch_threads=0)


def test_policy_lag_adds_the_sampler_thread():
    assert not plan_threads(cores=2, num_envs=8).sampler_thread
    plan = plan_threads(cores=2, num_envs=8, policy_lag=1)
    assert plan.sampler_thread and "sampler thread" in plan.describe("ale") and "no sampler" not in plan.describe("ale")


def test_the_description_is_one_line_naming_each_part_for_the_backend():
    plan = plan_threads(cores=2, num_envs=8, cnn=True)
    line = plan.describe("async")
    assert "\n" not in line and "2 cores" in line and "torch 2" in line and "2 env worker processes" in line
    assert "2 ale threads" in plan.describe("ale")
    assert "trainer's thread" in plan.describe("sync")


def test_applying_the_plan_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        runtime.apply_thread_plan(plan_threads(cores=2, num_envs=4, cnn=False))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_make_vector_env_takes_the_workers_from_the_plan_and_prints_it(capsys):
    plan = dataclasses.replace(plan_threads(cores=2, num_envs=4, cnn=False), env_workers=1)
    envs = make_vector_env("CartPole-v1", 4, "async", threads=plan, verbose=True)
    try:
        assert envs.num_workers == 1 and envs.thread_plan == plan.describe("async", envs.stepping)
    finally:
        envs.close()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("env backend: async") and out[1].startswith("env stepping: 1 env worker process (")
    assert "it computes" in out[1] and out[2] == plan.describe("async", envs.stepping)


def test_without_a_plan_make_vector_env_attaches_none():
    envs = make_vector_env("CartPole-v1", 2, "sync")
    try:
        assert envs.thread_plan is None
    finally:
        envs.close()


def _start_run(tmp_path, env_id: str, **flags):
    from fleetrl.algos.ppo import FAMILY_DEFAULTS, Args, validate
    from fleetrl.run import Run

    args = Args(env_id=env_id, run_dir=str(tmp_path / "run"), cuda=False, progress=False, **flags)
    return Run.start(args, set(flags), FAMILY_DEFAULTS, validate)


def test_run_start_plans_and_applies_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "busy_cores_elsewhere", _not_for_an_mlp)
    before = torch.get_num_threads()
    run = _start_run(tmp_path, "CartPole-v1")
    try:
        assert isinstance(run.threads, ThreadPlan)
        assert run.threads.torch_threads == 1 == torch.get_num_threads()  # CartPole: an MLP
        assert run.threads.env_workers == min(run.local_num_envs, run.cores)
    finally:
        run.close()
        torch.set_num_threads(before)


def _not_for_an_mlp(*args, **kwargs):
    raise AssertionError("the other processes' load was measured, but it does not change an MLP's plan")


@pytest.mark.parametrize("passive, deterministic", [(False, False), (True, False), (False, True)])
def test_run_start_gives_a_cnn_the_free_cores_only_when_threads_spin_and_runs_need_not_repeat(tmp_path, monkeypatch, passive,
                                                                                             deterministic):
    # the thread count changes a CNN's gradients in the last bits: with --torch-deterministic (the default) the plan
    # never follows the load, so one command trains alike on a quiet and on a busy machine
    require_module("ale_py", "atari")
    # four cores, whatever this host has: on a one-core allocation (a Slurm step, a cpuset) every case would plan 1 thread
    # and the test could not fail
    monkeypatch.setattr(runtime, "machine_cores", lambda: Cores(usable=4, machine=4, affinity=4, quota=None))
    monkeypatch.setattr(runtime, "busy_cores_elsewhere", lambda *a, **k: 3.0)  # every core but one is taken
    if passive:
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    else:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    before = torch.get_num_threads()
    run = _start_run(tmp_path, "BreakoutNoFrameskip-v4", torch_deterministic=deterministic)
    try:
        assert run.cores == 4 and run.threads.torch_threads == (4 if passive or deterministic else 1)
    finally:
        run.close()
        torch.set_num_threads(before)
