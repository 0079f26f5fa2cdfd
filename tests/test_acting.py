"""The lean action helpers and the numpy acting path agree with torch.distributions and the learner."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from fleetrl.algos.ppo import Agent
from fleetrl.nets import categorical_logprob_entropy, categorical_sample, gaussian_logprob_entropy, gaussian_sample
from fleetrl.sampling.acting import (NumpyMLPActor, QValueActor, TorchActor, host_categorical_q_values, host_forward,
                                     make_actor)


def test_categorical_helpers_match_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(1000, 5)
    action, logprob = categorical_sample(logits)
    dist = Categorical(logits=logits)
    torch.testing.assert_close(logprob, dist.log_prob(action))
    lp, ent = categorical_logprob_entropy(logits, action)
    torch.testing.assert_close(lp, dist.log_prob(action))
    torch.testing.assert_close(ent, dist.entropy())


def test_categorical_sample_frequencies_follow_the_probabilities():
    torch.manual_seed(1)
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(200_000, 3)
    action, _ = categorical_sample(logits)
    freq = torch.bincount(action, minlength=3).float() / len(action)
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.005, rtol=0)


def test_gaussian_helpers_match_torch_distributions():
    torch.manual_seed(2)
    mean, logstd = torch.randn(100, 3), torch.randn(1, 3) * 0.3
    action, logprob = gaussian_sample(mean, logstd)
    dist = Normal(mean, logstd.exp().expand_as(mean))
    torch.testing.assert_close(logprob, dist.log_prob(action).sum(-1))
    lp, ent = gaussian_logprob_entropy(mean, logstd, action)
    torch.testing.assert_close(lp, dist.log_prob(action).sum(-1))
    torch.testing.assert_close(ent, dist.entropy().sum(-1))


def test_numpy_actor_agrees_with_the_learner_for_discrete_and_continuous_agents():
    for space in (gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)):
        torch.manual_seed(3)
        agent = Agent((6,), space)
        if isinstance(space, gym.spaces.Box):
            with torch.no_grad():
                agent.actor_logstd.fill_(-0.5)
        actor = make_actor(agent, torch.device("cpu"), seed=0)
        assert isinstance(actor, NumpyMLPActor)
        obs = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
        action, logprob, value = actor.act(obs)
        with torch.no_grad():
            lp, _, v = agent.evaluate({"obs": torch.as_tensor(obs), "actions": torch.as_tensor(action)})
        np.testing.assert_allclose(logprob, lp.numpy(), atol=1e-5)
        np.testing.assert_allclose(value, v.numpy(), atol=1e-5)
        np.testing.assert_allclose(actor.value(obs), v.numpy(), atol=1e-5)


def test_numpy_actor_sees_in_place_parameter_updates_without_a_copy():
    agent = Agent((4,), gym.spaces.Discrete(2))
    actor = make_actor(agent, torch.device("cpu"), seed=0)
    obs = np.ones((2, 4), np.float32)
    before = actor.value(obs).copy()
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.1, fused=True)
    agent.get_value(torch.as_tensor(obs)).sum().backward()
    optimizer.step()
    with torch.no_grad():
        now = agent.get_value(torch.as_tensor(obs)).numpy()
    assert not np.allclose(before, now)
    np.testing.assert_allclose(actor.value(obs), now, atol=1e-5)


def test_cnn_agents_act_through_torch():
    agent = Agent((4, 84, 84), gym.spaces.Discrete(4))
    actor = make_actor(agent, torch.device("cpu"), seed=0)
    assert isinstance(actor, TorchActor)
    action, logprob, value = actor.act(np.zeros((2, 4, 84, 84), np.uint8))
    assert action.shape == (2,) and logprob.shape == (2,) and value.shape == (2,)


def test_host_forward_matches_torch_and_sees_the_optimisers_in_place_steps_and_a_load():
    from fleetrl.algos.dqn import QNetwork

    torch.manual_seed(0)
    q_network = QNetwork((4,), 2)
    q_values_of = host_forward(q_network.network, torch.device("cpu"))
    obs = np.random.default_rng(0).standard_normal((5, 4))  # float64, as CartPole gives them

    def torch_q_values():
        with torch.no_grad():
            return q_network(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    np.testing.assert_allclose(q_values_of(obs), torch_q_values(), rtol=1e-5, atol=1e-6)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=0.1, fused=True)
    q_network(torch.as_tensor(obs, dtype=torch.float32)).square().mean().backward()
    optimizer.step()
    np.testing.assert_allclose(q_values_of(obs), torch_q_values(), rtol=1e-5, atol=1e-6)  # no copy to refresh
    q_network.load_state_dict(QNetwork((4,), 2).state_dict())  # a resume copies in place too
    np.testing.assert_allclose(q_values_of(obs), torch_q_values(), rtol=1e-5, atol=1e-6)

    cnn = QNetwork((4, 84, 84), 3)  # not an MLP: runs in torch, uint8 frames in
    frames = np.random.default_rng(1).integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        expected = cnn(torch.as_tensor(frames)).numpy()
    np.testing.assert_allclose(host_forward(cnn.network, torch.device("cpu"))(frames), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("obs_dim, num_actions, n_atoms, v_max", [(4, 2, 101, 100.0), (8, 6, 51, 10.0)], ids=["cartpole", "atari-atoms"])
def test_c51_q_values_in_numpy_match_torch_and_its_argmax_and_see_the_optimisers_steps(obs_dim, num_actions, n_atoms, v_max):
    # C51 acts on the argmax of numpy's softmax and expected return (host_categorical_q_values); torch's are the reference.
    # Each Q-value sums n_atoms products of up to |v_max| each, so float32 rounding is relative to the atoms' scale.
    from fleetrl.algos.c51 import QNetwork

    torch.manual_seed(0)
    q_network = QNetwork((obs_dim,), num_actions, n_atoms, -v_max, v_max)
    q_values_of = host_categorical_q_values(q_network, torch.device("cpu"))
    assert "torch_forward" not in q_values_of.__qualname__  # the numpy path, not the fallback
    optimizer = torch.optim.Adam(q_network.parameters(), lr=0.05, fused=True)
    rng = np.random.default_rng(0)
    for step in range(4):  # the initial network, then sharper distributions after in-place optimiser steps
        obs = rng.standard_normal((2000, obs_dim)) * 3  # float64, as CartPole gives them
        with torch.no_grad():
            expected = q_network(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        q_values = q_values_of(obs)
        assert q_values.dtype == np.float32 and q_values.shape == (2000, num_actions)
        assert np.abs(q_values - expected).max() <= 1e-6 * v_max
        np.testing.assert_array_equal(q_values.argmax(1), expected.argmax(1))
        logits = q_network.network(torch.as_tensor(obs[:64], dtype=torch.float32)).view(64, num_actions, n_atoms)
        (-logits[..., -1].log_softmax(0)).mean().backward()  # push mass to the last atom: the pmfs sharpen
        optimizer.step()
        optimizer.zero_grad()
    q_network.load_state_dict(QNetwork((obs_dim,), num_actions, n_atoms, -v_max, v_max).state_dict())  # a resume, in place
    with torch.no_grad():
        expected = q_network(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    assert np.abs(q_values_of(obs) - expected).max() <= 1e-6 * v_max

    cnn = QNetwork((4, 84, 84), 3, n_atoms, -v_max, v_max)  # not an MLP: the whole module runs in torch
    frames = np.random.default_rng(1).integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        expected = cnn(torch.as_tensor(frames)).numpy()
    np.testing.assert_array_equal(host_categorical_q_values(cnn, torch.device("cpu"))(frames), expected)


def test_pqn_acts_from_its_layernorm_mlps_own_torch_functions_bit_for_bit_and_sees_the_optimisers_steps_and_a_load():
    # PQN's values feed its Q(lambda) returns, which the lockstep with CleanRL requires bit for bit (tests/test_pqn.py):
    # so its actor calls torch's LayerNorm MLP functions without the modules, never numpy, and must equal the module
    from fleetrl.algos.pqn import QNetwork

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    q_network = QNetwork((4,), gym.spaces.Discrete(3))
    actor, reference = make_actor(q_network, cpu, seed=5), TorchActor(q_network, cpu, seed=5)
    assert isinstance(actor, QValueActor)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    for step in range(4):  # the initial network, then after in-place optimiser steps
        obs = rng.standard_normal((2000, 4)) * 3  # float64, as CartPole gives them
        with torch.no_grad():
            expected = q_network.q_values(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        q_values = actor.q_values(obs)
        assert q_values.dtype == np.float32
        np.testing.assert_array_equal(q_values, expected)
        np.testing.assert_array_equal(actor.value(obs), expected.max(1))
        for got, want in zip(actor.greedy(obs) + reference.greedy(obs), (expected.argmax(1), expected.max(1)) * 2):
            np.testing.assert_array_equal(got, want)  # PQN's acting: torch's argmax of the Q-values and the value there
        noise = rng.exponential(size=(2000, 3))
        for got, want in zip(actor.act(obs, np.ones_like(noise)) + actor.act(obs, noise),
                             reference.act(obs, np.ones_like(noise)) + reference.act(obs, noise)):
            np.testing.assert_array_equal(got, want)  # draws without and with Gumbel noise: actions, log-probs, values
        q_network.q_values(torch.as_tensor(obs[:64], dtype=torch.float32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    q_network.load_state_dict(QNetwork((4,), gym.spaces.Discrete(3)).state_dict())  # a resume copies in place
    with torch.no_grad():
        expected = q_network.q_values(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    np.testing.assert_array_equal(actor.q_values(obs), expected)
    np.testing.assert_array_equal(actor.noise(3), reference.noise(3))  # the same RNG stream as the torch actor's

    assert isinstance(make_actor(QNetwork((4, 84, 84), gym.spaces.Discrete(3)), cpu, seed=0), TorchActor)  # a CNN: torch
    q_network.compute_dtype = torch.bfloat16
    assert isinstance(make_actor(q_network, cpu, seed=0), TorchActor)  # bf16 acts as it learns


@pytest.mark.parametrize("obs_shape, impala", [((4, 84, 84), False), ((64, 64, 3), True), ((3, 64, 64), True)],
                         ids=["atari-nature", "procgen-impala-hwc", "impala-chw"])
def test_ppo_image_networks_give_their_first_conv_the_frames_divided_by_255(obs_shape, impala):
    # CleanRL's ppo_atari.py and ppo_procgen.py scale uint8 frames to [0, 1] before the first conv; a network that
    # forgot (or scaled twice) still runs and even learns a little, so check what the first conv is given
    agent = Agent(obs_shape, gym.spaces.Discrete(6), impala=impala)
    first_conv = next(m for m in agent.modules() if isinstance(m, torch.nn.Conv2d))
    seen = []
    first_conv.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].detach().clone()))
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, *obs_shape), dtype=np.uint8))
    with torch.no_grad():
        agent(frames)
    chw = frames.permute(0, 3, 1, 2) if obs_shape[-1] == 3 else frames
    torch.testing.assert_close(seen[0], chw.float() / 255.0)


# --actor-device auto: measured once per machine (cached, as the precision is) and kept by a resumed run. There is no
# GPU here, so the decision is checked with a learner device named "cuda" and a timing the test makes up; nothing is
# ever put on that device.
FAKE_GPU = torch.device("cuda", 0)


def test_auto_actor_device_is_measured_once_then_cached_so_a_busy_machine_repeats_it(tmp_path, monkeypatch):
    from fleetrl.sampling.acting import choose_actor_device

    monkeypatch.setenv("FLEETRL_CACHE_DIR", str(tmp_path))
    quiet = {"cpu": 2e-3, "cuda": 1e-3}  # the GPU acts faster on a quiet machine
    busy = {"cpu": 1e-3, "cuda": 5e-3}  # the same command beside another job's kernels
    device, reason, remembered = choose_actor_device("auto", FAKE_GPU, lambda d: quiet[d.type], lambda: "key-1")
    assert device == FAKE_GPU and remembered == "learner" and "measured" in reason and (tmp_path / "accel.json").exists()
    again, reason, _ = choose_actor_device("auto", FAKE_GPU, lambda d: busy[d.type], lambda: "key-1")
    assert again == FAKE_GPU and "cached in" in reason
    other, _, remembered = choose_actor_device("auto", FAKE_GPU, lambda d: busy[d.type], lambda: "key-2")  # another network
    assert other == torch.device("cpu") and remembered == "cpu"


def test_auto_actor_device_keeps_what_a_resumed_checkpoint_acted_on_without_timing(tmp_path, monkeypatch):
    from fleetrl.sampling.acting import choose_actor_device

    monkeypatch.setenv("FLEETRL_CACHE_DIR", str(tmp_path))

    def never(device):
        pytest.fail("a resume times nothing")

    for saved, want in (("cpu", torch.device("cpu")), ("learner", FAKE_GPU)):
        device, reason, remembered = choose_actor_device("auto", FAKE_GPU, never, lambda: "key", saved=saved)
        assert device == want and remembered == saved and "resumed checkpoint" in reason
    # the flag given again wins over the checkpoint
    assert choose_actor_device("learner", FAKE_GPU, never, lambda: "key", saved="cpu")[0] == FAKE_GPU


def test_a_checkpoint_remembers_where_auto_acted_and_a_resume_acts_there(tmp_path):
    from conftest import run_fleetrl_in_process
    from fleetrl.checkpoint import load_checkpoint

    run_dir = str(tmp_path / "run")
    common = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--run-dir", run_dir]
    first = run_fleetrl_in_process("train", "ppo", *common, "--total-timesteps", "64")
    assert first.returncode == 0, first.stderr[-2000:]
    assert load_checkpoint(run_dir)["remembered"]["actor_device"] == "cpu"
    resumed = run_fleetrl_in_process("train", "ppo", *common, "--total-timesteps", "128", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "acting on cpu (auto: as the resumed checkpoint acted (cpu))" in resumed.stdout, resumed.stdout
