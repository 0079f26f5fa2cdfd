"""DQN: CleanRL's schedule and defaults, clear refusals, CartPole learned with the defaults, Atari end to end on two
backends, kill -9 and --resume auto, the greedy and epsilon-greedy acting that eval uses (eval of a trained DQN: test_learning.py), and each rank's replay shard through a resume under torchrun (bit-identical replicas: test_every_algorithm.py). Real envs, real learning."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import dqn
from fleetrl.monitor.tbread import read_scalars

from conftest import (TESTS_DIR, dqn_updates_made, fleetrl_env, killed_on_exit, require_module, run_fleetrl, run_fleetrl_here, run_fleetrl_in_process,
                      start_fleetrl_group, wait_for_checkpoint)

CARTPOLE = ["--env-id", "CartPole-v1", "--no-cuda"]
SHORT = [*CARTPOLE, "--learning-starts", "1000", "--buffer-size", "2000"]  # learning begins at once on a small budget


def assert_clean_failure(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------ the algorithm's pieces
def test_epsilon_falls_linearly_from_start_e_to_end_e_over_the_exploration_fraction_then_stays():
    duration = 0.5 * 500_000
    assert dqn.linear_schedule(1.0, 0.05, duration, 0) == 1.0
    assert math.isclose(dqn.linear_schedule(1.0, 0.05, duration, 125_000), 0.525)
    assert dqn.linear_schedule(1.0, 0.05, duration, 250_000) == pytest.approx(0.05)
    assert dqn.linear_schedule(1.0, 0.05, duration, 400_000) == 0.05


@pytest.mark.parametrize("num_envs", [1, 3, 8])
def test_updates_per_env_step_are_cleanrls_whatever_the_number_of_envs(num_envs):
    # CleanRL (one env) trains when global_step % train_frequency == 0, global_step counting the steps before this one
    vector_steps = range(0, 10_000, num_envs)  # the global step before each vector step
    updates = sum(dqn.times_due(step, num_envs, 4) for step in vector_steps)
    assert updates == sum(1 for step in range(len(vector_steps) * num_envs) if step % 4 == 0)
    if num_envs == 1:
        assert [dqn.times_due(step, 1, 4) for step in range(1, 9)] == [0, 0, 0, 1, 0, 0, 0, 1]


def cleanrl_q_network(obs_shape: tuple[int, ...], num_actions: int) -> torch.nn.Sequential:
    """The layers of CleanRL's dqn.py and dqn_atari.py QNetworks, as they write them (PyTorch's default init)."""
    nn = torch.nn
    if len(obs_shape) == 1:
        return nn.Sequential(nn.Linear(obs_shape[0], 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_actions))
    return nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
                         nn.Linear(512, num_actions))


@pytest.mark.parametrize("obs_shape", [(4,), (4, 84, 84)], ids=["mlp", "atari"])
def test_q_network_starts_from_cleanrls_initial_weights_for_the_same_seed(obs_shape):
    # issue 22: fleetrl's DQN started from PPO's orthogonal init; CleanRL's dqn.py uses PyTorch's default
    torch.manual_seed(3)
    ours = [p.detach() for p in dqn.QNetwork(obs_shape, 6).parameters()]
    torch.manual_seed(3)
    theirs = [p.detach() for p in cleanrl_q_network(obs_shape, 6).parameters()]
    assert [p.shape for p in ours] == [p.shape for p in theirs]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_q_values_on_atari_frames_are_cleanrls_network_on_frames_scaled_by_255():
    # dqn_atari.py's forward is `self.network(x / 255.0)`: uint8 frames in, pixels in [0, 1] to the first conv. A missing
    # (or doubled) scaling gives other Q-values from the same weights.
    torch.manual_seed(3)
    ours = dqn.QNetwork((4, 84, 84), 6)
    torch.manual_seed(3)
    theirs = cleanrl_q_network((4, 84, 84), 6)
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, 4, 84, 84), dtype=np.uint8))
    with torch.no_grad():
        torch.testing.assert_close(ours(frames), theirs(frames / 255.0))
        assert not torch.allclose(ours(frames), theirs(frames.float()), rtol=1e-3, atol=1e-3)


def test_epsilon_updates_and_target_updates_fall_on_cleanrls_steps(tmp_path, monkeypatch):
    # CleanRL's loop: for global_step in range(total): epsilon = linear_schedule(..., global_step); step; then, if
    # global_step > learning_starts, train when global_step % train_frequency == 0 and copy the target when
    # global_step % target_network_frequency == 0
    total, starts, train_every, target_every = 3_000, 1_000, 10, 500
    seen = {"steps": 0, "epsilon_at": [], "updates": [], "targets": []}
    schedule, step_envs, optimizer_step, soft_update = dqn.linear_schedule, dqn.step_envs, dqn.optimizer_step, dqn.soft_update

    def record(key, fn):
        def recorded(*args):
            seen[key].append(seen["steps"] - 1)  # after the step: CleanRL's global_step is the steps before it
            return fn(*args)
        return recorded

    def count_step(*args):
        seen["steps"] += 1
        return step_envs(*args)

    def epsilon(start_e, end_e, duration, t):
        seen["epsilon_at"].append(t)
        return schedule(start_e, end_e, duration, t)

    monkeypatch.setattr(dqn, "linear_schedule", epsilon)
    monkeypatch.setattr(dqn, "step_envs", count_step)
    monkeypatch.setattr(dqn, "optimizer_step", record("updates", optimizer_step))
    monkeypatch.setattr(dqn, "soft_update", record("targets", soft_update))
    dqn.train(dqn.Args(env_id="CartPole-v1", total_timesteps=total, learning_starts=starts, train_frequency=train_every,
                       target_network_frequency=target_every, cuda=False, torch_threads=1, env_backend="sync", progress=False,
                       run_dir=str(tmp_path / "run")))
    assert seen["steps"] == total and seen["epsilon_at"] == list(range(total))
    assert seen["updates"] == [g for g in range(total) if g > starts and g % train_every == 0]
    assert seen["targets"] == [g for g in range(total) if g > starts and g % target_every == 0]


def test_greedy_evaluation_takes_the_best_action_and_epsilon_greedy_explores_at_the_final_epsilon():
    torch.manual_seed(0)
    q_network = dqn.QNetwork((4,), 3)
    x = torch.randn(4000, 4)
    greedy = q_network(x).argmax(1)
    assert torch.equal(q_network.act(x, deterministic=True), greedy)
    q_network.epsilon = 0.3
    assert torch.equal(q_network.act(x, deterministic=True), greedy), "deterministic ignores epsilon"
    differs = (q_network.act(x, deterministic=False) != greedy).float().mean().item()
    assert abs(differs - 0.3 * 2 / 3) < 0.03, differs  # a random action is the greedy one a third of the time


def test_atari_q_network_takes_stacked_uint8_frames():
    q_network = dqn.QNetwork((4, 84, 84), 6)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert q_network(frames).shape == (2, 6) and q_network.act(frames, deterministic=True).dtype == torch.int64


# ------------------------------------------------------------------------------------------ flags and refusals
def test_help_lists_every_dqn_flag_with_its_family_defaults():
    # a real process: `fleetrl train ALGO --help`'s exit status and output there (c51's, rainbow's and pqn's run here)
    helped = run_fleetrl("train", "dqn", "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr
    for flag in ("--buffer-size", "--batch-size", "--learning-starts", "--train-frequency", "--target-network-frequency", "--tau",
                 "--start-e", "--end-e", "--exploration-fraction", "--learning-rate", "--gamma", "--total-timesteps", "--save-buffer"):
        assert flag in helped.stdout, flag
    for default in ("[10k; Atari 1M]", "[128; Atari 32]", "[10; Atari 4]", "[500; Atari 1000]", "[0.05; Atari 0.01]"):
        assert default in " ".join(helped.stdout.replace("│", " ").split()), default  # help wraps lines inside a box


REFUSALS = {
    "buffer_smaller_than_batch": (["--buffer-size", "64", "--batch-size", "128"], ["--buffer-size", "--batch-size"]),
    "learning_starts_beyond_the_budget": (["--total-timesteps", "5000", "--learning-starts", "10000"], ["--learning-starts", "--total-timesteps"]),
    "continuous_actions": (["--env-id", "Pendulum-v1"], ["DQN", "Pendulum-v1", "continuous-action", "fleetrl train sac"]),
    "mujoco": (["--env-id", "HalfCheetah-v5"], ["DQN", "HalfCheetah-v5"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_is_refused_with_a_clear_error_before_anything_runs(tmp_path, case):
    if case == "mujoco":
        require_module("mujoco", "mujoco")
    flags, needles = REFUSALS[case]
    run_dir = tmp_path / "r"
    proc = run_fleetrl_in_process("train", "dqn", "--no-cuda", *flags, "--run-dir", str(run_dir))
    assert_clean_failure(proc, *needles)
    assert not (run_dir / "checkpoints").exists()


# ------------------------------------------------------------------------------------------ learning
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("backend", ["ale", "sync"])
def test_dqn_trains_breakout_end_to_end_on_each_backend(tmp_path, backend):
    require_module("ale_py", "atari")
    run_dir = tmp_path / backend
    total = 600  # 50 updates of the Nature CNN, after 400 steps of random play: two games or more end
    train = ["train", "dqn", "--env-id", "BreakoutNoFrameskip-v4", "--env-backend", backend, "--total-timesteps", str(total),
             "--buffer-size", "1000", "--learning-starts", "400", "--no-cuda", "--run-dir", str(run_dir)]
    # ale's vector env runs its own threads: a real process; sync's envs are plain Python, so here (no torch import)
    proc = run_fleetrl(*train, timeout=360, threads=2) if backend == "ale" else run_fleetrl_in_process(*train)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == total
    losses = [p.value for p in read_scalars(run_dir, "losses/td_loss")]
    assert losses and all(np.isfinite(losses)), losses
    assert read_scalars(run_dir, "charts/episodic_return"), "Breakout games finished and were logged"


# ------------------------------------------------------------------------------------------ reliability, eval, torchrun
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_mid_run_then_resume_auto_finishes_and_logs_every_iteration_once(tmp_path):
    # the kill needs the real process; the resume runs here. Killed past --learning-starts (1,000), the resume refills
    run_dir, total = tmp_path / "run", 8_000
    train = ["train", "dqn", *SHORT, "--total-timesteps", str(total), "--checkpoint-every", "5", "--torch-threads", "1", "--run-dir", str(run_dir)]
    proc = start_fleetrl_group(*train)
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, run_dir, 2000)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = int(checkpoint.load_checkpoint(run_dir)["global_step"])
    assert 2000 <= killed_at < total
    resumed = run_fleetrl_here(*train, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "refill" in (resumed.stdout + resumed.stderr).lower(), "a resume without the buffer says it refills it"
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == total
    steps = [p.step for p in read_scalars(run_dir, "charts/epsilon")]
    assert steps == list(range(100, total + 1, 100)), "every iteration logged exactly once"


@pytest.mark.slow
def test_save_buffer_puts_the_replay_buffer_in_a_shard_file_and_a_resume_keeps_it(tmp_path):
    run_dir = tmp_path / "run"
    base = ["train", "dqn", *SHORT, "--env-backend", "sync", "--save-buffer", "--no-progress", "--run-dir", str(run_dir)]
    first = run_fleetrl_here(*base, "--total-timesteps", "1500")
    assert first.returncode == 0, first.stderr
    path = checkpoint.resolve_checkpoint(str(run_dir))
    shards = json.loads(checkpoint.manifest_path(path).read_text())["shards"]
    assert [(s["rank"], s["name"], s["holds"]) for s in shards] == [(0, "ckpt_000000001500.rank0.pt", ["replay"])]
    assert "replay" not in checkpoint.load_checkpoint(path)["ranks"][0], "the buffer is in its shard, not in the main file"
    resumed = run_fleetrl_here(*base, "--total-timesteps", "2500", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "refills" not in resumed.stderr, "with --save-buffer a resume keeps the buffer and learns on at once"
    assert "done: 2,500 steps" in resumed.stdout


# two ranks, 2 envs, a shard of 1,000 transitions each (it wraps by step 3,000), checkpoints at steps 1,000, 2,000 and 3,000
TWO_RANKS = [*SHORT, "--num-envs", "2", "--batch-size", "64", "--env-backend", "sync", "--save-buffer", "--no-progress",
             "--checkpoint-every", "5", "--keep-checkpoints", "5"]


@pytest.fixture(scope="module")
def two_rank_jobs(tmp_path_factory) -> Path:
    """One 2-rank launch (dist_replay_check.py) of three jobs in the same two processes: a --save-buffer run to step
    3,000 (OUT/saved), then resumes to 4,000 of a copy of it (OUT/resumed) and of a copy with rank 1's last shard torn
    (OUT/torn); OUT/alone/run is another copy, untouched. Each job's folder holds each rank's buffer as it was at each
    checkpoint and as the resume restored it, and each rank's output and exit status."""
    out = tmp_path_factory.mktemp("two-ranks")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(TESTS_DIR / "dist_replay_check.py"), str(out), "3000", "4000", *TWO_RANKS],
                          capture_output=True, text=True, timeout=400, env=fleetrl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def job_output(out: Path, name: str) -> str:
    """Both ranks' output of job ``name``, after asserting that each rank ended it with status 0."""
    logs = [(out / name / f"rank{rank}.log").read_text() for rank in (0, 1)]
    for rank in (0, 1):
        assert json.loads((out / name / f"rank{rank}.json").read_text())["returncode"] == 0, logs[rank][-3000:]
    return "".join(logs)


def assert_restored_as_saved(restored_dir, saved_dir, step: int) -> None:
    for rank in (0, 1):
        saved, restored = np.load(saved_dir / f"saved_rank{rank}_{step}.npz"), np.load(restored_dir / f"restored_rank{rank}.npz")
        assert int(restored["step"]) == step, f"rank {rank} resumed step {int(restored['step'])}, not {step}"
        assert int(saved["length"]) == int(restored["length"]) == 1000, "a full shard (1,000 transitions of one env), wrapped by step 3,000"
        for name in saved.files:
            assert np.array_equal(saved[name], restored[name]), f"rank {rank}'s {name} differs after the resume"
    assert not np.array_equal(np.load(saved_dir / f"saved_rank0_{step}.npz")["obs"], np.load(saved_dir / f"saved_rank1_{step}.npz")["obs"]), \
        "each rank has its own shard"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_ranks_resume_their_own_shards_exactly_and_learn_on_at_once(two_rank_jobs):
    out = two_rank_jobs
    job_output(out, "saved")
    saved_run = out / "saved" / "run"
    manifest = json.loads(checkpoint.manifest_path(checkpoint.resolve_checkpoint(saved_run)).read_text())
    assert [s["name"] for s in manifest["shards"]] == ["ckpt_000000003000.rank0.pt", "ckpt_000000003000.rank1.pt"]
    main = checkpoint.load_checkpoint(saved_run)
    assert all("replay" not in rank for rank in main["ranks"]), "no rank's buffer went through rank 0 or into the main file"

    resumed, run_dir = job_output(out, "resumed"), out / "resumed" / "run"
    assert "refills" not in resumed, resumed[-3000:]
    assert_restored_as_saved(out / "resumed", out / "saved", 3000)
    assert [p.step for p in read_scalars(run_dir, "losses/td_loss") if p.step > 3000][0] == 3200, "updates go on in the first iteration"
    steps = {int(s["step"]) for s in checkpoint.load_checkpoint(run_dir)["optimizer"]["state"].values()}
    assert steps == {dqn_updates_made(4000)}, f"every update an uninterrupted run makes, none lost to a refill: {steps}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_torn_shard_of_one_rank_makes_every_rank_resume_the_checkpoint_before(two_rank_jobs):
    out = two_rank_jobs  # rank 1's shard of step 3,000 lost its last 100 bytes: rank 1 was killed while its node wrote it, say
    resumed = job_output(out, "torn")
    assert "skipping the checkpoint" in resumed and "ckpt_000000003000.rank1.pt (rank 1's) is torn" in resumed, resumed[-3000:]
    assert_restored_as_saved(out / "torn", out / "saved", 2000)
    assert int(checkpoint.load_checkpoint(out / "torn" / "run")["global_step"]) == 4000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_resume_under_another_world_size_refills_the_buffer_and_says_so(two_rank_jobs):
    run_dir = two_rank_jobs / "alone" / "run"  # the 2-rank run of step 3,000, copied for this test
    alone = run_fleetrl_here("train", "dqn", *TWO_RANKS, "--total-timesteps", "5000", "--resume", "auto", "--run-dir", str(run_dir))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "refills it" in alone.stderr and "another number of processes" in alone.stderr, alone.stderr[-3000:]
    resumed_losses = [p.step for p in read_scalars(run_dir, "losses/td_loss") if p.step > 3000]
    assert resumed_losses and min(resumed_losses) > 4000, "no update before the shard of this one process is refilled"


@pytest.mark.slow
def test_fleetrls_loop_and_cleanrls_take_the_same_actions_updates_and_losses_bit_for_bit(monkeypatch):
    # issue 22: the step-for-step comparison of benchmarks/vs_cleanrl.py dqn --lockstep, short. Given fleetrl's
    # exploration draws and fused Adam, CleanRL's dqn.py loop must act, update, copy the target and compute each loss
    # exactly as fleetrl's does (500k steps on seed 3 stayed identical for 297,476 actions, then float rounding parted them)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from versus import dqn as lockstep

    steps, starts = 4_000, 1_000
    ours = lockstep.fleetrl_trace(seed=3, steps=steps, learning_starts=starts)
    theirs = lockstep.Trace()
    lockstep.plain_dqn("CartPole-v1", steps, starts, seed=3, numpy_draws=True, fused_adam=True, trace=theirs)
    assert len(ours.actions) == steps and ours.actions == theirs.actions
    assert ours.update_steps == theirs.update_steps == [g for g in range(steps) if g > starts and g % 10 == 0]
    assert ours.target_steps == theirs.target_steps == [g for g in range(steps) if g > starts and g % 500 == 0]
    assert ours.losses == theirs.losses
