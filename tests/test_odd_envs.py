"""Odd environments train, or stop with one clear message naming the env and the step (never a traceback).

The envs are in tests/fleetrl_test_envs.py (`fleetrl_test_envs:Uint8Obs-v0`, ...). The fast tests check each
piece; the slow ones run the real CLI (its entry point in the test's process, or a process where env workers run).
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import fleetrl_test_envs  # noqa: F401 - registers the odd envs
from conftest import run_fleetrl, run_fleetrl_in_process
from fleetrl import checkpoint
from fleetrl.algos import ppo
from fleetrl.algos.ppo import Agent, rollout
from fleetrl.envs import registry
from fleetrl.envs.registry import EnvFactory
from fleetrl.envs.spaces import check_spaces
from fleetrl.envs.vector import SyncVectorEnv
from fleetrl.envs.wrappers import CheckOutputs
from fleetrl.errors import EnvOutputError, UnsupportedSpaceError
from fleetrl.monitor.timing import PhaseTimer
from fleetrl.nets import network_obs_dtype
from fleetrl.sampling.acting import TorchActor
from fleetrl.sampling.sampler import Sampler

ODD = "fleetrl_test_envs:"


# ---------------------------------------------------------------- observation dtypes


@pytest.mark.parametrize("shape, dtype, stored", [
    ((4, 84, 84), np.uint8, np.uint8),  # an image: bytes for the CNN
    ((8,), np.uint8, np.float32),  # a vector of bytes: the MLP
    ((4,), np.int64, np.float32),
    ((4,), np.float64, np.float32),
    ((4,), np.bool_, np.float32),
    ((3, 64, 64), np.float32, np.float32),
])
def test_only_uint8_images_stay_bytes(shape, dtype, stored):
    assert network_obs_dtype(shape, dtype) == stored


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float64, np.bool_])
def test_the_torch_actor_feeds_vector_observations_of_any_dtype_to_the_mlp_as_float32(dtype):
    torch.manual_seed(0)
    agent = Agent((8,), gym.spaces.Discrete(2))
    obs = np.random.default_rng(0).integers(0, 2 if dtype == np.bool_ else 200, (3, 8)).astype(dtype)
    noise = np.ones((3, 2))
    action, logprob, value = TorchActor(agent, torch.device("cpu")).act(obs, noise)  # uint8 crashed in nn.Linear
    expected = TorchActor(agent, torch.device("cpu")).act(obs.astype(np.float32), noise)
    np.testing.assert_array_equal(action, expected[0])
    np.testing.assert_allclose(value, expected[2])


def test_a_uint8_vector_env_fills_float32_storage_that_the_learner_takes():
    envs = SyncVectorEnv([EnvFactory(ODD + "Uint8Obs-v0", "classic") for _ in range(2)])
    torch.manual_seed(0)
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    sampler = Sampler(envs, agent, 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer())
    try:
        buffer = sampler.collect()
    finally:
        sampler.close()
    batch = buffer.flat()
    assert batch["obs"].dtype == torch.float32 and batch["obs"].max() > 1  # the byte values, unscaled
    logprob, _, value = agent.evaluate(batch)  # the first update's forward
    assert torch.isfinite(logprob).all() and torch.isfinite(value).all()


# ---------------------------------------------------------------- Dict and Tuple observations


@pytest.mark.parametrize("env_id, size", [("DictObs-v0", 3 + 3), ("TupleObs-v0", 2 + 4)])
def test_dict_and_tuple_observations_are_flattened_once_said(env_id, size, capsys, monkeypatch):
    monkeypatch.setattr(registry, "_ANNOUNCED", set())
    envs = SyncVectorEnv([EnvFactory(ODD + env_id, "classic") for _ in range(2)])
    try:
        assert envs.single_observation_space.shape == (size,)
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(np.zeros(2, np.int64))
        assert obs.shape == (2, size)
    finally:
        envs.close()
    said = [line for line in capsys.readouterr().out.splitlines() if "flattened" in line]
    assert len(said) == 1 and ODD + env_id in said[0] and f"to Box({size},) for the network" in said[0], said


# ---------------------------------------------------------------- the output check


@pytest.mark.parametrize("env_id, needles", [
    ("NanObs-v0", ["non-finite observation", "1 NaN", "step 5 of its episode 1"]),
    ("InfReward-v0", ["non-finite reward (inf)", "step 7 of its episode 1"]),
    ("WrongStepShape-v0", ["shape (5,)", "says (4,)", "step 4 of its episode 1"]),
])
def test_a_bad_step_names_the_env_id_its_index_and_the_step(env_id, needles):
    envs = SyncVectorEnv([EnvFactory(ODD + env_id, "classic") for _ in range(3)])
    envs.reset(seed=0)
    try:
        with pytest.raises(EnvOutputError) as caught:
            for _ in range(10):  # only env 1 steps, so it is the one that goes wrong
                envs.send(np.zeros(1, np.int64), [1])
                envs.recv([1])
    finally:
        envs.close()
    message = str(caught.value)
    assert caught.value.env_index == 1
    for needle in [ODD + env_id, "(env 1 of the vector)", *needles]:
        assert needle in message, message


def test_a_wrong_reset_shape_names_both_shapes():
    with pytest.raises(EnvOutputError, match=r"WrongResetShape-v0' \(env 0 of the vector\) returned an observation of "
                                             r"shape \(3,\) at reset .* says \(4,\)"):
        SyncVectorEnv([EnvFactory(ODD + "WrongResetShape-v0", "classic")]).reset(seed=0)


class _HugeObs(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.array([1e308, 1e308]), {}

    def step(self, action):
        return np.array([1e308, 1e308]), 1e308, False, False, {}


def test_huge_but_finite_outputs_pass_the_check():
    env = CheckOutputs(_HugeObs(), "huge")  # their sum overflows to inf, and the check looks again
    env.reset()
    obs, reward, *_ = env.step(0)
    assert np.isfinite(obs).all() and reward == 1e308


# ---------------------------------------------------------------- spaces PPO cannot take


@pytest.mark.parametrize("obs_space, action_space, needles", [
    (gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,))}), gym.spaces.Discrete(2), ["Dict(", "--env-backend sync or async"]),
    (gym.spaces.Box(0, 1, (4, 4)), gym.spaces.Discrete(2), ["shape (4, 4)", "sync and async"]),
    (gym.spaces.Box(0, 1, (4,)), gym.spaces.MultiDiscrete([3, 2]), ["MultiDiscrete([3 2])", "Discrete and Box", "Discrete(prod(nvec))"]),
    (gym.spaces.Box(0, 1, (4,)), gym.spaces.MultiBinary(3), ["MultiBinary(3)", "Discrete and Box", "Discrete(2**n)"]),
    (gym.spaces.Box(0, 1, (4,)), gym.spaces.Discrete(3, start=1), ["start at 1", "numbered from 0"]),
    (gym.spaces.Box(0, 1, (4,)), gym.spaces.Box(-1, 1, (2, 2)), ["shape (2, 2)", "1-D"]),
])
def test_check_spaces_refuses_what_ppo_cannot_take_naming_the_env_and_the_space(obs_space, action_space, needles):
    with pytest.raises(UnsupportedSpaceError) as caught:
        check_spaces("my.module:Odd-v0", obs_space, action_space, "ppo")
    for needle in ["'my.module:Odd-v0'", *needles]:
        assert needle in str(caught.value), str(caught.value)


def test_check_spaces_takes_vectors_images_discrete_and_box_actions():
    check_spaces("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), "ppo")
    check_spaces("Breakout", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4), "ppo")
    check_spaces("HalfCheetah", gym.spaces.Box(-1, 1, (17,)), gym.spaces.Box(-1, 1, (6,)), "ppo")


# ---------------------------------------------------------------- the real CLI


def train(env_id: str, backend: str, run_dir, process: bool = False) -> object:
    """`fleetrl train ppo` on the odd env, in this process (the CLI's entry point), or in a process of its own where an env
    worker's output must reach the run's stderr as a user sees it."""
    argv = ("train", "ppo", "--env-id", ODD + env_id, "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "64",
            "--env-backend", backend, "--run-dir", str(run_dir), "--no-cuda", "--no-progress")
    if process:
        return run_fleetrl(*argv, timeout=120)
    registry._ANNOUNCED.clear()  # what a process says once (a flattened space), as a fresh process would
    return run_fleetrl_in_process(*argv)


@pytest.mark.slow
@pytest.mark.parametrize("env_id, backend", [
    ("Uint8Obs-v0", "sync"), ("Float64Obs-v0", "sync"), ("IntObs-v0", "sync"), ("DictObs-v0", "sync"), ("TupleObs-v0", "sync"),
    ("Uint8Obs-v0", "async"), ("DictObs-v0", "async"), ("TupleObs-v0", "auto"),
])
def test_odd_observations_train(env_id, backend, tmp_path):
    # where workers step an env whose space is flattened (async, auto), a real process: the line is counted, and a
    # worker's would pass by this process's capture; Uint8Obs on async prints nothing counted, so it trains here
    flattened = env_id in ("DictObs-v0", "TupleObs-v0")
    proc = train(env_id, backend, tmp_path / "run", process=backend != "sync" and flattened)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 64 steps" in proc.stdout
    if flattened:
        assert sum("flattened to Box(6,)" in line for line in proc.stdout.splitlines()) == 1, proc.stdout


@pytest.mark.slow
def test_a_uint8_vector_policy_evaluates_on_the_byte_values_as_the_network_trained_on_them(tmp_path, monkeypatch):
    assert train("Uint8Obs-v0", "sync", tmp_path / "run").returncode == 0
    proc = run_fleetrl_in_process("eval", str(tmp_path / "run"), "--env-id", ODD + "Uint8Obs-v0", "--episodes", "2",
                                  "--env-backend", "sync", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["env_id"], result["global_step"], result["episodes"]) == (ODD + "Uint8Obs-v0", 64, 2), result
    assert result["returns"] == [20.0, 20.0] and result["mean_length"] == 20.0, "two whole 20-step episodes were played"
    # the policy eval builds (from the checkpoint, as eval does) feeds the network the bytes as float32, unscaled, as the
    # trainer's actor did (an image's bytes would be divided by 255 in the network): what the network is given, exactly
    seen = []
    act = Agent.act
    monkeypatch.setattr(Agent, "act", lambda self, x, deterministic: (seen.append(x.clone()), act(self, x, deterministic))[1])
    state = checkpoint.load_checkpoint(tmp_path / "run")
    envs = SyncVectorEnv([EnvFactory(ODD + "Uint8Obs-v0", "classic")])
    try:
        policy = ppo.policy_from_checkpoint(state, envs)
    finally:
        envs.close()
    obs = np.random.default_rng(0).integers(0, 256, (64, 8)).astype(np.uint8)
    actions = policy(obs)
    (given,) = seen
    assert given.dtype == torch.float32 and torch.equal(given, torch.as_tensor(obs, dtype=torch.float32))
    agent = Agent((8,), gym.spaces.Discrete(2))
    agent.load_state_dict(state["model"])
    with torch.no_grad():
        np.testing.assert_array_equal(actions, agent(given)[0].argmax(-1).numpy())  # the trained weights, deterministic


@pytest.mark.slow
@pytest.mark.parametrize("env_id, backend, needles", [
    ("NanObs-v0", "sync", ["(env 0 of the vector)", "non-finite observation", "step 5 of its episode 1"]),
    ("InfReward-v0", "sync", ["(env 0 of the vector)", "non-finite reward (inf)", "step 7 of its episode 1"]),
    ("WrongResetShape-v0", "sync", ["shape (3,) at reset", "says (4,)"]),
    ("WrongStepShape-v0", "sync", ["shape (5,) at step 4 of its episode 1", "says (4,)"]),
    ("NanObs-v0", "auto", ["non-finite observation", "step 5 of its episode 1", "timed the env's steps"]),
    ("NanObs-v0", "async", ["non-finite observation", "step 5 of its episode 1"]),
    ("MultiDiscreteActions-v0", "sync", ["MultiDiscrete([3 2])", "Discrete and Box"]),
    ("MultiBinaryActions-v0", "sync", ["MultiBinary(3)", "Discrete and Box"]),
])
def test_odd_env_outputs_and_spaces_stop_the_run_with_a_clear_message(env_id, backend, needles, tmp_path):
    # where workers may step the env (auto, async), a real process: what they print would pass by this process's capture
    proc = train(env_id, backend, tmp_path / "run", process=backend != "sync")
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in [ODD + env_id, *needles]:
        assert needle in proc.stderr, proc.stderr[-3000:]
