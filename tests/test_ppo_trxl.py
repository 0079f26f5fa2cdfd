"""PPO-TrXL: CleanRL's memory bookkeeping and update code in lockstep on fleetrl's rollouts (benchmarks/cleanrl/loops/
ppo_trxl.py), its network weight for weight, ProofofMemory-v0 step for step as CleanRL's env, the episode memory
carried by eval and by an exact resume, learning on ProofofMemory-v0, and bad input refused."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import assert_train_refused, run_fleetrl_here
from fleetrl.algos import ppo_trxl
from fleetrl.envs import memory
from fleetrl.errors import FleetError
from fleetrl.monitor.tbread import read_scalars

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks" / "cleanrl"))
from loops import ppo_trxl as cleanrl_loop  # noqa: E402  (CleanRL's code, benchmarks/cleanrl/)

# CleanRL's documented ProofofMemory-v0 command (docs/rl-algorithms/ppo-trxl.md), dashes for underscores
POM_COMMAND = ["--env-id", "ProofofMemory-v0", "--num-envs", "16", "--num-steps", "128", "--num-minibatches", "8", "--update-epochs", "4",
               "--trxl-num-layers", "4", "--trxl-num-heads", "1", "--trxl-dim", "64", "--trxl-memory-length", "16",
               "--trxl-positional-encoding", "none", "--vf-coef", "0.1", "--max-grad-norm", "0.5", "--init-lr", "3.0e-4",
               "--init-ent-coef", "0.001", "--clip-coef", "0.2"]
COMMON = ["--no-cuda", "--env-backend", "sync", "--no-progress"]
# the lockstep's job: windows of 8 over episodes of up to 16 steps (they slide), absolute positions, two heads
LOCKSTEP = dict(env_id="ProofofMemory-v0", num_envs=8, num_steps=32, num_minibatches=4, update_epochs=2, trxl_num_layers=2, trxl_num_heads=2,
                trxl_dim=32, trxl_memory_length=8, trxl_positional_encoding="absolute", init_lr=3e-4, clip_coef=0.2, total_timesteps=3 * 8 * 32,
                anneal_steps=4 * 8 * 32)


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """The runs set this process's torch threads (--torch-threads 1); the tests after get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def cleanrl_args(**changes) -> SimpleNamespace:
    """CleanRL's Args (its defaults) with ``changes``, as its network and update read them."""
    defaults = {name: f.default for name, f in ppo_trxl.Args.__dataclass_fields__.items()}
    return SimpleNamespace(**{**defaults, **changes})


def test_proof_of_memory_steps_as_cleanrls_env_from_the_same_start():
    ours, theirs = gym.make("ProofofMemory-v0").unwrapped, cleanrl_loop.cleanrl_pom_env()(render_mode=None)
    rng = np.random.default_rng(0)
    starts = set()
    for seed in range(40):
        obs, _ = ours.reset(seed=seed)
        np.random.seed(seed)
        theirs.reset()
        # CleanRL's draws come from numpy's global RNG, ours from the env's: the same start given to both
        theirs._position, theirs._goals = ours._position, ours._goals.copy()
        starts.add((float(ours._position), tuple(ours._goals)))
        done = False
        while not done:
            action = int(rng.integers(2))
            a, b = ours.step(action), theirs.step(action)
            np.testing.assert_array_equal(a[0], b[0])
            assert a[1:] == b[1:], (a, b)
            done = a[2]
    assert len(starts) > 6, "the starts vary with the seed"
    again = gym.make("ProofofMemory-v0").unwrapped
    again.reset(seed=7), ours.reset(seed=7)
    assert (again._position, tuple(again._goals)) == (ours._position, tuple(ours._goals)), "seeded by reset(seed=)"


def test_the_network_is_cleanrls_weight_for_weight_from_the_same_seed():
    ns = cleanrl_loop.cleanrl()
    space, actions = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2)
    for encoding in ("absolute", "learned", "none"):
        args = cleanrl_args(**{**LOCKSTEP, "trxl_positional_encoding": encoding})
        torch.manual_seed(3)
        theirs = ns.Agent(args, space, (2,), 16)
        torch.manual_seed(3)
        ours = ppo_trxl.make_agent(args, space, actions, 16)
        assert theirs.state_dict().keys() == ours.state_dict().keys()
        for name, value in theirs.state_dict().items():
            assert torch.equal(value, ours.state_dict()[name]), (encoding, name)


def test_lockstep_with_cleanrls_memory_bookkeeping_and_update_bit_for_bit(tmp_path):
    # fleetrl's training recorded (each update's batch and the learner before and after), then CleanRL's acting lines
    # on its observations, actions and episode ends, and CleanRL's update on its rollouts, from the same weights, AdamW
    # state and torch RNG state
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LOCKSTEP.items()]
    updates: list[cleanrl_loop.Update] = []
    with cleanrl_loop.recorded(updates):
        proc = run_fleetrl_here("train", "ppo_trxl", *flags, *COMMON, "--torch-threads", "1", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(updates) == 3
    args = cleanrl_args(**LOCKSTEP)
    ns, space = cleanrl_loop.cleanrl(), gym.spaces.Box(-1, 1, (3,))
    acted = cleanrl_loop.replay_acting(ns, args, space, (2,), 16, updates)
    ended = 0
    for k, (update, theirs) in enumerate(zip(updates, acted)):
        batch = update.batch
        ended += int(batch["starts"].sum())
        # the acting: the values from the same windows, bit for bit; log-probabilities (numpy's) to rounding
        assert torch.equal(batch["values"], theirs["values"].reshape(-1)), k
        torch.testing.assert_close(batch["logprobs"], theirs["log_probs"].reshape(-1), rtol=1e-5, atol=1e-6)
        # the memory storage: which episode memory each step read, its window and mask, the memories
        assert torch.equal(batch["memory_index"], theirs["stored_memory_index"].reshape(-1)), k
        used = batch["memory_indices"].shape[1]
        assert torch.equal(batch["memory_indices"], theirs["stored_memory_indices"].reshape(-1, 8)[:, :used]), k
        assert torch.equal(batch["memory_mask"].bool(), theirs["stored_memory_masks"].reshape(-1, 8)[:, :used]), k
        trimmed = theirs["stored_memories"][:, :used] if used < 8 else theirs["stored_memories"]  # CleanRL's padding removal
        assert torch.equal(batch["memories"], trimmed), k
        # the update: CleanRL's lines give fleetrl's weights, to the last bit
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the run trained (--torch-threads 1): more threads split the sums otherwise
        try:
            weights, losses = cleanrl_loop.replay_update(ns, args, space, (2,), 16, update, theirs)
        finally:
            torch.set_num_threads(threads)
        assert all(np.isfinite(losses)) and len(losses) == 2 * 4
        for name, value in weights.items():
            assert torch.equal(value, update.weights_after[name]), (k, name)
        assert any(not torch.equal(value, update.weights_before[name]) for name, value in weights.items())
    assert ended > 8, "episodes ended inside the rollouts (memories closed and opened mid-rollout)"
    assert updates[1].lr < updates[0].lr and updates[1].ent_coef < updates[0].ent_coef, "annealed"


def test_the_state_holds_the_episode_memory_and_step_and_a_start_clears_it():
    agent = ppo_trxl.make_agent(cleanrl_args(**LOCKSTEP), gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), 16)
    x = torch.randn(2, 3)
    _, _, state = agent(x)
    assert state.shape == (2, 17, 2, 32) and state[:, -1].eq(1).all(), "one step stored, the step count in the last row"
    _, value_carried, after = agent(x, state, torch.tensor([False, True]))
    assert after[0, -1, 0, 0] == 2 and after[1, -1, 0, 0] == 1, "a start begins the episode afresh"
    torch.testing.assert_close(after[1, 1:-1], torch.zeros_like(after[1, 1:-1]))
    _, value_fresh, _ = agent(x)
    assert value_carried[1] == value_fresh[1] and value_carried[0] != value_fresh[0], "the memory is what differs"


@pytest.mark.slow
def test_learns_proof_of_memory_with_cleanrls_command_and_eval_plays_it(tmp_path):
    # CleanRL's documented command, 8 of its 12 iterations: a policy without memory cannot pass 0 (it guesses the goal:
    # +1.6 or -1.6 less its steps); CleanRL's reaches 1.2 here by iteration 9 and fleetrl's 1.1-1.2 by iteration 7
    run = tmp_path / "run"
    proc = run_fleetrl_here("train", "ppo_trxl", *POM_COMMAND, *COMMON, "--total-timesteps", str(8 * 2048), "--checkpoint-every", "7",
                            "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    returns = [p.value for p in read_scalars(run, "charts/episodic_return") if p.step > 7 * 2048]
    assert len(returns) > 150 and np.mean(returns) > 0.8, np.mean(returns)
    for tag in ("charts/entropy_coefficient", "charts/learning_rate", "losses/value_loss", "losses/explained_variance"):
        assert read_scalars(run, tag), tag
    evaluated = run_fleetrl_here("eval", str(run), "--episodes", "20")
    assert evaluated.returncode == 0 and "ProofofMemory-v0" in evaluated.stdout, evaluated.stderr[-2000:]


@pytest.mark.parametrize("flags, needles", [
    (["--env-id", "MiniGrid-MemoryS9-v0"], ["pip install 'fleetrl[memory]'"]),
    (["--trxl-dim", "30", "--trxl-num-heads", "4"], ["--trxl-dim 30", "--trxl-num-heads 4"]),
    (["--policy-lag", "1"], ["--policy-lag"]),
    (["--env-id", "Pendulum-v1"], ["discrete-action"]),
])
def test_bad_input_is_refused_in_one_paragraph(tmp_path, flags, needles):
    if "MiniGrid" in flags[1]:
        try:
            import minigrid  # noqa: F401
            pytest.skip("minigrid is installed: its missing extra cannot be shown here")
        except ImportError:
            pass
    assert_train_refused("ppo_trxl", [*flags, *COMMON, "--total-timesteps", "4096", "--num-envs", "2", "--num-steps", "16",
                                      "--num-minibatches", "2"], needles, tmp_path / "run")


def test_minigrid_without_its_extra_names_the_extra():
    try:
        import minigrid  # noqa: F401
    except ImportError:
        with pytest.raises(FleetError, match=r"pip install 'fleetrl\[memory\]'"):
            memory.make_minigrid("MiniGrid-MemoryS9-v0")
    else:
        env = memory.make_minigrid("MiniGrid-MemoryS9-v0")
        assert env.observation_space.shape == (84, 84, 3) and env.action_space.n == 7 and env.spec.max_episode_steps == 96


@pytest.mark.slow
def test_a_stopped_run_resumed_ends_bit_identical_to_an_uninterrupted_one(tmp_path, monkeypatch):
    # test_exact_resume.py's check (its stateless env, one torch thread), for the episode memories in flight: the
    # checkpoint holds every env's memory and step, and the resumed run's learner ends where the uninterrupted one's does
    from test_exact_resume import ON_POLICY, STATELESS, Case, stopping_at, train

    from conftest import assert_same_learner
    from fleetrl import checkpoint
    from fleetrl.run import Run

    case = Case(["ppo_trxl", *STATELESS, *ON_POLICY[:-2], "--trxl-num-layers", "1", "--trxl-num-heads", "1", "--trxl-dim", "16",
                 "--trxl-memory-length", "4", "--total-timesteps", str(8 * 32), "--checkpoint-every", "3"], 4 * 32)
    whole = train(case, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    with monkeypatch.context() as patch:
        patch.setattr(Run, "end_iteration", stopping_at(case.stop_at))
        stopped = train(case, tmp_path / "part")
    assert stopped.returncode != 0 and "stopped by SIGTERM" in stopped.stderr, stopped.stderr[-3000:]
    in_flight = checkpoint.load_checkpoint(tmp_path / "part")["ranks"][0]["actor"]["recurrent_state"]
    assert in_flight[:, :-1].abs().sum() > 0 and (in_flight[:, -1] > 0).any(), "the memories and steps in flight are checkpointed"
    resumed = train(case, tmp_path / "part", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_learner(checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(tmp_path / "part"), ("model",), ("optimizer",))
