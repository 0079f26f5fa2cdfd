"""The start-up probes (fleetrl/envs/probe.py) step copies of the env before training: each call of the env gets
--env-timeout, so an env that hangs ends the start with a clear error or a safe choice, never hangs it.

The test envs (fleetrl_test_envs.py: HangingEnv) sleep for good at a planned step; a test that hangs fails by its
timeout mark instead of holding the suite."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from conftest import run_fleetrl_in_process
from fleetrl.envs import env_family, probe
from fleetrl.envs.probe import StepCost, measure_step, steps_alike_in_threads
from fleetrl.envs.registry import EnvFamily
from fleetrl.envs.stepping import plan_stepping

pytestmark = pytest.mark.timeout(60)

WAITS = StepCost(wall_us=5000.0, cpu_us=100.0, steps=100)  # a step that waits: the plan checks thread safety
LEAVE_EARLY = "fleetrl_test_games.leave_early"  # tests/fleetrl_test_games: one agent leaves at step 3, the game ends at 8
CLASSIC = EnvFamily("classic", continuous=False)


class RaisesAtStep4(gym.Env):
    """Three good steps, then an error: an env whose probe fails part-way."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 4:
            raise RuntimeError("the simulator lost its connection")
        return np.zeros(2, np.float32), 0.0, False, False, {}


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
    """The bound is per call of the env: a probe that makes many quick calls, for longer in all than --env-timeout, is
    not cut short. (A bound on the whole probe would stop it at env_timeout with a "measured on N steps" note.)"""
    env_id = "fleetrl_test_envs:Unreproducible-v0"  # 2 ms a step, a reset every 50
    start = time.monotonic()
    cost = measure_step(env_id, env_family(env_id), seconds=2.0, env_timeout=0.75)
    took = time.monotonic() - start
    assert cost.note == "", cost.note
    assert took >= 2.0 and cost.steps > 50, (took, cost)  # its whole budget, past env_timeout, through resets


@pytest.mark.needs("pettingzoo", "multiagent")
def test_the_probe_of_a_pettingzoo_game_steps_its_whole_budget(monkeypatch):
    """A game's flags are per agent: the probe resets it when every agent is done (the engine's game_over), through
    an agent that leaves early and the game's ends, instead of stopping at its first step."""
    monkeypatch.setattr(probe, "PROBE_MAX_STEPS", 40)  # five 8-step games; the step budget, not the clock, ends it
    cost = measure_step(LEAVE_EARLY, env_family(LEAVE_EARLY), seconds=60.0)
    assert cost.steps == 40 and cost.note == "", cost


@pytest.mark.needs("pettingzoo", "multiagent")
def test_the_thread_safety_check_of_a_pettingzoo_game_compares_its_steps():
    """Two copies of a reproducible game stepped from two threads match one stepped alone: known safe, not "unknown"
    (12 steps: past the quitter's leaving at 3 and the game's end at 8)."""
    assert steps_alike_in_threads(LEAVE_EARLY, env_family(LEAVE_EARLY)) is True
    plan = plan_stepping(LEAVE_EARLY, env_family(LEAVE_EARLY), 8, cores=2, cost=WAITS, free_memory=2**40)
    assert plan.threads > 1 and "processes only" not in plan.reason and "could not be checked" not in plan.reason, plan


def test_a_step_probe_whose_env_raises_says_so_in_its_reason(capsys):
    cost = measure_step("raises-at-step-4", CLASSIC, make_env=RaisesAtStep4)
    assert cost.steps == 3, cost
    assert "measured on 3 steps: then it raised RuntimeError: the simulator lost its connection" in cost.describe()
    assert "raised while fleetrl timed it" in capsys.readouterr().err


def test_a_thread_safety_check_whose_env_raises_gets_processes_and_says_why():
    plan = plan_stepping("raises-at-step-4", CLASSIC, 8, cores=2, cost=WAITS, free_memory=2**40, make_env=RaisesAtStep4)
    assert plan.threads == 1, plan
    assert "thread-safety check failed" in plan.reason and "the simulator lost its connection" in plan.reason, plan.reason
    assert "not reproducible" not in plan.reason, plan.reason
