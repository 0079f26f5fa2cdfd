"""Bad input ends in one clear message and a non-zero exit, never a traceback or a hang; defaults by family."""

import pytest

from fleetrl import config
from fleetrl.algos.ppo import FAMILY_DEFAULTS, Args

from conftest import run_fleetrl


def assert_clean_failure(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unknown_env_id_names_the_closest_ids(tmp_path):
    proc = run_fleetrl("train", "ppo", "--env-id", "CartPol-v1", "--run-dir", str(tmp_path / "r"), timeout=120)
    assert_clean_failure(proc, "Unknown --env-id", "CartPole-v1")


def test_batch_that_does_not_split_into_minibatches_is_refused_before_anything_runs(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_fleetrl("train", "ppo", "--num-envs", "3", "--num-steps", "7", "--num-minibatches", "4", "--run-dir", str(run_dir), timeout=120)
    assert_clean_failure(proc, "does not split", "--num-minibatches")
    assert not run_dir.exists()


def test_missing_resume_file_and_auto_without_run_dir(tmp_path):
    assert_clean_failure(run_fleetrl("train", "ppo", "--resume", str(tmp_path / "missing.pt"), timeout=120), "does not exist")
    assert_clean_failure(run_fleetrl("train", "ppo", "--resume", "auto", timeout=120), "--resume auto needs --run-dir")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert_clean_failure(run_fleetrl("train", "ppo", "--resume", str(corrupt), timeout=120), "corrupt")


def test_unknown_command_and_missing_algorithm():
    assert_clean_failure(run_fleetrl("fly", timeout=60), "Unknown command")
    assert_clean_failure(run_fleetrl("train", timeout=60), "needs an algorithm")
    helped = run_fleetrl("train", "ppo", "--help", timeout=60)
    assert helped.returncode == 0 and "--num-envs" in helped.stdout and "--total-timesteps" in helped.stdout


def test_cuda_without_a_gpu_falls_back_to_cpu_with_one_warning(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_fleetrl("train", "ppo", "--cuda", "--total-timesteps", "512", "--run-dir", str(tmp_path / "r"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "cuda" in line.lower()]
    assert len(warnings) == 1 and "CPU" in warnings[0]
    quiet = run_fleetrl("train", "ppo", "--total-timesteps", "512", "--run-dir", str(tmp_path / "q"), timeout=120)
    assert "cuda" not in quiet.stderr.lower()


def test_defaults_follow_the_env_family_and_explicit_flags_win():
    assert config.apply_family_defaults(Args(), FAMILY_DEFAULTS, "classic").num_envs == 4
    atari = config.apply_family_defaults(Args(env_id="BreakoutNoFrameskip-v4"), FAMILY_DEFAULTS, "atari")
    assert (atari.num_envs, atari.clip_coef, atari.total_timesteps) == (8, 0.1, 10_000_000)
    mujoco = config.apply_family_defaults(Args(learning_rate=1e-3), FAMILY_DEFAULTS, "mujoco")
    assert (mujoco.num_envs, mujoco.num_steps, mujoco.num_minibatches, mujoco.update_epochs, mujoco.ent_coef) == (1, 2048, 32, 10, 0.0)
    assert mujoco.learning_rate == 1e-3


def test_explicit_flags_are_read_from_the_command_line():
    argv = ["--learning-rate", "1e-3", "--no-anneal-lr", "--total-timesteps=5", "--env-id", "X"]
    assert config.explicit_fields(argv, Args) == {"learning_rate", "anneal_lr", "total_timesteps", "env_id"}
