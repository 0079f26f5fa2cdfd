"""The worked examples in examples/: examples/rpo.py (CleanRL's RPO, made from `fleetrl new rpo --from ppo`) trains, checkpoints
and evaluates as a user's file, and perturbs the Gaussian mean in the update only, never in the rollout's sampling."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import require_module, run_fleetrl_here

from fleetrl import checkpoint
from fleetrl.algos.source import import_file, sha256_of
from fleetrl.sampling.acting import NumpyMLPActor, TorchActor, make_actor

ROOT = Path(__file__).resolve().parent.parent
RPO_FILE = ROOT / "examples" / "rpo.py"
ALPHA = 0.5  # RPO's default


@pytest.fixture(scope="module")
def rpo():
    """examples/rpo.py imported as a user's file is (module ``rpo``, its folder on the path), removed again afterwards."""
    added = str(RPO_FILE.parent) not in sys.path
    module = import_file(str(RPO_FILE))
    yield module
    sys.modules.pop("rpo", None)
    if added and str(RPO_FILE.parent) in sys.path:
        sys.path.remove(str(RPO_FILE.parent))


def agents(rpo, action_dim: int, obs_dim: int = 5):
    """The same network twice: with RPO's noise (alpha 0.5) and without it (alpha 0)."""
    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
    noisy = rpo.Agent((obs_dim,), space, rpo_alpha=ALPHA)
    plain = rpo.Agent((obs_dim,), space, rpo_alpha=0.0)
    plain.load_state_dict(noisy.state_dict())
    with torch.no_grad():  # a log-std away from 0, so the test also sees it used
        noisy.actor_logstd.fill_(-0.3)
        plain.actor_logstd.fill_(-0.3)
    return noisy, plain


def unperturbed(agent, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of ``actions`` under the policy's own Gaussian: forward()'s mean, exp(actor_logstd)."""
    with torch.no_grad():
        mean, _ = agent(obs)
        normal = torch.distributions.Normal(mean, agent.actor_logstd.exp().expand_as(mean))
        return normal.log_prob(actions).sum(-1), normal.entropy().sum(-1)


def test_rpo_update_evaluates_actions_under_a_mean_moved_by_uniform_noise_of_at_most_alpha(rpo):
    noisy, plain = agents(rpo, action_dim=1)
    obs = torch.randn(4000, 5)
    with torch.no_grad():
        mean, value = noisy(obs)
    actions = mean.clone()  # at the mean, log p = -z^2 / (2 sigma^2) - log sigma - log sqrt(2 pi): z's size can be read back
    torch.manual_seed(1)
    with torch.no_grad():
        logprob, entropy, new_value = noisy.evaluate({"obs": obs, "actions": actions})
        plain_logprob, plain_entropy, _ = plain.evaluate({"obs": obs, "actions": actions})
    logprob0, entropy0 = unperturbed(noisy, obs, actions)

    torch.testing.assert_close(plain_logprob, logprob0)  # alpha 0: the policy's own Gaussian
    assert not torch.allclose(logprob, logprob0, atol=1e-3)  # alpha 0.5: another one
    torch.testing.assert_close(entropy, entropy0)  # moving the mean changes no entropy
    torch.testing.assert_close(plain_entropy, entropy0)
    torch.testing.assert_close(new_value, value)  # nor the critic

    sigma = math.exp(-0.3)
    z_squared = (-2 * sigma**2 * (logprob + math.log(sigma) + 0.5 * math.log(2 * math.pi))).clamp_min(0)
    z = z_squared.sqrt()
    assert z.max() <= ALPHA + 1e-4  # bounded by alpha
    assert z.max() > 0.98 * ALPHA and z.min() < 0.02 * ALPHA  # and fills [0, alpha]: a fresh draw per row
    # uniform on [-alpha, alpha]: E[z^2] = alpha^2 / 3 (the standard error over 4000 rows is 0.005 alpha^2)
    assert abs(z_squared.mean().item() - ALPHA**2 / 3) < 0.03 * ALPHA**2


def test_rpo_noise_is_drawn_per_action_element_and_anew_each_update(rpo):
    noisy, _ = agents(rpo, action_dim=3)
    obs = torch.randn(2000, 5)
    with torch.no_grad():
        actions = noisy(obs)[0].clone()
        first = noisy.evaluate({"obs": obs, "actions": actions})[0]
        second = noisy.evaluate({"obs": obs, "actions": actions})[0]
    assert not torch.equal(first, second)  # a new draw each minibatch
    sigma = math.exp(-0.3)
    sum_z_squared = -2 * sigma**2 * (first + 3 * (math.log(sigma) + 0.5 * math.log(2 * math.pi)))
    assert sum_z_squared.max() <= 3 * ALPHA**2 + 1e-3
    # three independent elements: Var[sum z^2] = 3 * 4 alpha^4 / 45; one z shared by the three would give 9 * 4 alpha^4 / 45
    var = sum_z_squared.var().item()
    assert 0.7 * 12 / 45 * ALPHA**4 < var < 1.3 * 12 / 45 * ALPHA**4


@pytest.mark.parametrize("actor_type", [NumpyMLPActor, TorchActor])
def test_rpo_rollout_samples_from_the_unperturbed_policy(rpo, actor_type):
    """What the engine's sampler calls each step (fleetrl/sampling/acting.py) acts alike with and without rpo_alpha, from the
    policy's own Gaussian: numpy's fast path for MLPs on the CPU, and torch's (GPUs, bf16), which calls the agent's forward."""
    noisy, plain = agents(rpo, action_dim=2)
    cpu = torch.device("cpu")
    make = (lambda agent: make_actor(agent, cpu, seed=3)) if actor_type is NumpyMLPActor else (lambda agent: TorchActor(agent, cpu, seed=3))
    noisy_actor, plain_actor = make(noisy), make(plain)
    assert type(noisy_actor) is actor_type
    obs = np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32)
    noise = np.random.default_rng(1).standard_normal((64, 2)).astype(np.float32)
    action, logprob, value = noisy_actor.act(obs, noise)
    plain_action, plain_logprob, plain_value = plain_actor.act(obs, noise)
    np.testing.assert_array_equal(action, plain_action)
    np.testing.assert_array_equal(logprob, plain_logprob)
    np.testing.assert_array_equal(value, plain_value)

    with torch.no_grad():
        mean = noisy(torch.as_tensor(obs))[0].numpy()
    np.testing.assert_allclose(action, mean + math.exp(-0.3) * noise, rtol=1e-5, atol=1e-5)  # the mean, not a moved one
    expected, _ = unperturbed(noisy, torch.as_tensor(obs), torch.as_tensor(action))
    np.testing.assert_allclose(logprob, expected.numpy(), rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and the evaluation policy's deterministic action is the mean
        np.testing.assert_array_equal(noisy.act(torch.as_tensor(obs), deterministic=True).numpy(), mean)


def test_rpo_file_trains_checkpoints_and_evaluates_as_a_users_file(tmp_path):
    """`fleetrl train examples/rpo.py` and `fleetrl eval` in this process (a user's file trains as a process of its own in
    test_user_algos.py); the module ``rpo`` it imports is forgotten after, unless the fixture above had it already."""
    require_module("mujoco", "mujoco")
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", str(RPO_FILE), "--env-id", "InvertedPendulum-v5", "--total-timesteps", "512", "--num-steps", "256",
                               "--num-minibatches", "4", "--update-epochs", "2", "--rpo-alpha", "0.3", "--run-dir", str(run_dir), "--no-progress",
                               cwd=tmp_path, user_code=RPO_FILE.parent)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "fleetrl rpo: InvertedPendulum-v5" in trained.stdout, trained.stdout[-2000:]
    (ckpt,) = checkpoint.list_checkpoints(run_dir)
    state = checkpoint.load_checkpoint(ckpt)
    assert state["global_step"] == 512 and state["algo"] == "rpo"
    assert state["args"]["rpo_alpha"] == 0.3 and state["args"]["exp_name"] == "rpo"
    assert state["algo_file"]["path"] == str(RPO_FILE) and state["algo_file"]["sha256"] == sha256_of(RPO_FILE)

    evaluated = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", cwd=tmp_path, user_code=RPO_FILE.parent)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert "InvertedPendulum-v5 @ step 512: return" in evaluated.stdout, evaluated.stdout[-2000:]
