"""PPO-RND: CleanRL's ppo_rnd_envpool.py networks and update code in lockstep (on Breakout), the next observations
curiosity is computed on (an episode's last where it ended), exact resume after SIGTERM with the curiosity's
statistics, a real Atari run and greedy eval, and bad input refused. Learning on CartPole is
test_learning.py's; the copy template, test_user_algos.py's."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import ppo, ppo_rnd
from fleetrl.monitor.tbread import read_scalars
from fleetrl.sampling.sampler import Sampler
from fleetrl.monitor.timing import PhaseTimer

from conftest import (assert_train_refused, killed_on_exit, require_module, run_fleetrl_here, run_fleetrl_in_process, start_fleetrl_group,
                      wait_for_checkpoint)

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

RND_TINY = ["train", "ppo_rnd", "--env-id", "fleetrl_test_envs:SlowStateless-v0", "--no-cuda", "--env-backend", "sync", "--no-progress",
            "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--num-iterations-obs-norm-init", "2", "--precision", "fp32",
            "--total-timesteps", str(12 * 32), "--checkpoint-every", "1"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lockstep_with_cleanrls_start_acting_and_update_code_identical_given_fleetrls_rounding(monkeypatch):
    # benchmarks/vs_cleanrl.py ppo_rnd --lockstep's job on 2 Breakout envs x 16 steps (the benchmark's 4 x 32 took 1.6x
    # the time): 3 iterations, 2 epochs of 2 minibatches, after a random-action start of one rollout; the rollouts still
    # hold a point and two lost lives (episode ends for GAE and the intrinsic returns).
    # Given fused Adam and fleetrl's rounding of the log-probabilities and the advantages' normalisation, CleanRL's loss
    # and step give the same bits; rounding its own way it parts by 1e-6 (relative, losses). The advantages differ in
    # the last bits (8e-7 relative): fleetrl's GAE carries the next value in float64 (ppo.gae, which also bootstraps
    # at time limits) and scales the intrinsic rewards in float64
    require_module("ale_py", "ale-py")
    from versus import ppo_rnd as lockstep
    from loops.ppo_rnd import LOCKSTEP  # the job both sides run (benchmarks/cleanrl/loops/ppo_rnd.py)

    for name, value in {"num_envs": 2, "num_steps": 16, "total_timesteps": 3 * 2 * 16}.items():
        monkeypatch.setitem(LOCKSTEP, name, value)
    verdicts = lockstep.lockstep(SimpleNamespace(env_id="BreakoutNoFrameskip-v4", seed=1))

    def within(name: str, bound: float) -> None:
        verdict = verdicts[name]
        assert verdict.startswith("identical") or float(verdict.split("difference ")[1].split()[0]) < bound, (name, verdict)

    # the random-action start, then the acting, step by step as CleanRL's loop acts: the statistics agree; the
    # log-probabilities (numpy's, from the logits), the values (acted on half the envs at a time, CleanRL's on all: a
    # matrix product of other shapes) and the intrinsic values and rewards (8e-7; identical on 4 envs) in the last bits
    within("start's statistics", 1e-9)
    within("intrinsic values", 1e-5)
    within("intrinsic rewards", 1e-5)
    within("acting: log-probabilities", 1e-5)
    within("acting: extrinsic values", 1e-3)
    assert verdicts["initial weights"] == "identical (40)", verdicts
    assert verdicts["losses"] == "identical (12)", verdicts
    assert all(verdicts[f"weights after iteration {i}"] == "identical (32)" for i in (1, 2, 3)), verdicts
    for name in ("advantages", "returns", "int_returns"):
        within(name, 1e-5)
    for name in ("losses, CleanRL's rounding", "weights after iteration 3, CleanRL's rounding"):
        within(name, 1e-4)


def test_the_atari_networks_are_cleanrls_weight_for_weight_from_the_same_seed():
    sys.path.insert(0, str(BENCHMARKS / "cleanrl"))
    import ppo_rnd_envpool as theirs

    torch.manual_seed(3)
    agent, rnd = theirs.Agent(SimpleNamespace(single_action_space=gym.spaces.Discrete(18))), theirs.RNDModel(4, 18)
    expected = {**agent.state_dict(), **{f"rnd.{k}": v for k, v in rnd.state_dict().items()}}
    torch.manual_seed(3)
    ours = ppo_rnd.Agent((4, 84, 84), gym.spaces.Discrete(18))
    assert list(ours.state_dict()) == list(expected)
    assert all(torch.equal(v, expected[k]) for k, v in ours.state_dict().items())
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    _, logprob, _, value_ext, value_int = agent.get_action_and_value(frames.float(), torch.zeros(5, dtype=torch.long))
    logits, ours_ext, ours_int = ours.get_action_logits_and_values(frames)
    torch.testing.assert_close(ours_ext, value_ext.view(-1), rtol=0, atol=0)
    torch.testing.assert_close(ours_int, value_int.view(-1), rtol=0, atol=0)
    assert not any(p.requires_grad for p in ours.rnd.target.parameters()), "the target network is fixed"


def test_next_obs_gives_each_steps_successor_and_an_episodes_last_observation_where_it_ended():
    # CartPole ends where the pole falls or the cart leaves the track: those states are the episodes' last
    # observations, which the next row (a reset state, near 0) is not
    from fleetrl.envs import make_vector_env

    envs = make_vector_env("CartPole-v1", 3, "sync", training=True)
    agent = ppo_rnd.Agent((4,), gym.spaces.Discrete(2))
    sampler = Sampler(envs, agent, 64, rollout=ppo.rollout,
                      device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), keep_next_obs=True)
    try:
        b = sampler.collect()
        following = b.next_obs()
    finally:
        sampler.close()
    assert b.dones.any(), "a random policy ends CartPole episodes within 64 steps"
    for t in range(63):
        for env in range(3):
            if not b.dones[t, env]:
                np.testing.assert_array_equal(following[t, env], b.obs[t + 1, env])
            else:
                last = following[t, env]
                assert abs(last[2]) > 0.2094 or abs(last[0]) > 2.4, last  # where CartPole terminates
                assert not np.array_equal(last, b.obs[t + 1, env])
    np.testing.assert_array_equal(following[-1], b.last_obs)
    np.testing.assert_array_equal(b.next_obs(lambda o: o[..., :1]), following[..., :1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    # the observation and intrinsic-reward statistics and each env's running discount carry over with the model, the
    # optimiser and the RNG streams, and the random-action start is not repeated: the resumed run ends where an
    # uninterrupted one does (each step sleeps 5 ms, so the SIGTERM lands mid-run). The stopped run is the process the
    # signal is sent to; the uninterrupted reference and the resume run in this process
    whole = run_fleetrl_here(*RND_TINY, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    proc = start_fleetrl_group(*RND_TINY, "--run-dir", str(tmp_path / "part"))
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, tmp_path / "part", min_step=2 * 32)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    stopped = checkpoint.load_checkpoint(tmp_path / "part")
    assert 2 * 32 <= stopped["global_step"] < 12 * 32
    assert stopped["rnd_obs_rms"]["count"] > 2 * 2 * 16 and stopped["ranks"][0]["rnd_reward_filter"]["rewems"].abs().sum() > 0
    resumed = run_fleetrl_here(*RND_TINY, "--run-dir", str(tmp_path / "part"), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "random actions" not in resumed.stdout, "a resumed run keeps its statistics"
    first, second = checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(tmp_path / "part")
    assert first["global_step"] == second["global_step"] == 12 * 32
    for key in first["model"]:
        assert torch.equal(first["model"][key], second["model"][key]), key
    for name in ("rnd_obs_rms", "rnd_reward_rms"):
        assert all(torch.equal(first[name][k], second[name][k]) for k in first[name]), name


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_atari_run_logs_cleanrls_scalars_and_eval_plays_its_policy(tmp_path):
    require_module("ale_py", "ale-py")
    run_dir = tmp_path / "run"
    # in this process: PPO-RND's training in a process of its own is the SIGTERM test's above
    proc = run_fleetrl_here("train", "ppo_rnd", "--env-id", "BreakoutNoFrameskip-v4", "--no-cuda", "--num-envs", "4", "--num-steps", "32",
                            "--num-iterations-obs-norm-init", "1", "--total-timesteps", str(2 * 4 * 32), "--run-dir", str(run_dir),
                            "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "curiosity: starting the observation statistics with 1 rollouts of random actions" in proc.stdout
    for tag in ("policy_loss", "value_loss", "int_value_loss", "fwd_loss", "entropy", "approx_kl", "old_approx_kl"):
        assert len(read_scalars(run_dir, f"losses/{tag}")) == 2, tag  # one an iteration
    curiosity = [p.value for p in read_scalars(run_dir, "charts/curiosity_reward")]
    assert len(curiosity) == 2 and all(np.isfinite(curiosity)) and curiosity[0] > 0
    # here, in this process: eval's real process is test_ppo_runs.py's, test_pqn.py's and test_c51.py's
    evaluated = run_fleetrl_in_process("eval", str(run_dir), "--episodes", "1", "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


@pytest.mark.parametrize("flags, needles", [
    (["--env-id", "Pendulum-v1"], ["PPO_RND", "Pendulum-v1"]),
    (["--env-id", "CartPole-v1", "--update-proportion", "1.5"], ["--update-proportion", "1.5"]),
    (["--env-id", "CartPole-v1", "--int-gamma", "-0.1"], ["--int-gamma", "-0.1"]),
    (["--env-id", "CartPole-v1", "--int-coef", "-1"], ["--int-coef", "-1"]),
    (["--env-id", "CartPole-v1", "--num-iterations-obs-norm-init", "-1"], ["--num-iterations-obs-norm-init", "-1"]),
    (["--env-id", "CartPole-v1", "--async-batch", "2"], ["--async-batch 2", "each env's steps"]),
    (["--env-id", "CartPole-v1", "--policy-lag", "1"], ["--policy-lag"]),
    (["--env-id", "CartPole-v1", "--normalize", "True"], ["--normalize"]),
])
def test_bad_input_is_refused_in_one_paragraph_before_anything_starts(tmp_path, flags, needles):
    assert_train_refused("ppo_rnd", flags, needles, tmp_path / "run")
