"""PQN: CleanRL's loop step for step (actions, Q(lambda) returns, losses bit for bit), the Q(lambda) recurrence at episode
ends, time limits and in first-ready batches, the weights each rollout acted with (the latest update, whatever order a
copy of pqn.py builds the engine in, and what each sampler mode promises), channels-last weights kept, CartPole learned
on a small budget, greedy evaluation of the checkpoint, and clear refusals. Real envs,
real learning."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import pqn
from fleetrl.monitor.tbread import read_scalars
from fleetrl.sampling.rollout import RolloutBuffer

from conftest import run_fleetrl, run_fleetrl_here, run_fleetrl_in_process

CARTPOLE = ["--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--no-progress", "--precision", "fp32"]
SMALL = [*CARTPOLE, "--num-steps", "32"]  # 4 envs x 32 steps: 128 transitions an iteration
# the same observation every step and no episode end (tests/fleetrl_test_envs.py): a resume, which restarts the episodes,
# sees what an uninterrupted run sees; each step sleeps 5 ms, so a run lasts a known wall time however fast the host
SLOW_STATELESS = ["--env-id", "fleetrl_test_envs:SlowStateless-v0", *SMALL[2:]]


def assert_clean_failure(proc, *needles):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------ CleanRL, step for step
def test_fleetrls_loop_and_cleanrls_take_the_same_actions_returns_and_losses_bit_for_bit(monkeypatch):
    # benchmarks/vs_cleanrl.py pqn --lockstep, short: CleanRL's pqn.py loop given fleetrl's exploration draws and
    # minibatch order acts, computes its Q(lambda) returns and each loss exactly as fleetrl does (40,960 steps on seed 3
    # stayed identical; docs/algorithms.md)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from versus import pqn as lockstep

    ours, theirs = lockstep.traces(seed=1, steps=4096)
    assert len(ours.actions) == len(theirs.actions) == 4096 // 4
    assert ours.actions == theirs.actions
    assert len(ours.returns) == len(theirs.returns) == 8
    for a, b in zip(ours.returns, theirs.returns):
        assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)
    assert len(ours.losses) == 8 * 4 * 4 and ours.losses == theirs.losses
    explored = np.concatenate(ours.uniforms)[:, 0]
    assert 0.2 < explored.mean() < 0.8, "the explore uniforms are uniform"


# ------------------------------------------------------------------------------------------ Q(lambda)
def buffer(rewards, values, terminated=None, truncated=None, final_values=None, last_values=None, env_ids=None) -> RolloutBuffer:
    rewards = np.asarray(rewards, np.float32)
    b = RolloutBuffer(*rewards.shape, (1,), np.float32, (), np.int64, total_envs=None if env_ids is None else len(last_values))
    b.rewards[:], b.values[:] = rewards, np.asarray(values, np.float32)
    b.terminated[:] = False if terminated is None else np.asarray(terminated, bool)
    b.dones[:] = b.terminated | (False if truncated is None else np.asarray(truncated, bool))
    b.final_values[:] = 0.0 if final_values is None else np.asarray(final_values, np.float32)
    b.last_values[:] = np.asarray(last_values if last_values is not None else np.zeros(rewards.shape[1]), np.float32)
    if env_ids is not None:
        b.env_ids[:] = env_ids
    return b


def test_q_lambda_mixes_the_next_return_and_the_next_greedy_value_and_bootstraps_the_last_from_its_value():
    gamma, lam = 0.9, 0.5
    b = buffer([[1.0], [2.0], [3.0]], [[10.0], [20.0], [30.0]], last_values=[40.0])
    returns = pqn.q_lambda_returns(b, gamma, lam)[:, 0]
    g2 = 3.0 + gamma * 40.0
    g1 = 2.0 + gamma * (lam * g2 + (1 - lam) * 30.0)
    g0 = 1.0 + gamma * (lam * g1 + (1 - lam) * 20.0)
    np.testing.assert_allclose(returns, [g0, g1, g2], rtol=1e-6)
    one_step = pqn.q_lambda_returns(b, gamma, 0.0)[:, 0]  # lambda 0: Q-learning's one-step targets
    np.testing.assert_allclose(one_step, [1 + gamma * 20, 2 + gamma * 30, 3 + gamma * 40], rtol=1e-6)


def test_q_lambda_stops_at_termination_and_bootstraps_a_time_limit_from_the_final_observations_value():
    gamma, lam = 0.9, 0.65
    b = buffer([[1.0, 1.0], [1.0, 1.0]], [[5.0, 5.0], [7.0, 7.0]], terminated=[[True, False], [False, False]],
               truncated=[[False, True], [False, False]], final_values=[[0.0, 8.0], [0.0, 0.0]], last_values=[9.0, 9.0])
    returns = pqn.q_lambda_returns(b, gamma, lam)
    assert returns[0, 0] == 1.0, "nothing after a termination"
    assert returns[0, 1] == np.float32(1.0 + gamma * np.float32(8.0)), "a time limit bootstraps from its final value"


def test_first_ready_rows_give_each_env_the_returns_of_its_own_trajectory():
    gamma, lam = 0.99, 0.65
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(4, 2)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], bool)
    columns = pqn.q_lambda_returns(buffer(rewards, values, terminated, last_values=[0.5, -0.5]), gamma, lam)
    # the same transitions as arrival batches of one env each: env 0, env 1, env 1, env 0, ...
    order = [(t, e) for t in range(4) for e in (0, 1)]
    order = order[0::2][:1] + order[1::2][:2] + order[0::2][1:] + order[1::2][2:]  # env 0 once, then env 1 twice, ...
    rows = buffer([[rewards[t, e]] for t, e in order], [[values[t, e]] for t, e in order], [[terminated[t, e]] for t, e in order],
                  last_values=[0.5, -0.5], env_ids=[[e] for _, e in order])
    arrived = pqn.q_lambda_returns(rows, gamma, lam)
    for row, (t, e) in enumerate(order):
        assert arrived[row, 0] == columns[t, e]


# ------------------------------------------------------------------------------------------ the network and acting
def test_greedy_evaluation_is_the_argmax_and_epsilon_greedy_explores_at_the_runs_final_epsilon():
    torch.manual_seed(0)
    q_network = pqn.QNetwork((4,), gym.spaces.Discrete(3))
    x = torch.randn(500, 4)
    greedy = q_network.act(x, deterministic=True)
    assert torch.equal(greedy, q_network.q_values(x).argmax(-1))
    q_network.epsilon = 0.5
    assert 0.2 < (q_network.act(x, deterministic=False) != greedy).float().mean() < 0.5  # explore half, a third of it greedy anyway
    assert any(isinstance(m, torch.nn.LayerNorm) for m in q_network.modules())


def test_epsilon_falls_linearly_from_start_e_to_end_e_over_the_exploration_fraction_then_stays():
    steps = np.array([0, 250, 500, 1000])
    np.testing.assert_allclose(pqn.linear_schedule(1.0, 0.05, 500, steps), [1.0, 0.525, 0.05, 0.05])


def test_help_lists_pqns_flags_with_their_family_defaults():
    proc = run_fleetrl_in_process("train", "pqn", "--help")  # help's real process: test_dqn.py's
    assert proc.returncode == 0, proc.stderr
    for flag in ("--q-lambda", "--start-e", "--end-e", "--exploration-fraction", "--max-grad-norm", "--async-batch", "--policy-lag"):
        assert flag in proc.stdout, flag
    assert pqn.FAMILY_DEFAULTS["atari"]["exploration_fraction"] == 0.1 and pqn.FAMILY_DEFAULTS["classic"]["end_e"] == 0.05


# ------------------------------------------------------------------------------------------ the weights that act
ITERATIONS = 6


def versions_acted_with(algo, monkeypatch, tmp_path, **flags) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Train ``algo`` (pqn, or a copy of its file) in this process on CartPole for ITERATIONS rollouts of 4 envs x 16
    steps, and tell which weights acted: for each rollout k, per transition, the version of the learner's weights whose
    greedy Q-value the actor stored (version k: the weights the learner held when rollout k arrived, after k iterations
    of updates), and the rollout's ``env_ids`` (first-ready rows) or None."""
    learners, rollouts = [], []

    class Recorded(algo.QNetwork):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            learners.append(self)  # the learner's network (the sampler's and the precision probe's are copies)

    returns = algo.q_lambda_returns

    def recording(b, gamma, q_lambda):  # the learner's first look at rollout k
        weights = copy.deepcopy(learners[0].state_dict())
        rollouts.append((b.obs.copy(), b.values.copy(), None if b.env_ids is None else b.env_ids.copy(), weights))
        return returns(b, gamma, q_lambda)

    monkeypatch.setattr(algo, "QNetwork", Recorded)
    monkeypatch.setattr(algo, "q_lambda_returns", recording)
    threads = torch.get_num_threads()  # the run sets this process's torch threads
    try:
        algo.train(algo.Args(env_id="CartPole-v1", seed=1, num_envs=4, num_steps=16, total_timesteps=ITERATIONS * 64, torch_threads=1,
                             cuda=False, precision="fp32", progress=False, run_dir=str(tmp_path / "run"), **flags))
    finally:
        torch.set_num_threads(threads)
    assert len(rollouts) == ITERATIONS
    q_network = pqn.QNetwork((4,), gym.spaces.Discrete(2))
    acted = []
    for obs, values, env_ids, _ in rollouts:
        errors = []
        for *_, weights in rollouts:
            q_network.load_state_dict(weights)
            with torch.no_grad():
                errors.append(np.abs(q_network.get_value(torch.from_numpy(obs.reshape(-1, 4))).numpy().reshape(values.shape) - values))
        errors = np.stack(errors)
        # the weights that acted give the stored values to float32 rounding (acting batches differ from this one);
        # the weights of neighbouring versions are a few hundredths apart on CartPole
        assert errors.min(0).max() < 1e-5, "a stored value that no version of the learner's weights gives"
        acted.append((errors.argmin(0), env_ids))
    return acted


def test_the_actor_acts_with_the_weights_of_the_latest_update(monkeypatch, tmp_path):
    for k, (versions, _) in enumerate(versions_acted_with(pqn, monkeypatch, tmp_path, env_backend="sync")):
        assert (versions == k).all(), f"rollout {k} acted with versions {np.unique(versions)}"


def test_a_copy_of_pqn_that_builds_its_actor_before_its_optimizer_acts_with_the_updated_weights(monkeypatch, tmp_path):
    # a user's copy may build the engine in another order: the sampler's actor (which captures views of the parameters,
    # fleetrl/sampling/acting.py) before the optimizer (fleetrl/optim.py) must still act with every update
    lines = Path(pqn.__file__).read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("optimizer = optim.RAdam("))
    moved = lines[first:first + 3]  # the optimizer, the gradient sync and run.register(model=..., optimizer=...)
    assert "gradient_sync" in moved[1] and "run.register(model=q_network, optimizer=optimizer)" in moved[2], moved
    del lines[first:first + 3]
    after_sampler = next(i for i, line in enumerate(lines) if "run.register_per_rank(actor=sampler)" in line)
    assert after_sampler > next(i for i, line in enumerate(lines) if "sampler = run.closing(Sampler(" in line)
    lines[after_sampler:after_sampler] = moved
    path = tmp_path / "pqn_actor_first.py"
    path.write_text("".join(lines))
    spec = importlib.util.spec_from_file_location("pqn_actor_first", path)
    actor_first = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pqn_actor_first", actor_first)  # its dataclass looks its module up there
    spec.loader.exec_module(actor_first)

    for k, (versions, _) in enumerate(versions_acted_with(actor_first, monkeypatch, tmp_path, env_backend="sync")):
        assert (versions == k).all(), f"rollout {k} acted with versions {np.unique(versions)}"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [dict(env_backend="async", async_batch=2), dict(env_backend="sync", policy_lag=1)],
                         ids=["first-ready", "policy-lag"])
def test_first_ready_batches_and_the_lagged_sampler_act_with_the_weights_their_mode_promises(monkeypatch, tmp_path, capsys, mode):
    # first-ready: every env stays in flight, so each env's first transition in rollout k was acted on in rollout k-1;
    # the rest with the latest weights. --policy-lag 1: the sampler thread collects rollout k while the learner trains on
    # rollout k-1, with the weights of one update before
    acted = versions_acted_with(pqn, monkeypatch, tmp_path, **mode)
    assert ("first-ready" if "async_batch" in mode else "policy-lag 1") in capsys.readouterr().out
    for k, (versions, env_ids) in enumerate(acted):
        if "policy_lag" in mode:
            expected = np.full(versions.shape, max(k - 1, 0))
        else:
            expected = np.full(versions.shape, k)
            if k:
                for env in range(4):  # the env's first row in this rollout
                    row, col = np.argwhere(env_ids == env)[0]
                    expected[row, col] = k - 1
        assert np.array_equal(versions, expected), f"rollout {k}: acted with {versions.tolist()}, expected {expected.tolist()}"


@pytest.mark.slow
@pytest.mark.cpu_choice
@pytest.mark.timeout(300)
def test_an_atari_run_trains_and_checkpoints_channels_last_weights_when_channels_last_is_chosen(tmp_path, capsys):
    # the start-up line and the checkpoint's record of the choice (remembered accel) say channels-last: the weights the
    # optimizer steps, and the checkpoint saves, must be in that layout
    threads = torch.get_num_threads()
    try:
        pqn.train(pqn.Args(env_id="BreakoutNoFrameskip-v4", seed=1, num_envs=2, num_steps=16, num_minibatches=1, update_epochs=1,
                           total_timesteps=64, memory_format="channels-last", precision="fp32", torch_threads=1, cuda=False,
                           progress=False, run_dir=str(tmp_path / "run")))
    finally:
        torch.set_num_threads(threads)
    assert "precision: fp32, channels-last" in capsys.readouterr().out
    state = checkpoint.load_checkpoint(tmp_path / "run")
    assert state["remembered"]["accel"]["channels_last"] is True
    convolutions = {k: v for k, v in state["model"].items() if v.dim() == 4}
    assert len(convolutions) == 3
    for name, weight in convolutions.items():
        assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous(), (name, weight.stride())
    assert all(v["exp_avg"].abs().sum() > 0 for v in state["optimizer"]["state"].values()), "the optimizer stepped them all"


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("flags, needles", [
    (["--q-lambda", "1.5"], ["--q-lambda", "1.5", "[0, 1]"]),
    (["--q-lambda", "-0.1"], ["--q-lambda", "-0.1"]),
    (["--num-minibatches", "3"], ["--num-minibatches 3", "do not split", "divides 512"]),
    (["--exploration-fraction", "0"], ["--exploration-fraction"]),
])
def test_bad_flags_are_refused_with_one_paragraph_before_anything_runs(tmp_path, flags, needles):
    proc = run_fleetrl_in_process("train", "pqn", *CARTPOLE, *flags, "--run-dir", str(tmp_path / "run"))
    assert_clean_failure(proc, *needles)
    assert not (tmp_path / "run").exists(), "nothing started"


def test_a_continuous_action_space_is_refused_naming_the_algorithms_that_fit(tmp_path):
    proc = run_fleetrl_in_process("train", "pqn", "--env-id", "Pendulum-v1", "--no-progress", "--run-dir", str(tmp_path / "run"))
    assert_clean_failure(proc, "Pendulum-v1", "PQN", "continuous", "sac")
    assert not checkpoint.list_checkpoints(tmp_path / "run")


# ------------------------------------------------------------------------------------------ runs
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pqn_learns_cartpole_on_a_small_budget(tmp_path):
    # the run stops once its last 20 games average 75, from about 23 at first (a random policy). Seeds 1-6 got there
    # by step 8.7k-17.4k (seed 1: 9.6k), so 30k is a bound that another host's rounding does not reach; 151 in 60k,
    # this test's bar before issue 46, only seeds 1, 2 and 6 reached: it is `make bench-learning`'s pqn row
    run_dir = tmp_path / "run"
    proc = run_fleetrl_here("train", "pqn", *CARTPOLE, "--total-timesteps", "30000", "--learning-rate", "1e-3", "--exploration-fraction", "0.2",
                            "--stop-at-return", "75", "--stop-window", "20", "--torch-threads", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    assert np.mean(returns[:20]) < 37.5, returns[:20]  # it learned: the first games score under half the bar
    assert np.mean(returns[-20:]) >= 75, returns[-20:]
    for tag in ("losses/td_loss", "losses/q_values", "charts/epsilon", "charts/SPS"):
        assert read_scalars(run_dir, tag), tag


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eval_plays_the_checkpoints_greedy_actions_from_its_seed(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", "pqn", *SMALL, "--total-timesteps", "1024", "--torch-threads", "1", "--run-dir", str(run_dir))
    assert trained.returncode == 0, trained.stderr[-3000:]
    proc = run_fleetrl("eval", str(run_dir), "--episodes", "10", "--seed", "7", "--json", timeout=120)  # eval's real process
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the same ten episodes played here with plain gymnasium: CartPole reset from seed 7, then the argmax of the
    # checkpoint's Q-values at every step. Epsilon-greedy (the run's end_e is 0.05 over hundreds of steps), another
    # network's weights or another seed would part from them
    q_network = pqn.QNetwork((4,), gym.spaces.Discrete(2))
    q_network.load_state_dict(checkpoint.load_checkpoint(run_dir)["model"])
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=7)
    returns, episode_return = [], 0.0
    while len(returns) < 10:
        with torch.no_grad():
            action = int(q_network.q_values(torch.as_tensor(obs)[None]).argmax())
        obs, reward, terminated, truncated, _ = env.step(action)
        episode_return += reward
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
    assert result["returns"] == returns
