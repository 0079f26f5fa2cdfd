"""DDPG: CleanRL's ddpg_continuous_action.py loop step for step (lockstep), and the soft target update as CleanRL
writes it. Discrete actions refused, kill -9 resume and torchrun replicas are test_sac_td3.py's (parametrized over
DDPG); learning and eval on InvertedPendulum are test_learning.py's; the copy template, test_user_algos.py's."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars
from fleetrl.offpolicy import soft_update

from conftest import assert_same_learner, killed_on_exit, run_fleetrl, start_fleetrl_group, wait_for_checkpoint

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lockstep_with_cleanrls_ddpg_loop_actions_updates_losses_and_weights_bit_for_bit():
    # benchmarks/ddpg_vs_cleanrl.py --lockstep, short: CleanRL's loop given fleetrl's three differences (numpy warm-up
    # draws, copied target networks, fused Adam). It found three more, all fixed in fleetrl: updates started one step
    # early and the actor updated on the odd steps (the loop counted the step being taken); the soft update was lerp_,
    # which rounds otherwise than CleanRL's tau * p + (1 - tau) * t; and the exploration noise was randn * scale * 0.1,
    # where CleanRL's torch.normal(0, scale * 0.1) is randn * (scale * 0.1).
    import ddpg_vs_cleanrl

    opts = SimpleNamespace(env_id="InvertedPendulum-v5", steps=1500, learning_starts=500, seed=3)
    verdicts = ddpg_vs_cleanrl.lockstep(opts)
    assert all(v.startswith("identical") for v in verdicts.values()), verdicts
    assert verdicts["update_steps"] == "identical (1,498)" and verdicts["target_steps"] == "identical (499)", verdicts


def test_soft_update_is_cleanrls_arithmetic_and_tau_1_copies():
    torch.manual_seed(0)
    source, target = torch.nn.Linear(7, 5), torch.nn.Linear(7, 5)
    expected = [(0.005 * p.data + (1 - 0.005) * t.data) for p, t in zip(source.parameters(), target.parameters())]
    soft_update(target, source, 0.005)
    assert all(torch.equal(t, e) for t, e in zip(target.parameters(), expected))
    soft_update(target, source, 1.0)  # DQN's target copy
    assert all(torch.equal(t, p) for t, p in zip(target.parameters(), source.parameters()))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, algo):
    # a resume starts fresh episodes (docs/reliability.md), so the env is one whose episodes never differ; with
    # --save-buffer the replay, the RNG streams (warm-up draws, exploration noise, minibatches) and Adam carry over
    train = ["train", algo, "--env-id", "fleetrl_test_envs:StatelessBox-v0", "--no-cuda", "--env-backend", "sync", "--no-progress",
             "--total-timesteps", "2000", "--learning-starts", "500", "--batch-size", "32", "--checkpoint-every", "2", "--save-buffer"]
    whole = run_fleetrl(*train, "--run-dir", str(tmp_path / "whole"), timeout=240)
    assert whole.returncode == 0, whole.stderr[-3000:]

    stopped = tmp_path / "stopped"
    proc = start_fleetrl_group(*train, "--run-dir", str(stopped))
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, stopped, 700)  # past the warm-up: learning has started
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode != 0 and "stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]
    assert int(checkpoint.load_checkpoint(stopped)["global_step"]) < 2000
    resumed = run_fleetrl(*train, "--resume", "auto", "--run-dir", str(stopped), timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_learner(checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(stopped),
                        ("actor", "qf", "target_actor", "qf_target"), ("q_optimizer", "actor_optimizer"))
    assert [p.step for p in read_scalars(stopped, "losses/actor_loss")] == list(range(600, 2001, 100)), "every iteration logged once"
