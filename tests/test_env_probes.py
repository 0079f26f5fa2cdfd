"""The start-up probes (fleetrl/envs/probe.py) step copies of the env before training: each call of the env gets
--env-timeout, so an env that hangs ends the start with a clear error or a safe choice, never hangs it.

The test envs (fleetrl_test_envs.py: HangingEnv) sleep for good at a planned step; a test that hangs fails by its
timeout mark instead of holding the suite."""

from __future__ import annotations

import pytest

from conftest import run_fleetrl_in_process
from fleetrl.envs import env_family
from fleetrl.envs.probe import StepCost, measure_step
from fleetrl.envs.stepping import plan_stepping

pytestmark = pytest.mark.timeout(60)

WAITS = StepCost(wall_us=5000.0, cpu_us=100.0, steps=100)  # a step that waits: the plan checks thread safety


def test_an_env_that_hangs_at_its_first_step_ends_the_start_with_one_clear_error(tmp_path):
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "fleetrl_test_envs:HangsAtOnce-v0", "--env-timeout", "1",
                                  "--num-envs", "2", "--num-steps", "8", "--total-timesteps", "64", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "hung while fleetrl timed it before training" in proc.stderr and "no answer within 1 s" in proc.stderr, proc.stderr
    assert "--env-timeout" in proc.stderr and "--env-backend" in proc.stderr  # what to change


def test_an_env_that_hangs_after_some_steps_is_measured_on_those_and_says_so(capsys):
    env_id = "fleetrl_test_envs:HangsLater-v0"  # its 6th step hangs
    cost = measure_step(env_id, env_family(env_id), env_timeout=1.0)
    assert cost.steps == 5 and "measured on 5 steps" in cost.describe() and "no answer within 1 s" in cost.describe()
    assert "hung while fleetrl timed it" in capsys.readouterr().err


def test_a_thread_safety_check_that_hangs_falls_back_to_processes_with_the_reason():
    env_id = "fleetrl_test_envs:HangsLater-v0"
    plan = plan_stepping(env_id, env_family(env_id), 8, cores=2, cost=WAITS, free_memory=2**40, env_timeout=1.0)
    assert plan.threads == 1 and plan.workers == 8, plan
    assert "thread-safety check was left unfinished" in plan.reason and "processes only" in plan.reason, plan.reason


def test_a_probe_gets_the_time_it_needs_within_env_timeout():
    """The bound is per call of the env: a probe that makes many quick calls is not cut short."""
    env_id = "fleetrl_test_envs:Unreproducible-v0"  # 2 ms a step
    cost = measure_step(env_id, env_family(env_id), seconds=0.3, env_timeout=1.0)
    assert cost.steps > 5 and cost.note == ""
