"""The thread plan: who gets the cores (torch, env workers, sampler thread), applied at start and printed in one line."""

import dataclasses
import os

import pytest
import torch

from fleetrl import runtime
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


def test_busy_cores_elsewhere_leaves_out_this_process():
    busy = runtime.busy_cores_elsewhere(0.05)
    assert 0.0 <= busy <= (os.cpu_count() or 1) + 0.5


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
    pytest.importorskip("ale_py")
    cores = os.cpu_count() or 1
    monkeypatch.setattr(runtime, "busy_cores_elsewhere", lambda *a, **k: cores - 1.0)  # every core but one is taken
    if passive:
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    else:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    before = torch.get_num_threads()
    run = _start_run(tmp_path, "BreakoutNoFrameskip-v4", torch_deterministic=deterministic)
    try:
        assert run.threads.torch_threads == (run.cores if passive or deterministic else 1)
    finally:
        run.close()
        torch.set_num_threads(before)
