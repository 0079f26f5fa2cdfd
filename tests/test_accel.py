"""Precision, memory format and compile: acting and learning agree in bf16, channels-last changes nothing but speed,
a failing compiler falls back to eager, and a bad --precision is refused clearly."""

import re
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.accel import Accel, choose_accel, native_bf16
from fleetrl.algos.ppo import Agent, Args, ppo_loss
from fleetrl.distributed import Dist
from fleetrl.sampling.acting import TorchActor, make_actor

from conftest import run_fleetrl, run_fleetrl_in_process

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


@pytest.mark.cpu_choice
def test_auto_precision_explains_its_choice_and_measures_only_real_options():
    torch.manual_seed(0)
    mlp = Agent((4,), gym.spaces.Discrete(2))
    choice = choose_accel(mlp, "auto", False, torch.device("cpu"), gym.spaces.Box(-1, 1, (4,)), 64)
    native, why = native_bf16(torch.device("cpu"))
    assert choice.reason.startswith(why) and mlp.compute_dtype == choice.dtype
    if native:  # an MLP has no memory format to choose, so fp32 against bf16 is all there is to measure
        assert "measured" in choice.reason and "fp32" in choice.reason and "bf16" in choice.reason and not choice.channels_last
    else:  # and this CPU emulates bf16: nothing to measure
        assert choice.dtype == torch.float32 and "no native bf16" in choice.reason and "measured" not in choice.reason
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    choice = choose_accel(cnn, "fp32", False, torch.device("cpu"), IMAGE_SPACE, 32)
    assert choice.dtype == torch.float32 and "measured" in choice.reason and "channels-last" in choice.reason
    assert cnn.compute_dtype == torch.float32


@pytest.mark.cpu_choice
@pytest.mark.parametrize("flags, times_ms, want", [
    ((), None, torch.float32),  # no native bf16: fp32 without measuring
    (("avx512_bf16",), {"fp32": 10.0, "bf16": 5.0}, torch.bfloat16),  # native and clearly faster: bf16
    (("amx_bf16",), {"fp32": 10.0, "bf16": 9.0}, torch.float32),  # native but within the margin: fp32 stays
])
def test_auto_precision_for_an_mlp_follows_native_bf16_and_the_measurement(tmp_path, monkeypatch, flags, times_ms, want):
    """Whatever this CPU has: the CPU's flags and the timings are given, so each branch of the auto choice is checked."""
    import fleetrl.accel as accel

    monkeypatch.setenv("FLEETRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(accel, "_cpu_flags", lambda: {"sse2", "avx2", *flags})
    measured = []

    def time_steps(model, settings, example_obs, device):
        measured.append(sorted(s.label for s in settings))
        return {s: times_ms[s.label] / 1e3 for s in settings}

    monkeypatch.setattr(accel, "_time_training_steps", time_steps)
    mlp = Agent((4,), gym.spaces.Discrete(2))
    choice = choose_accel(mlp, "auto", False, torch.device("cpu"), gym.spaces.Box(-1, 1, (4,)), 64)
    assert choice.dtype == want and mlp.compute_dtype == want and not choice.channels_last
    if times_ms is None:
        assert measured == [] and "no native bf16" in choice.reason
    else:
        assert measured == [["bf16", "fp32"]] and f"this CPU has {flags[0]}" in choice.reason and "measured" in choice.reason


@pytest.mark.cpu_choice
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


@pytest.mark.cpu_choice
def test_a_resumed_run_keeps_the_settings_it_was_trained_with(monkeypatch):
    import fleetrl.accel as accel

    monkeypatch.setattr(accel, "_time_training_steps", lambda *a, **k: pytest.fail("a resume measures nothing"))
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    choice = choose_accel(cnn, "auto", False, torch.device("cpu"), IMAGE_SPACE, 32, saved={"dtype": "fp32", "channels_last": True})
    assert choice.state() == {"dtype": "fp32", "channels_last": True} and "resumed" in choice.reason


@pytest.mark.cpu_choice
@pytest.mark.parametrize("cpu_flags", [(), ("avx512_bf16",)], ids=["without-native-bf16", "with-native-bf16"])
@pytest.mark.parametrize("memory_format, channels_last", [("contiguous", False), ("channels-last", True)])
def test_memory_format_pins_the_layout_whatever_the_measurement_would_say(tmp_path, monkeypatch, memory_format, channels_last, cpu_flags):
    """A lockstep against a PyTorch script needs contiguous on every host: a host where channels-last measures faster
    would otherwise round the convolutions another way (CI's host did, and a lockstep parted by 1e-3). On a CPU with
    native bf16, ``--precision auto`` still measures fp32 against bf16, in the pinned layout only; the times given here
    favour the other layout, so a probe that measured it would pick it."""
    import fleetrl.accel as accel

    monkeypatch.setenv("FLEETRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(accel, "_cpu_flags", lambda: {"sse2", "avx2", *cpu_flags})
    measured: list[list[str]] = []

    def time_steps(model, settings, example_obs, device):
        measured.append(sorted(s.label for s in settings))
        return {s: (1.0 if s.channels_last == channels_last else 0.1) for s in settings}

    monkeypatch.setattr(accel, "_time_training_steps", time_steps)
    cnn = Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4))
    choice = choose_accel(cnn, "fp32", False, torch.device("cpu"), IMAGE_SPACE, 32, memory_format=memory_format)
    assert choice.channels_last == channels_last and f"--memory-format {memory_format}" in choice.reason
    assert measured == []  # fp32 in a pinned layout: nothing left to measure
    conv = next(p for p in cnn.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    # a resumed checkpoint trained the other way gives way to the pinned layout; one trained this way is kept
    other = {"dtype": "fp32", "channels_last": not channels_last}
    pinned = choose_accel(Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4)), "auto", False, torch.device("cpu"), IMAGE_SPACE, 32,
                          saved=other, memory_format=memory_format)
    assert pinned.channels_last == channels_last and f"--memory-format {memory_format}" in pinned.reason
    layout = ", channels-last" if channels_last else ""
    assert measured == ([sorted([f"fp32{layout}", f"bf16{layout}"])] if cpu_flags else []), measured  # precision only
    same = {"dtype": "fp32", "channels_last": channels_last}
    kept = choose_accel(Agent(IMAGE_SPACE.shape, gym.spaces.Discrete(4)), "auto", False, torch.device("cpu"), IMAGE_SPACE, 32,
                        saved=same, memory_format=memory_format)
    assert kept.channels_last == channels_last and "resumed" in kept.reason and len(measured) == (1 if cpu_flags else 0)


def test_bad_memory_format_gets_a_clear_error_and_nonzero_exit(tmp_path):
    proc = run_fleetrl_in_process("train", "ppo", "--memory-format", "nhwc", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--memory-format" in proc.stderr and "contiguous" in proc.stderr and "channels-last" in proc.stderr


def test_bad_precision_gets_a_clear_error_and_nonzero_exit(tmp_path):
    proc = run_fleetrl_in_process("train", "ppo", "--precision", "fp16", "--run-dir", str(tmp_path / "run"))
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
    # one iteration (4 envs x 128 steps): the fallback comes at the first learner step
    proc = run_fleetrl("train", "ppo", "--env-id", "CartPole-v1", "--compile", "--total-timesteps", "512",
                       "--run-dir", str(tmp_path / "run"), "--no-progress", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.compile failed" in proc.stderr and "continues eager" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "done: 512 steps" in proc.stdout


# runs `fleetrl` in a process that counts which path each learner step took, and the graphs torch.compile made
COUNTING_DRIVER = """
import json, sys
import torch
from fleetrl import accel, cli

calls = {"compiled": 0, "eager": 0}


class CountedStep(accel.CompiledStep):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        compiled_fn, fn = self.compiled_fn, self.fn

        def compiled(*a, **k):
            calls["compiled"] += 1
            return compiled_fn(*a, **k)

        def eager(*a, **k):
            calls["eager"] += 1
            return fn(*a, **k)

        self.compiled_fn, self.fn = compiled, eager


accel.CompiledStep = CountedStep
try:
    cli.main(sys.argv[1:])
finally:
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] if "torch._dynamo" in sys.modules else 0
    print("learner steps:", json.dumps({**calls, "graphs": graphs}), flush=True)
"""


def _dynamo_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"] if "torch._dynamo" in sys.modules else 0


def _precision_flag(stdout: str) -> list[str]:
    """``--precision X`` for the precision a run's start-up line says it chose (whichever: the compared run repeats it)."""
    return ["--precision", re.search(r"^precision: (fp32|bf16)\b", stdout, re.M).group(1)]


@pytest.mark.slow
def test_compile_trains_the_same_as_eager_when_it_works(tmp_path, monkeypatch):
    """Compiled and eager learner steps give the same run, to float rounding; and with --compile every learner step
    really ran the compiled function (a silent fallback to eager would make the comparison vacuous)."""
    import json
    import subprocess

    import fleetrl.accel as accel
    from conftest import fleetrl_env, run_fleetrl_here

    # 2048 steps: 4 iterations of 4 epochs of 4 minibatches (CartPole's defaults), so 64 learner steps; one torch thread
    # in both runs, as the compiled run's process has
    train = ["train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "2048", "--env-backend", "sync", "--no-progress",
             "--torch-threads", "1"]
    # compiled in a process of its own, which counts the path of each learner step (torch.compile's graphs stay out of this one)
    proc = subprocess.run([sys.executable, "-c", COUNTING_DRIVER, *train, "--compile", "--run-dir", str(tmp_path / "compiled")],
                          capture_output=True, text=True, timeout=300, env=fleetrl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.compile failed" not in proc.stderr and "continues eager" not in proc.stderr, proc.stderr[-3000:]
    assert "compile: learner step compiled in" in proc.stdout, proc.stdout[-3000:]
    steps = json.loads(proc.stdout.split("learner steps:")[-1])
    # the compiled function ran the 64 steps (and once more for the check that it compiles), eager never
    assert steps["compiled"] == 64 + 1 and steps["eager"] == 0, steps
    assert steps["graphs"] >= 1, f"torch.compile made no graph: the 'compiled' step ran eager ({steps})"

    # eager here, in the test's process: no compiled step is built, no graph made
    built = []

    class NeverBuilt(accel.CompiledStep):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(accel, "CompiledStep", NeverBuilt)
    graphs = _dynamo_graphs()
    # at the compiled run's precision: --precision auto measures again here (this process's cache key differs) and, on a
    # CPU with native bf16, may choose the other one
    same_precision = _precision_flag(proc.stdout)
    eager = run_fleetrl_here(*train, "--no-compile", *same_precision, "--run-dir", str(tmp_path / "eager"))
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert built == [] and _dynamo_graphs() == graphs, "--no-compile built a compiled step"

    models = {name: torch.load(next((tmp_path / name / "checkpoints").glob("*.pt")), weights_only=True)["model"]
              for name in ("compiled", "eager")}
    for name, value in models["compiled"].items():
        torch.testing.assert_close(value, models["eager"][name], atol=1e-4, rtol=1e-3)
