"""Envs that wait: the async backend steps many of them at once (stepping threads in its workers), sized from a
measured step, overridden by --env-workers/--env-threads, and never in threads for an env that is not thread-safe.
Behaviour only; the speed is measured by benchmarks/speed.py (`ppo --scenarios wait-envs,socket-sim` and `envs wait`)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import fleetrl_env, run_fleetrl_in_process
from fleetrl.cores import available_cores
from fleetrl.envs import env_family, make_vector_env
from fleetrl.envs.probe import StepCost
from fleetrl.envs.stepping import MAX_THREADS_PER_WORKER, plan_stepping
from fleetrl.errors import FleetError
from fleetrl.monitor.tbread import read_text

CLASSIC = env_family("CartPole-v1")
WAITS = StepCost(wall_us=5000.0, cpu_us=100.0, steps=100)  # 2% CPU: a simulator answering in 5 ms
COMPUTES = StepCost(wall_us=300.0, cpu_us=290.0, steps=100)


@pytest.mark.serial  # real time and real load: run alone (Makefile)
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_envs_that_only_finish_when_eight_step_at_once_train_on_two_cores(tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = fleetrl_env() | {"FLEETRL_TEST_BARRIER_DIR": str(barrier)}
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", "fleetrl_test_envs:Barrier-v0", "--num-envs", "16",
                           "--num-steps", "8", "--total-timesteps", str(16 * 8 * 3), "--no-cuda", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restarting env worker" not in proc.stderr, "no env ever timed out at its barrier"
    stepping = next(line for line in proc.stdout.splitlines() if line.startswith("env stepping:"))
    assert "stepping threads" in stepping and "it waits" in stepping, stepping
    assert "env_stepping" in read_text(tmp_path / "run"), "the plan is in TensorBoard as text"


def test_an_env_that_waits_gets_a_stepper_per_env_in_few_threads_per_process():
    plan = plan_stepping("CartPole-v1", CLASSIC, 64, cores=2, cost=WAITS, workers=None, threads=None)
    assert plan.workers * plan.threads >= 64 and plan.threads <= MAX_THREADS_PER_WORKER and plan.workers >= 2
    assert "it waits" in plan.reason and "all 64 of its 64 envs step at once" in plan.reason
    capped = plan_stepping("CartPole-v1", CLASSIC, 1024, cores=1, cost=WAITS)  # 64 steppers a core: 16 rounds of 64
    assert capped.workers * capped.threads == 64 and "64 of its 1024 envs step at once" in capped.reason
    few = plan_stepping("CartPole-v1", CLASSIC, 8, cores=2, cost=WAITS)
    assert (few.workers, few.threads) == (2, 4)


def test_an_env_that_computes_keeps_one_worker_per_core_and_no_threads():
    plan = plan_stepping("CartPole-v1", CLASSIC, 64, cores=2, cost=COMPUTES)
    assert (plan.workers, plan.threads) == (2, 1) and "it computes" in plan.reason


def test_a_thread_unsafe_env_that_waits_gets_processes_only_as_many_as_fit_in_memory():
    # measured (a module global moved by every copy) and declared (metadata["thread_safe"] = False) alike
    for env_id in ("fleetrl_test_envs:GlobalState-v0", "fleetrl_test_envs:DeclaredThreadUnsafe-v0"):
        family = env_family(env_id)
        plan = plan_stepping(env_id, family, 16, cores=2, cost=WAITS)
        assert plan.threads == 1 and plan.workers == 16 and "processes only" in plan.reason, plan
        tight = plan_stepping(env_id, family, 16, cores=2, cost=WAITS, free_memory=4 * 60 * 2**20 * 4)
        assert tight.threads == 1 and tight.workers == 4 and "fit in a quarter of the free memory" in tight.reason, tight
    assert "disagreed" in plan_stepping("fleetrl_test_envs:GlobalState-v0", env_family("fleetrl_test_envs:GlobalState-v0"), 4,
                                        cores=2, cost=WAITS).reason


@pytest.mark.parametrize("env_id", ["fleetrl_test_envs:GlobalState-v0", "fleetrl_test_envs:DeclaredThreadUnsafe-v0"])
def test_a_thread_unsafe_env_never_steps_beside_another_in_its_process(env_id):
    envs = make_vector_env(env_id, 6, "async", env_workers=2)  # 3 envs a worker: threads would put them side by side
    try:
        assert envs.stepping.threads == 1
        envs.reset(seed=0)
        for _ in range(5):
            obs, *_ = envs.step(np.zeros(6, np.int64))
        assert (obs[:, 1] == 1).all(), "at most one copy inside step() at once in each worker process"
    finally:
        envs.close()


def test_an_env_whose_thread_safety_cannot_be_checked_gets_processes_and_says_why():
    """Not reproducible for a seed, so copies cannot be compared: unknown counts as unsafe (processes only), not as safe."""
    env_id = "fleetrl_test_envs:Unreproducible-v0"
    plan = plan_stepping(env_id, env_family(env_id), 16, cores=2, cost=WAITS, free_memory=2**40)
    assert plan.threads == 1 and plan.workers == 16, plan
    assert "not reproducible for a seed" in plan.reason and "processes only" in plan.reason, plan.reason
    chosen = plan_stepping(env_id, env_family(env_id), 16, cores=2, cost=WAITS, threads=4)  # the flag still decides
    assert chosen.threads == 4


def test_a_thread_safe_env_that_waits_steps_side_by_side():
    envs = make_vector_env("fleetrl_test_envs:Barrier-v0", 8, "async", env_workers=2)
    try:
        assert envs.stepping.threads == 4 and envs.num_workers == 2 and envs.threads == 4
    finally:
        envs.close()


def policies_of(pid: int) -> set[int]:
    """The scheduling policy of every thread of a process."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_workers_of_envs_that_wait_run_as_batch_tasks_and_workers_of_envs_that_compute_do_not():
    # a batch task that wakes does not preempt the trainer while it writes the other workers' commands
    waiting = make_vector_env("fleetrl_test_envs:Barrier-v0", 8, "async", env_workers=2)  # 2 x 4 stepping threads
    # at most a worker per core of the allocation, no threads (more workers than cores would be batch tasks too)
    computing = make_vector_env("CartPole-v1", 2, "async", env_workers=min(2, available_cores()), env_threads=1)
    try:
        waiting.reset(seed=0)
        computing.reset(seed=0)
        assert all(policies_of(pid) == {os.SCHED_BATCH} and len(os.listdir(f"/proc/{pid}/task")) >= 4 for pid in waiting.worker_pids)
        assert all(policies_of(pid) == {os.SCHED_OTHER} for pid in computing.worker_pids)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER, "the trainer keeps the default policy"
    finally:
        waiting.close()
        computing.close()


def test_the_flags_override_the_plan_and_are_printed(capsys):
    envs = make_vector_env("fleetrl_test_envs:Barrier-v0", 6, "async", env_workers=3, env_threads=2, verbose=True)
    try:
        assert (envs.num_workers, envs.threads) == (3, 2)
    finally:
        envs.close()
    assert "env stepping: 3 env worker processes x 2 stepping threads (--env-workers and --env-threads)" in capsys.readouterr().out


@pytest.mark.parametrize("flags, needle", [
    (["--env-workers", "0"], "--env-workers must be in [1, 4096]"),
    (["--env-threads", "0"], "--env-threads must be in [1, 4096]"),
    (["--env-workers", "5"], "--env-workers 5 must be between 1 and the envs of this process (4)"),
    (["--env-workers", "2", "--env-threads", "3"], "--env-threads 3 is more than the 2 envs each of --env-workers 2"),
    (["--env-threads", "2", "--env-backend", "sync"], "--env-backend sync has none"),
])
def test_bad_stepping_flags_get_one_clear_error(tmp_path, flags, needle):
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "CartPole-v1", "--num-envs", "4", "--no-cuda", "--run-dir", str(tmp_path / "r"),
                       *flags)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists(), "refused before anything started"


def test_the_stepping_flags_are_checked_where_the_vector_is_built_too():
    with pytest.raises(FleetError, match="--env-threads 2 sets the stepping threads"):
        make_vector_env("CartPole-v1", 4, "sync", env_threads=2)
