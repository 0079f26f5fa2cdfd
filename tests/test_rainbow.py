"""Rainbow: CleanRL's network and noise, its loop step for step (lockstep: actions, updates, sampled slots, importance
weights, priorities, losses), CartPole learned, and bad
input refused in one paragraph before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fleetrl.algos import rainbow
from fleetrl.monitor.tbread import read_scalars
from fleetrl.nets import NoisyLinear

from conftest import assert_train_refused, run_fleetrl_here, run_fleetrl_in_process

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SHORT = ["--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--no-progress", "--learning-starts", "1000", "--buffer-size", "2000"]


@pytest.fixture(scope="module")
def cleanrl_rainbow():
    """CleanRL's rainbow_atari.py, its classes verbatim (benchmarks/cleanrl/rainbow_atari.py)."""
    sys.path.insert(0, str(BENCHMARKS / "cleanrl"))
    import rainbow_atari

    return rainbow_atari


# ------------------------------------------------------------------------------------------ the network
@pytest.mark.parametrize("seed", [1, 7])
def test_the_atari_network_is_cleanrls_weights_noise_and_outputs_bit_for_bit(cleanrl_rainbow, seed):
    class Envs:  # what CleanRL's network reads of its envs
        class single_action_space:
            n = 6

    torch.manual_seed(seed)
    theirs = cleanrl_rainbow.NoisyDuelingDistributionalNetwork(Envs, 51, -10, 10)
    torch.manual_seed(seed)
    ours = rainbow.QNetwork((4, 84, 84), 6, 51, -10, 10)
    mine, other = ours.state_dict(), theirs.state_dict()
    assert torch.equal(mine.pop("atoms"), other.pop("support"))
    assert len(mine) == len(other) == 30 and all(torch.equal(a, b) for a, b in zip(mine.values(), other.values()))
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    for _ in range(2):  # the noise of construction, then each network's next draw from the same RNG state
        with torch.no_grad():
            q_values = torch.sum(theirs(frames.float()) * theirs.support, dim=2)  # CleanRL's acting
            assert torch.equal(ours(frames), q_values)
        state = torch.get_rng_state()
        theirs.reset_noise()
        torch.set_rng_state(state)
        ours.reset_noise()


def test_noisy_layers_act_through_their_noise_in_training_and_through_the_mean_in_eval():
    torch.manual_seed(0)
    layer = NoisyLinear(5, 3)
    x = torch.randn(4, 5)
    noisy = layer(x)
    layer.reset_noise()
    assert not torch.equal(layer(x), noisy), "new noise, new outputs"
    layer.eval()
    torch.testing.assert_close(layer(x), x @ layer.weight_mu.T + layer.bias_mu)
    q_network = rainbow.QNetwork((4,), 2)
    obs = torch.randn(256, 4)
    q_network.eval()
    greedy = q_network.act(obs, deterministic=True)
    assert torch.equal(greedy, q_network.act(obs, deterministic=True)), "the mean weights: the same actions every call"
    assert not q_network.head.training, "stochastic acting leaves the network in eval mode"
    draws = [q_network.act(obs, deterministic=False) for _ in range(5)]
    assert any(not torch.equal(d, greedy) for d in draws), "fresh noise changes some actions"


# ------------------------------------------------------------------------------------------ CleanRL's loop, step for step
def test_fleetrls_loop_and_cleanrls_rainbow_take_the_same_actions_samples_priorities_and_losses_bit_for_bit(monkeypatch):
    # benchmarks/vs_cleanrl.py rainbow --lockstep, short: CleanRL's rainbow_atari.py loop (its classes verbatim, an MLP
    # trunk for the CNN, float32 observations in its buffer, fused Adam) on an env whose episodes never end
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from versus import rainbow as lockstep

    steps, starts = 1_600, 300
    ours = lockstep.fleetrl_trace(seed=3, steps=steps, learning_starts=starts)
    theirs = lockstep.Trace()
    lockstep.plain_rainbow("EndlessWalk-v0", steps, starts, seed=3, trace=theirs)
    verdict = lockstep.compare_traces(ours, theirs)
    assert all(v.startswith("identical") for v in verdict.values()), verdict
    assert ours.update_steps == [g for g in range(steps) if g > starts and g % 10 == 0]
    assert ours.target_steps == [500, 1000, 1500]
    assert min(w.min() for w in ours.weights) < 1.0, "the importance weights are not all 1: priorities differ"
    assert len({float(w.min()) for w in ours.weights}) > 10


# ------------------------------------------------------------------------------------------ flags and refusals
REFUSALS = {
    "policy_lag_1": (["--policy-lag", "1"], ["--policy-lag", "priorities"]),
    "n_step_0": (["--n-step", "0"], ["--n-step"]),
    "n_step_beyond_the_buffer": (["--n-step", "1000", "--num-envs", "2"], ["--n-step 1000", "--buffer-size"]),
    "negative_alpha": (["--prioritized-replay-alpha", "-1"], ["--prioritized-replay-alpha"]),
    "beta_above_1": (["--prioritized-replay-beta", "1.5"], ["--prioritized-replay-beta"]),
    "v_min_not_below_v_max": (["--v-min", "10", "--v-max", "10"], ["--v-min 10", "--v-max 10", "not below"]),
    "continuous_actions": (["--env-id", "Pendulum-v1"], ["RAINBOW", "Pendulum-v1"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_is_refused_with_a_clear_error_before_anything_runs(tmp_path, case):
    flags, needles = REFUSALS[case]
    assert_train_refused("rainbow", [*SHORT, *flags], needles, tmp_path / "r")


def test_help_gives_cleanrls_flags_and_family_defaults():
    helped = run_fleetrl_in_process("train", "rainbow", "--help")  # help's real process: test_dqn.py's
    assert helped.returncode == 0, helped.stderr
    text = " ".join(helped.stdout.replace("│", " ").split())
    for needle in ("--n-step", "--prioritized-replay-alpha", "--prioritized-replay-beta", "--prioritized-replay-eps", "--n-atoms",
                   "[2.5e-4; Atari 6.25e-5]", "[500; Atari 8000]"):
        assert needle in text, needle


# ------------------------------------------------------------------------------------------ learning, resume, eval
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_rainbow_learns_cartpole(tmp_path):
    # learning from step 1,000 (the default is 10k): its noisy greedy policy starts near CartPole's floor (about 9 a
    # game; a random policy gets 22) and stays there until its updates spread the noise: 60 at 14k on seed 1 (the run stops there)
    run_dir = tmp_path / "run"
    proc = run_fleetrl_here("train", "rainbow", "--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--no-progress",
                            "--learning-starts", "1000", "--total-timesteps", "30000", "--stop-at-return", "60", "--stop-window", "10",
                            "--torch-threads", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    returns = np.array([p.value for p in read_scalars(run_dir, "charts/episodic_return")])
    best = max(returns[i - 10:i].mean() for i in range(10, len(returns) + 1))
    assert best >= 60, f"best rolling mean of 10 episodes in 30k steps: {best:.1f}"
    assert all(read_scalars(run_dir, tag) for tag in ("losses/td_loss", "losses/q_values", "charts/beta", "charts/SPS"))
