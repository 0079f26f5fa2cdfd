"""Precision, memory format and compile: acting and learning agree in bf16, channels-last changes nothing but speed,
a failing compiler falls back to eager, and a bad --precision is refused clearly."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.accel import Accel, choose_accel, native_bf16
from fleetrl.algos.ppo import Agent, Args, ppo_loss
from fleetrl.distributed import Dist
from fleetrl.sampling.acting import TorchActor, make_actor

from conftest import run_fleetrl

IMAGE_SPACE = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def _first_minibatch_stats(agent: Agent, obs: np.ndarray) -> dict[str, float]:
    """Act on ``obs`` as the sampler does, then evaluate the same batch as the learner's first minibatch does."""
    actor = make_actor(agent, torch.device("cpu"), seed=0)
    actions, logprobs, values = actor.act(obs)
    zeros = torch.zeros(len(obs))
    mb = {"obs": torch.as_tensor(obs), "actions": torch.as_tensor(actions), "logprobs": torch.as_tensor(logprobs),
          "values": torch.as_tensor(values), "advantages": torch.randn(len(obs)), "returns": zeros}
    _, stats = ppo_loss(agent, mb, Args(clip_coef=0.1, ent_coef=0.01), Dist())
    return {k: float(v) for k, v in stats.items()}


@pytest.mark.parametrize("space", [IMAGE_SPACE, gym.spaces.Box(-1, 1, (8,), np.float32)], ids=["cnn", "mlp"])
def test_bf16_acting_and_learning_agree_on_the_first_minibatch(space):
    torch.manual_seed(0)
    agent = Agent(space.shape, gym.spaces.Discrete(6))
    Accel(torch.bfloat16).apply(agent)
    obs = np.random.default_rng(0).integers(0, 255, (64, *space.shape)).astype(space.dtype)
    assert isinstance(make_actor(agent, torch.device("cpu"), seed=0), TorchActor)  # the numpy path is fp32 only
    with torch.inference_mode():
        logits, value = agent(torch.as_tensor(obs))
    assert logits.dtype == torch.float32 and value.dtype == torch.float32  # only the network ran in bf16
    stats = _first_minibatch_stats(agent, obs)
    assert abs(stats["approx_kl"]) < 1e-4
    assert stats["clipfrac"] == 0.0


def test_bf16_really_changes_the_network_arithmetic():
    """The check above must not pass because bf16 was silently ignored."""
    torch.manual_seed(0)
    agent = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(6))
    x = torch.randint(0, 255, (8, *IMAGE_SPACE.shape), dtype=torch.uint8)
    with torch.no_grad():
        fp32_logits, _ = agent(x)
        Accel(torch.bfloat16).apply(agent)
        bf16_logits, _ = agent(x)
    assert not torch.equal(fp32_logits, bf16_logits)
    torch.testing.assert_close(bf16_logits, fp32_logits, atol=0.05, rtol=0.05)


def test_channels_last_keeps_outputs_and_checkpoints_compatible():
    torch.manual_seed(0)
    agent = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    x = torch.randint(0, 255, (16, *IMAGE_SPACE.shape), dtype=torch.uint8)
    with torch.no_grad():
        before = agent(x)
        Accel(channels_last=True).apply(agent)
        after = agent(x)
    assert agent.trunk.net[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    plain = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    plain.load_state_dict(agent.state_dict())  # evaluation builds a plain agent from the checkpoint
    with torch.no_grad():
        torch.testing.assert_close(plain(x)[0], before[0], atol=1e-5, rtol=1e-5)


def test_auto_precision_explains_its_choice_and_measures_only_real_options():
    torch.manual_seed(0)
    mlp = Agent((4,), gym.spaces.Discrete(2))
    choice = choose_accel(mlp, "auto", False, torch.device("cpu"), gym.spaces.Box(-1, 1, (4,)), 64)
    native, why = native_bf16(torch.device("cpu"))
    if not native:  # an MLP has no memory format to choose and this CPU emulates bf16: nothing to measure
        assert choice.dtype == torch.float32 and "no native bf16" in choice.reason and "measured" not in choice.reason
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    choice = choose_accel(cnn, "fp32", False, torch.device("cpu"), IMAGE_SPACE, 32)
    assert choice.dtype == torch.float32 and "measured" in choice.reason and "channels-last" in choice.reason
    assert cnn.compute_dtype == torch.float32


def test_the_measured_choice_is_cached_so_a_busy_machine_repeats_it(tmp_path, monkeypatch):
    import fleetrl.accel as accel

    monkeypatch.setenv("FLEETRL_CACHE_DIR", str(tmp_path))
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    first = choose_accel(cnn, "fp32", False, torch.device("cpu"), IMAGE_SPACE, 32)
    assert "measured a training step" in first.reason and (tmp_path / "accel.json").exists()
    monkeypatch.setattr(accel, "_time_training_steps", lambda *a, **k: pytest.fail("timed again"))
    again = choose_accel(Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4)), "fp32", False, torch.device("cpu"), IMAGE_SPACE, 32)
    assert again.state() == first.state() and "cached in" in again.reason
    # another batch size is another measurement
    with pytest.raises(pytest.fail.Exception, match="timed again"):
        choose_accel(Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4)), "fp32", False, torch.device("cpu"), IMAGE_SPACE, 16)


def test_a_resumed_run_keeps_the_settings_it_was_trained_with(monkeypatch):
    import fleetrl.accel as accel

    monkeypatch.setattr(accel, "_time_training_steps", lambda *a, **k: pytest.fail("a resume measures nothing"))
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    choice = choose_accel(cnn, "auto", False, torch.device("cpu"), IMAGE_SPACE, 32, saved={"dtype": "fp32", "channels_last": True})
    assert choice.state() == {"dtype": "fp32", "channels_last": True} and "resumed" in choice.reason


def test_bad_precision_gets_a_clear_error_and_nonzero_exit(tmp_path):
    proc = run_fleetrl("train", "ppo", "--precision", "fp16", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert proc.returncode != 0
    assert "--precision" in proc.stderr and "fp32" in proc.stderr and "bf16" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_compile_falls_back_to_eager_when_the_compiler_fails(tmp_path, monkeypatch):
    """A real failure: inductor cannot find its C++ compiler (and no cached kernels hide that)."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    proc = run_fleetrl("train", "ppo", "--env-id", "CartPole-v1", "--compile", "--total-timesteps", "2048",
                       "--run-dir", str(tmp_path / "run"), "--no-progress", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.compile failed" in proc.stderr and "continues eager" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "done: 2,048 steps" in proc.stdout


@pytest.mark.slow
def test_compile_trains_the_same_as_eager_when_it_works(tmp_path):
    """Compiled and eager learner steps give the same run, to float rounding."""
    returns = {}
    for flag in ("--compile", "--no-compile"):
        proc = run_fleetrl("train", "ppo", "--env-id", "CartPole-v1", flag, "--total-timesteps", "4096", "--env-backend", "sync",
                           "--run-dir", str(tmp_path / flag), "--no-progress", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = torch.load(next((tmp_path / flag / "checkpoints").glob("*.pt")), weights_only=True)
        returns[flag] = state["model"]
    for name, value in returns["--compile"].items():
        torch.testing.assert_close(value, returns["--no-compile"][name], atol=1e-4, rtol=1e-3)
