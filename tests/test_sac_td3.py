"""SAC and TD3: the networks compute what CleanRL's do, and discrete actions are refused. Torchrun replicas, the exact
resume of all three and a resume that refills the buffer are test_every_algorithm.py's and test_exact_resume.py's (a
real kill -9 of an off-policy run: test_dqn.py). That both learn (and eval of a SAC checkpoint) is in test_learning.py;
their full budgets to 950 on InvertedPendulum are `benchmarks/learning.py --suite full`'s."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fleetrl.algos import sac, td3
from fleetrl.nets_continuous import TwinQNetwork

from conftest import run_fleetrl_in_process

BOX = gym.spaces.Box(np.array([-1.0, -3.0], np.float32), np.array([1.0, 2.0], np.float32))
ENVS = SimpleNamespace(single_observation_space=gym.spaces.Box(-1, 1, (3,)), single_action_space=BOX)  # what the networks read


# ------------------------------------------------------------------------------------------ networks
def test_sac_log_prob_is_cleanrls_tanh_squashed_normal():
    actor = sac.Actor(ENVS)
    x = torch.randn(64, 3)
    torch.manual_seed(0)
    action, log_prob = actor.get_action(x)
    torch.manual_seed(0)
    mean, log_std = actor(x)
    normal = torch.distributions.Normal(mean, log_std.exp())
    x_t = normal.rsample()
    y_t = torch.tanh(x_t)
    expected = (normal.log_prob(x_t) - torch.log(actor.action_scale * (1 - y_t.pow(2)) + 1e-6)).sum(1)
    torch.testing.assert_close(action, y_t * actor.action_scale + actor.action_bias)
    torch.testing.assert_close(log_prob, expected)
    assert (log_std >= sac.LOG_STD_MIN).all() and (log_std <= sac.LOG_STD_MAX).all()
    deterministic = actor.act(x, deterministic=True)
    assert ((deterministic >= torch.as_tensor(BOX.low)) & (deterministic <= torch.as_tensor(BOX.high))).all()


def test_td3_actor_acts_within_bounds_and_explores_with_noise_scaled_to_the_action_range():
    actor = td3.Actor(ENVS, exploration_noise=0.1)
    x = torch.randn(4096, 3)
    deterministic = actor.act(x, deterministic=True)
    assert torch.equal(deterministic, actor.act(x, deterministic=True))
    assert ((deterministic >= torch.as_tensor(BOX.low)) & (deterministic <= torch.as_tensor(BOX.high))).all()
    noise_std = (actor.act(x, deterministic=False) - deterministic).std(0)
    torch.testing.assert_close(noise_std, 0.1 * actor.action_scale, rtol=0.1, atol=0)


def test_twin_critics_compute_two_separate_q_networks_and_the_actor_loss_leaves_them_without_gradients():
    qf = TwinQNetwork(ENVS)
    obs, actions = torch.randn(32, 3), torch.randn(32, 2, requires_grad=True)
    values = qf(obs, actions)
    for i in range(2):  # CleanRL's SoftQNetwork: fc1, relu, fc2, relu, fc3 on [obs, action]
        critic = qf.critics[i]
        x = F.relu(critic.fc1(torch.cat([obs, actions], 1)))
        x = F.relu(critic.fc2(x))
        torch.testing.assert_close(values[i], critic.fc3(x).view(-1))
    qf(obs, actions, critics=slice(0, 1), frozen=True).mean().backward()
    assert all(p.grad is None for p in qf.parameters()) and actions.grad.abs().sum() > 0


def test_sac_updates_on_cleanrls_steps_critics_after_learning_starts_and_the_actor_on_even_steps(monkeypatch, tmp_path):
    # CleanRL's sac_continuous_action.py: its loop variable counts the steps taken before this one; the critics update
    # when it is above --learning-starts, the actor and alpha --policy-frequency times when it is a multiple of it. The
    # loop used to count the step being taken: updates began a step early and the actor updated on odd steps
    steps, updates, targets = [0], [], []
    real_step, real_update, real_target = sac.step_envs, sac.optimizer_step, sac.soft_update

    def step_envs(*args, **kwargs):
        steps[0] += 1
        return real_step(*args, **kwargs)

    def optimizer_step(optimizer, sync, loss):
        tensors = sum(len(group["params"]) for group in optimizer.param_groups)
        updates.append((steps[0] - 1, {12: "critics", 8: "actor", 1: "alpha"}[tensors]))  # at CleanRL's global_step
        return real_update(optimizer, sync, loss)

    def soft_update(target, source, tau):
        targets.append(steps[0] - 1)
        return real_target(target, source, tau)

    monkeypatch.setattr(sac, "step_envs", step_envs)
    monkeypatch.setattr(sac, "optimizer_step", optimizer_step)
    monkeypatch.setattr(sac, "soft_update", soft_update)
    sac.train(sac.Args(env_id="fleetrl_test_envs:StatelessBox-v0", total_timesteps=300, learning_starts=50, batch_size=16, torch_threads=1,
                       cuda=False, env_backend="sync", progress=False, run_dir=str(tmp_path / "run")))
    assert [s for s, what in updates if what == "critics"] == list(range(51, 300)) == targets
    assert [s for s, what in updates if what == "actor"] == [s for s in range(52, 300, 2) for _ in range(2)]
    assert [s for s, what in updates if what == "alpha"] == [s for s in range(52, 300, 2) for _ in range(2)]


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_discrete_actions_are_refused_with_a_clear_error(algo, tmp_path):
    run_dir = tmp_path / "r"
    proc = run_fleetrl_in_process("train", algo, "--env-id", "CartPole-v1", "--run-dir", str(run_dir))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert algo.upper() in proc.stderr and "CartPole-v1" in proc.stderr and "discrete" in proc.stderr, proc.stderr
    assert not run_dir.exists()
