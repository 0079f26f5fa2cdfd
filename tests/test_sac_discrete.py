"""Discrete SAC: CleanRL's sac_atari.py loop step for step (lockstep, with its MLP on CartPole), its Atari networks
weight for weight, an exact resume after a real SIGTERM, an Atari run (the CNN path), greedy eval, and its
bad input refused. Learning on CartPole is test_learning.py's; the copy template, test_user_algos.py's."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import sac_discrete
from fleetrl.monitor.tbread import read_scalars

from conftest import (assert_same_learner, assert_train_refused, killed_on_exit, require_module, run_fleetrl_here, start_fleetrl_group,
                      wait_for_checkpoint)

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
NETWORKS = ("actor", "qf1", "qf2", "qf1_target", "qf2_target")
OPTIMIZERS = ("q_optimizer", "actor_optimizer", "a_optimizer")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lockstep_with_cleanrls_sac_atari_loop_actions_updates_losses_and_weights_bit_for_bit():
    # benchmarks/vs_cleanrl.py sac_discrete --lockstep, short: CleanRL's loop (its networks with the MLP its ported file
    # gives vector observations) given fleetrl's three differences: numpy warm-up draws, copied targets, fused Adam.
    # Every 4th step from 501 updates the critics, the actor and alpha (3 losses each); a target copy at steps 1000 and 1500
    from versus import sac_discrete as lockstep

    opts = SimpleNamespace(env_id="CartPole-v1", steps=2000, learning_starts=500, seed=2)
    verdicts = lockstep.lockstep(opts)
    assert all(v.startswith("identical") for v in verdicts.values()), verdicts
    assert verdicts["update_steps"] == f"identical ({3 * 374:,})" and verdicts["target_steps"] == "identical (2)", verdicts


def test_atari_networks_are_cleanrls_weight_for_weight_from_the_same_seed():
    # the Nature CNN with every layer Kaiming-initialised in CleanRL's order, so a seed gives sac_atari.py's weights
    require_module("ale_py", "atari")
    sys.path.insert(0, str(BENCHMARKS / "cleanrl"))
    import sac_atari

    envs = SimpleNamespace(single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), single_action_space=gym.spaces.Discrete(4))
    torch.manual_seed(5)
    theirs = [sac_atari.Actor(envs), sac_atari.SoftQNetwork(envs)]
    torch.manual_seed(5)
    ours = [sac_discrete.Actor((4, 84, 84), 4), sac_discrete.SoftQNetwork((4, 84, 84), 4)]
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    for mine, other in zip(ours, theirs):
        assert [p.shape for p in mine.parameters()] == [p.shape for p in other.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), other.parameters()))
    torch.testing.assert_close(ours[1](frames), theirs[1](frames.float()), rtol=0, atol=0)  # the Q-network scales frames itself
    torch.testing.assert_close(ours[0](frames), theirs[0](frames.float() / 255.0), rtol=0, atol=0)  # the actor's caller does


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    # an env whose episodes never differ, so the resume's fresh episodes are the same; with --save-buffer the replay,
    # the RNG streams (warm-up draws, action samples, minibatches), alpha and the three Adams carry over. The signal needs
    # the real process; the uninterrupted run and the resume run here, on the same one thread
    train = ["train", "sac_discrete", "--env-id", "fleetrl_test_envs:Stateless-v0", "--no-cuda", "--env-backend", "sync", "--no-progress",
             "--total-timesteps", "2000", "--learning-starts", "500", "--batch-size", "32", "--target-network-frequency", "300",
             "--checkpoint-every", "2", "--save-buffer", "--torch-threads", "1"]
    whole = run_fleetrl_here(*train, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]

    stopped = tmp_path / "stopped"
    proc = start_fleetrl_group(*train, "--run-dir", str(stopped))
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, stopped, 700)  # past the warm-up: learning has started
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0 and "stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]
    assert int(checkpoint.load_checkpoint(stopped)["global_step"]) < 2000
    resumed = run_fleetrl_here(*train, "--resume", "auto", "--run-dir", str(stopped))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole_state, stopped_state = checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(stopped)
    assert_same_learner(whole_state, stopped_state, NETWORKS, OPTIMIZERS)
    assert torch.equal(whole_state["log_alpha"]["0"], stopped_state["log_alpha"]["0"])
    assert whole_state["log_alpha"]["0"].item() != 0.0, "alpha was tuned"
    scalars = [p.step for p in read_scalars(stopped, "losses/alpha_loss")]
    assert scalars == list(range(600, 2001, 100)), "every iteration logged once"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trains_on_atari_frames_with_cleanrls_scalars_and_eval_plays_greedily_and_repeatably(tmp_path):
    require_module("ale_py", "atari")
    # here, in this process (train's real process is the SIGTERM test's); 25 updates of the three CNNs, all logged at step 500
    run_dir = tmp_path / "breakout"
    proc = run_fleetrl_here("train", "sac_discrete", "--env-id", "BreakoutNoFrameskip-v4", "--no-cuda", "--env-backend", "sync", "--no-progress",
                            "--total-timesteps", "500", "--learning-starts", "400", "--buffer-size", "1000", "--batch-size", "16",
                            "--torch-threads", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss", "alpha", "alpha_loss"]
    assert [name for name in names if read_scalars(run_dir, f"losses/{name}")] == names
    state = checkpoint.load_checkpoint(run_dir)
    assert state["actor"]["network.0.0.weight"].shape == (32, 4, 8, 8), "the Nature CNN on 4 stacked frames"
    # here, in this process: eval's real process is test_ppo_runs.py's, test_pqn.py's and test_c51.py's
    greedy = [run_fleetrl_here("eval", str(run_dir), "--episodes", "1", "--json") for _ in range(2)]
    assert all(p.returncode == 0 for p in greedy), greedy[0].stderr[-3000:]
    assert greedy[0].stdout.splitlines()[-1] == greedy[1].stdout.splitlines()[-1], "greedy eval from the same seed plays the same episode"


def test_greedy_acting_takes_the_most_probable_action_and_sampling_follows_the_probabilities():
    torch.manual_seed(0)
    actor = sac_discrete.Actor((4,), 3)
    obs = torch.randn(5, 4)
    torch.testing.assert_close(actor.act(obs, deterministic=True), actor(obs).argmax(1), rtol=0, atol=0)
    one = obs[:1].expand(20_000, 4)
    counts = torch.bincount(actor.act(one, deterministic=False), minlength=3).float() / 20_000
    torch.testing.assert_close(counts, torch.softmax(actor(obs[:1]), 1)[0].detach(), atol=0.015, rtol=0)


@pytest.mark.parametrize("flags, needles", [
    (["--env-id", "Pendulum-v1"], ["SAC_DISCRETE", "Pendulum-v1", "`fleetrl train sac`, `td3`, `ddpg` or `ppo`"]),
    (["--env-id", "CartPole-v1", "--target-entropy-scale", "-0.5"], ["--target-entropy-scale", "-0.5"]),
    (["--env-id", "CartPole-v1", "--update-frequency", "0"], ["--update-frequency", "0"]),
    (["--env-id", "CartPole-v1", "--alpha", "-1", "--no-autotune"], ["--alpha", "-1"]),
    (["--env-id", "CartPole-v1", "--policy-lr", "0"], ["--policy-lr", "0"]),
])
def test_bad_input_is_refused_in_one_paragraph_before_anything_starts(tmp_path, flags, needles):
    assert_train_refused("sac_discrete", flags, needles, tmp_path / "run")
