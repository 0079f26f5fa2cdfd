"""PPO with an LSTM: the state is zeroed exactly where an episode starts and carried otherwise (in every sampler mode
it allows), minibatches are whole env sequences in order, eval carries the state (an exact resume:
test_exact_resume.py; torchrun replicas: test_every_algorithm.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_fleetrl_here
from envs_for_tests import MakeEnv  # registers ShmCounting-v0
from fleetrl.algos import ppo_lstm
from fleetrl.envs.vector import SyncVectorEnv
from fleetrl.errors import FleetError
from fleetrl.monitor.timing import PhaseTimer
from fleetrl.policy import policy_fn
from fleetrl.sampling.sampler import Sampler

STEPS = 12


def lstm_agent(envs) -> ppo_lstm.Agent:
    torch.manual_seed(0)
    return ppo_lstm.Agent(envs.single_observation_space.shape, envs.single_action_space)


def expected_states(agent, buffer, state0: np.ndarray) -> np.ndarray:
    """Each step's state as the engine should carry it: the LSTM's state after the env's previous step, or zeros
    where the step's observation starts an episode; returns the states after the last step."""
    state = torch.as_tensor(state0)
    with torch.no_grad():
        for t in range(buffer.num_steps):
            # carried exactly as the previous step left it (batch sizes round differently in the split: allclose)
            np.testing.assert_allclose(buffer.states[t], state.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"the state into step {t}")
            obs, starts = torch.as_tensor(buffer.obs[t]).float(), torch.as_tensor(buffer.starts[t])
            _, _, after = agent(obs, torch.as_tensor(buffer.states[t]), starts)
            _, _, from_zero = agent(obs, torch.zeros_like(state), torch.zeros_like(starts))
            torch.testing.assert_close(after[starts], from_zero[starts])  # where an episode starts, from a zero state
            state = after
    return state.numpy()


@pytest.mark.parametrize("mode", ["serial", "split", "lag"])
def test_the_state_is_zeroed_exactly_at_episode_starts_and_carried_otherwise(mode):
    envs = SyncVectorEnv([MakeEnv("ShmCounting-v0", {"length": 5}) for _ in range(4)])  # episodes of 5 steps
    agent = lstm_agent(envs)
    sampler = Sampler(envs, agent, STEPS, rollout=ppo_lstm.rollout, device=torch.device("cpu"), seed=3, env_seed=0,
                      timer=PhaseTimer(), split={"serial": False, "split": True, "lag": None}[mode], policy_lag=int(mode == "lag"))
    try:
        assert sampler.mode == ("split" if mode == "split" else "serial")
        state = np.zeros((4, *agent.state_shape), np.float32)
        previous_dones = np.ones(4, bool)  # the first observations start episodes
        for _ in range(3):  # across rollouts too
            buffer = sampler.collect()
            starts = np.vstack([previous_dones, buffer.dones[:-1]])
            np.testing.assert_array_equal(buffer.starts, starts, err_msg="starts are exactly the episodes' first steps")
            assert buffer.starts.any() and (~buffer.starts).any()
            state = expected_states(sampler.acting_agent, buffer, state)
            previous_dones = buffer.dones[-1].copy()  # the buffer is refilled in place
            assert np.abs(state).sum() > 0, "a carried state is not all zeros"
            sampler.weights_updated()
    finally:
        sampler.close()


def test_a_sequence_minibatch_holds_whole_env_sequences_in_time_order():
    num_steps, num_envs = 6, 4
    step, env = np.meshgrid(np.arange(num_steps), np.arange(num_envs), indexing="ij")
    batch = {"obs": torch.as_tensor(np.stack([step, env], -1).reshape(-1, 2)), "states": torch.arange(num_steps * num_envs)[:, None]}
    seen = []
    for mb in ppo_lstm.sequence_minibatches(batch, num_steps, num_minibatches=2):
        obs = mb["obs"].reshape(num_steps, 2, 2)  # time-major: row t holds the minibatch's envs at step t
        envs = obs[0, :, 1]
        assert (obs[:, :, 0] == torch.arange(num_steps)[:, None]).all(), "every step, in order"
        assert (obs[:, :, 1] == envs).all(), "the same envs at every step"
        assert mb["initial_state"][:, 0].tolist() == envs.tolist(), "their states at step 0 (row t * num_envs + env)"
        seen += envs.tolist()
    assert sorted(seen) == list(range(num_envs)), "each env once an epoch"


def test_first_ready_batches_and_minibatches_that_split_envs_are_refused():
    args = ppo_lstm.Args(env_id="CartPole-v1", num_envs=4, async_batch=2, num_minibatches=4)
    from fleetrl import config

    args = config.apply_family_defaults(args, ppo_lstm.FAMILY_DEFAULTS, "classic")
    with pytest.raises(FleetError, match="first-ready batches"):
        ppo_lstm.validate(args)
    args.async_batch, args.num_envs = None, 6
    with pytest.raises(FleetError, match="must divide the 6 envs"):
        ppo_lstm.validate(args)


class RecordingPolicy(torch.nn.Module):
    """A recurrent policy whose state counts its steps: it records what it is given."""

    state_shape = (1,)

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[list, list]] = []

    def act(self, x, deterministic, state, starts):
        self.calls.append((state[:, 0].tolist(), starts.tolist()))
        return torch.zeros(len(x), dtype=torch.long), torch.where(starts[:, None], 0.0, state) + 1


def test_eval_carries_the_state_through_an_episode_and_starts_afresh_at_the_next():
    envs = SyncVectorEnv([MakeEnv("ShmCounting-v0", {"length": 3})])
    policy = RecordingPolicy()
    act = policy_fn(policy, envs)
    obs, _ = envs.reset(seed=0)
    starts = np.ones(1, bool)
    for _ in range(5):
        obs, _, terminated, truncated, _ = envs.step(act(obs, starts))
        starts = terminated | truncated
    states = [s for s, _ in policy.calls]
    assert [st for _, st in policy.calls] == [[True], [False], [False], [True], [False]]
    assert states == [[0.0], [1.0], [2.0], [3.0], [1.0]], "carried within an episode; the start zeroes it in the policy"


@pytest.mark.slow
def test_ppo_lstm_trains_and_evaluates_from_the_command_line(tmp_path):
    # the CLI's entry point in this process: PPO-LSTM in processes of its own is the benchmark runner's below (and
    # torchrun's, test_every_algorithm.py); train's and eval's own processes, test_ppo_runs.py's
    run_dir = tmp_path / "run"
    proc = run_fleetrl_here("train", "ppo_lstm", "--env-id", "CartPoleNoVel-v1", "--total-timesteps", "2048", "--no-cuda",
                            "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluated = run_fleetrl_here("eval", str(run_dir), "--episodes", "2")
    assert evaluated.returncode == 0 and "CartPoleNoVel-v1" in evaluated.stdout, evaluated.stderr[-2000:]


@pytest.mark.slow
def test_ppo_lstm_in_the_benchmark_runner_and_plot(tmp_path):
    # under torchrun: test_every_algorithm.py. One seed: the runner's seeds and workers are test_benchmark_runner.py's,
    # a plot of two seeds test_plot.py's
    out = tmp_path / "bench"
    bench = run_fleetrl_here("benchmark", "--env-ids", "CartPoleNoVel-v1", "--num-seeds", "1", "--out", str(out),
                             "--", "fleetrl", "train", "ppo_lstm", "--total-timesteps", "1024")
    assert bench.returncode == 0 and "CartPoleNoVel-v1" in bench.stdout, bench.stderr[-3000:]
    plotted = run_fleetrl_here("plot", str(out), "-o", str(tmp_path / "curves.png"))
    assert plotted.returncode == 0 and (tmp_path / "curves.png").stat().st_size > 0, plotted.stderr[-2000:]
