"""C51: CleanRL's projection and initial weights, its loop step for step (lockstep), CartPole learned,
greedy deterministic eval, and bad input refused in one paragraph before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import c51
from fleetrl.monitor.tbread import read_scalars
from fleetrl.nets import categorical_projection

from conftest import assert_train_refused, run_fleetrl, run_fleetrl_here, run_fleetrl_in_process

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SHORT = ["--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--no-progress", "--learning-starts", "1000", "--buffer-size", "2000"]


# ------------------------------------------------------------------------------------------ the algorithm's pieces
def cleanrl_projection(next_pmfs, rewards, dones, gamma, v_min, v_max, n_atoms):
    """CleanRL's c51.py projection, as it writes it (rewards and dones ``(B, 1)``, a loop over the rows)."""
    atoms = torch.linspace(v_min, v_max, steps=n_atoms)
    next_atoms = rewards + gamma * atoms * (1 - dones)
    delta_z = atoms[1] - atoms[0]
    tz = next_atoms.clamp(v_min, v_max)
    b = (tz - v_min) / delta_z
    l = b.floor().clamp(0, n_atoms - 1)  # noqa: E741
    u = b.ceil().clamp(0, n_atoms - 1)
    d_m_l = (u + (l == u).float() - b) * next_pmfs
    d_m_u = (b - l) * next_pmfs
    target_pmfs = torch.zeros_like(next_pmfs)
    for i in range(target_pmfs.size(0)):
        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])
    return target_pmfs


@pytest.mark.parametrize("v_min,v_max,n_atoms", [(-100, 100, 101), (-10, 10, 51), (0, 1, 2)])
def test_the_projection_is_cleanrls_loop_bit_for_bit_and_keeps_each_rows_mass(v_min, v_max, n_atoms):
    g = torch.Generator().manual_seed(0)
    next_pmfs = torch.softmax(torch.randn(256, n_atoms, generator=g) * 3, dim=1)
    rewards = torch.randint(-3, 4, (256,), generator=g).float() * 0.5  # rewards on an atom, between atoms, and beyond v_max
    rewards[:8] = torch.tensor([1e6, -1e6, 0, 0.2, v_max, v_min, 0.5, -0.5])
    dones = (torch.rand(256, generator=g) < 0.3).float()
    atoms = torch.linspace(v_min, v_max, steps=n_atoms)
    ours = categorical_projection(next_pmfs, rewards, dones, 0.99, atoms)
    assert torch.equal(ours, cleanrl_projection(next_pmfs, rewards.unsqueeze(1), dones.unsqueeze(1), 0.99, v_min, v_max, n_atoms))
    torch.testing.assert_close(ours.sum(1), torch.ones(256))
    assert ours.min() >= 0


def test_a_terminal_transition_puts_all_its_mass_on_the_atoms_around_the_reward():
    atoms = torch.linspace(-10, 10, steps=21)  # one atom per unit
    next_pmfs = torch.full((2, 21), 1 / 21)
    target = categorical_projection(next_pmfs, torch.tensor([3.0, 2.5]), torch.tensor([1.0, 1.0]), 0.99, atoms)
    torch.testing.assert_close(target[0, 13], torch.tensor(1.0))  # the atom 3
    torch.testing.assert_close(target[1, 12:14], torch.tensor([0.5, 0.5]))  # half on 2, half on 3


def cleanrl_layers(obs_shape, out):
    nn = torch.nn
    if len(obs_shape) == 1:
        return nn.Sequential(nn.Linear(obs_shape[0], 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, out))
    return nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, out))


@pytest.mark.parametrize("obs_shape,n_atoms", [((4,), 101), ((4, 84, 84), 51)], ids=["mlp", "atari"])
def test_the_network_starts_from_cleanrls_initial_weights_and_gives_its_q_values(obs_shape, n_atoms):
    torch.manual_seed(3)
    ours = c51.QNetwork(obs_shape, 6, n_atoms, -10, 10)
    torch.manual_seed(3)
    theirs = cleanrl_layers(obs_shape, 6 * n_atoms)
    assert all(torch.equal(a, b) for a, b in zip(ours.network.parameters(), theirs.parameters()))
    x = torch.randint(0, 256, (5, *obs_shape), dtype=torch.uint8) if len(obs_shape) == 3 else torch.randn(5, *obs_shape)
    with torch.no_grad():
        logits = theirs(x / 255.0 if len(obs_shape) == 3 else x)
        pmfs = torch.softmax(logits.view(5, 6, n_atoms), dim=2)
        q_values = (pmfs * torch.linspace(-10, 10, steps=n_atoms)).sum(2)
        torch.testing.assert_close(ours(x), q_values)
        action, pmf = ours.get_action(x)
        assert torch.equal(action, q_values.argmax(1)) and torch.allclose(pmf, pmfs[torch.arange(5), action])


def test_greedy_acting_takes_the_best_expected_return_and_epsilon_greedy_explores():
    torch.manual_seed(0)
    q_network = c51.QNetwork((4,), 3)
    x = torch.randn(4000, 4)
    greedy = q_network(x).argmax(1)
    q_network.epsilon = 0.3
    assert torch.equal(q_network.act(x, deterministic=True), greedy)
    differs = (q_network.act(x, deterministic=False) != greedy).float().mean().item()
    assert abs(differs - 0.3 * 2 / 3) < 0.03, differs


# ------------------------------------------------------------------------------------------ CleanRL's loop, step for step
def test_fleetrls_loop_and_cleanrls_c51_take_the_same_actions_updates_target_copies_and_losses_bit_for_bit(monkeypatch):
    # benchmarks/vs_cleanrl.py c51 --lockstep, short: CleanRL's c51.py loop given fleetrl's exploration draws, fused Adam and
    # true final observation at a termination (see cleanrl/loops/c51.py: C51's projection sums the next distribution even when the
    # bootstrap is zeroed, so CleanRL's reset observation there changes the target's last bits) acts, updates, copies the
    # target and computes each loss exactly as fleetrl's does, and both end with the same weights
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from versus import c51 as lockstep

    steps, starts = 3_000, 1_000
    ours = lockstep.fleetrl_trace(seed=3, steps=steps, learning_starts=starts)
    theirs = lockstep.Trace()
    lockstep.plain_c51("CartPole-v1", steps, starts, seed=3, numpy_draws=True, fused_adam=True, final_obs=True, trace=theirs)
    assert len(ours.actions) == steps and ours.actions == theirs.actions
    assert ours.update_steps == theirs.update_steps == [g for g in range(steps) if g > starts and g % 10 == 0]
    assert ours.target_steps == theirs.target_steps == [g for g in range(steps) if g > starts and g % 500 == 0]
    assert ours.losses == theirs.losses
    assert all(torch.equal(ours.final_params[k], theirs.final_params[k]) for k in theirs.final_params)


# ------------------------------------------------------------------------------------------ flags and refusals
REFUSALS = {
    "v_min_not_below_v_max": (["--v-min", "10", "--v-max", "10"], ["--v-min 10", "--v-max 10", "not below"]),
    "one_atom": (["--n-atoms", "1"], ["--n-atoms", "two at least"]),
    "continuous_actions": (["--env-id", "Pendulum-v1"], ["C51", "Pendulum-v1", "fleetrl train"]),
    "async_batch": (["--async-batch", "2"], ["--async-batch"]),
    "policy_lag_2": (["--policy-lag", "2"], ["--policy-lag"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_is_refused_with_a_clear_error_before_anything_runs(tmp_path, case):
    flags, needles = REFUSALS[case]
    assert_train_refused("c51", [*SHORT, *flags], needles, tmp_path / "r")


def test_help_gives_cleanrls_flags_and_family_defaults():
    helped = run_fleetrl_in_process("train", "c51", "--help")  # help's real process: test_dqn.py's
    assert helped.returncode == 0, helped.stderr
    text = " ".join(helped.stdout.replace("│", " ").split())
    for needle in ("--n-atoms", "--v-min", "--v-max", "[101; Atari 51]", "[500; Atari 10000]", "--policy-lag"):
        assert needle in text, needle


# ------------------------------------------------------------------------------------------ learning, resume, eval
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_c51_learns_cartpole_with_cleanrls_defaults_in_40k_steps(tmp_path):
    # the run stops once 10 games average 150 (seed 1: at step 22,044, 151.0; seed 2: 27,779), so the budget is an upper bound
    run_dir = tmp_path / "run"
    proc = run_fleetrl_here("train", "c51", "--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--no-progress",
                            "--total-timesteps", "40000", "--stop-at-return", "150", "--stop-window", "10", "--torch-threads", "1",
                            "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    returns = np.array([p.value for p in read_scalars(run_dir, "charts/episodic_return")])
    best = max(returns[i - 10:i].mean() for i in range(10, len(returns) + 1))
    assert best >= 150, f"best rolling mean of 10 episodes in 40k steps: {best:.1f}"
    assert all(read_scalars(run_dir, tag) for tag in ("losses/loss", "losses/q_values", "charts/epsilon", "charts/SPS"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eval_plays_greedy_with_the_same_returns_for_a_seed(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", "c51", *SHORT, "--total-timesteps", "3000", "--torch-threads", "1", "--run-dir", str(run_dir))
    assert trained.returncode == 0, trained.stderr[-3000:]
    results = []
    # eval's real process, then the same command in this one: the same seed plays the same games either way
    for proc in (run_fleetrl("eval", str(run_dir), "--episodes", "3", "--seed", "5", "--json", timeout=240),
                 run_fleetrl_here("eval", str(run_dir), "--episodes", "3", "--seed", "5", "--json")):
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert results[0]["episodes"] == 3 and results[0] == results[1], results

    state = checkpoint.load_checkpoint(run_dir)

    class Envs:  # the spaces policy_from_checkpoint reads
        import gymnasium as gym
        single_observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        single_action_space = gym.spaces.Discrete(2)
        num_envs = 64

    policy = c51.policy_from_checkpoint(state, Envs(), deterministic=True)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    q_network = c51.QNetwork((4,), 2)
    q_network.load_state_dict(state["q_network"])
    with torch.no_grad():
        assert np.array_equal(policy(obs), q_network(torch.from_numpy(obs)).argmax(1).numpy()), "greedy on the expected returns"
