"""Bad input ends in one clear message and a non-zero exit, never a traceback or a hang; defaults by family."""

import math

import pytest
import torch

from fleetrl import config
from fleetrl.algos.ppo import FAMILY_DEFAULTS, Args, validate
from fleetrl.cli import main
from fleetrl.errors import FleetError

from conftest import run_fleetrl_here, run_fleetrl_in_process


def assert_clean_failure(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_unknown_env_id_names_the_closest_ids(tmp_path):
    # in this process: test_cli_fuzz.py's real processes check that a refusal exits cleanly from the interpreter too
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "CartPol-v1", "--run-dir", str(tmp_path / "r"))
    assert_clean_failure(proc, "Unknown --env-id", "CartPole-v1")


def test_batch_that_does_not_split_into_minibatches_is_refused_before_anything_runs(tmp_path):
    run_dir = tmp_path / "r"
    proc = run_fleetrl_in_process("train", "ppo", "--num-envs", "3", "--num-steps", "7", "--num-minibatches", "4", "--run-dir", str(run_dir))
    assert_clean_failure(proc, "does not split", "--num-minibatches")
    assert not run_dir.exists()


def test_missing_resume_file_and_auto_without_run_dir(tmp_path):
    assert_clean_failure(run_fleetrl_in_process("train", "ppo", "--resume", str(tmp_path / "missing.pt")), "does not exist")
    assert_clean_failure(run_fleetrl_in_process("train", "ppo", "--resume", "auto"), "--resume auto needs --run-dir")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert_clean_failure(run_fleetrl_in_process("train", "ppo", "--resume", str(corrupt)), "corrupt")


def test_unknown_command_and_missing_algorithm():
    assert_clean_failure(run_fleetrl_in_process("fly"), "Unknown command")
    assert_clean_failure(run_fleetrl_in_process("train"), "needs an algorithm")
    helped = run_fleetrl_in_process("train", "ppo", "--help")
    assert helped.returncode == 0 and "--num-envs" in helped.stdout and "--total-timesteps" in helped.stdout


def test_cuda_without_a_gpu_falls_back_to_cpu_with_one_warning(tmp_path, tiny_cartpole_run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_fleetrl_here("train", "ppo", "--cuda", "--total-timesteps", "512", "--no-progress", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "cuda" in line.lower()]
    assert len(warnings) == 1 and "CPU" in warnings[0]
    assert "cuda" not in tiny_cartpole_run.stderr.lower(), "--cuda by default (CleanRL's) falls back without a word"


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


# ---- the range of every numeric flag, and the checks across flags, before anything starts ----------


def test_a_range_rule_names_the_flag_what_it_is_for_and_the_value():
    with pytest.raises(FleetError) as refused:
        config.check_ranges(Args(gamma=1.5), {"gamma": config.fraction("the discount factor")})
    assert str(refused.value) == "--gamma must be in [0, 1] (the discount factor), got 1.5."
    rules = {"learning_rate": config.positive("the step size"), "num_envs": config.count("envs"), "target_kl": config.positive("kl", optional=True)}
    config.check_ranges(Args(learning_rate=1e-3, num_envs=1), rules)  # target_kl None: optional
    with pytest.raises(FleetError) as refused:  # every bad flag, in one paragraph
        config.check_ranges(Args(learning_rate=math.nan, num_envs=0, target_kl=-1.0), rules)
    message = str(refused.value)
    assert "\n" not in message and all(f in message for f in ("--learning-rate", "got nan", "--num-envs", "got 0", "--target-kl"))
    for value in (True, 2.0, "3", None):  # a count is a whole number: not a bool, a float, a string, nor unset
        with pytest.raises(FleetError, match="--num-envs must be a whole number"):
            config.check_ranges(Args(num_envs=value), {"num_envs": config.count("envs")})
    for value in (math.inf, -math.inf, math.nan, 1e31):
        with pytest.raises(FleetError, match="--clip-coef"):
            config.check_ranges(Args(clip_coef=value), {"clip_coef": config.positive("clip", config.COEF_MAX)})


def ppo_args(**overrides) -> Args:
    return config.apply_family_defaults(Args(**overrides), FAMILY_DEFAULTS, "classic")


def test_each_ranks_batch_must_split_into_whole_minibatches():
    validate(ppo_args(num_envs=4, num_steps=130, num_minibatches=4))  # one process: 520 samples, 4 x 130
    with pytest.raises(FleetError, match=r"each of the 4 processes holds 130\) does not split into --num-minibatches 4"):
        validate(ppo_args(num_envs=4, num_steps=130, num_minibatches=4), world_size=4)  # 130 / 4: 32 + a last minibatch of 2
    with pytest.raises(FleetError, match=r"each of the 2 processes holds 2\).*--num-minibatches 4.*divides 2 \(e.g. 1, 2\)"):
        validate(ppo_args(num_envs=2, num_steps=2, num_minibatches=4, total_timesteps=4), world_size=2)  # range(0, 2, 0)
    with pytest.raises(FleetError, match="must split evenly over the 3 processes"):
        validate(ppo_args(num_envs=4), world_size=3)
    validate(ppo_args(num_envs=4, num_steps=128, num_minibatches=4), world_size=4)  # 128 each, 4 x 32


def test_a_minibatch_of_one_sample_is_refused_while_advantages_are_normalised():
    with pytest.raises(FleetError, match="1 sample per minibatch.*--no-norm-adv"):
        validate(ppo_args(num_envs=1, num_steps=4, num_minibatches=4, total_timesteps=4))
    validate(ppo_args(num_envs=1, num_steps=4, num_minibatches=4, total_timesteps=4, norm_adv=False))


def cli_error(argv, capsys) -> str:
    """The one paragraph a refused command prints; it must exit 2 without a traceback."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err, err
    assert err.startswith("fleetrl: error: ") and err.count("\n") == 1, err
    return err


TRAIN_REFUSALS = [
    (["--learning-rate", "nan"], "--learning-rate must be in (0, 1e+30]"),
    (["--learning-rate", "inf"], "--learning-rate"),
    (["--learning-rate", "0"], "--learning-rate"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1] (the discount factor), got 1.5."),
    (["--gamma", "-0.1"], "--gamma"),
    (["--gae-lambda", "nan"], "--gae-lambda must be in [0, 1]"),
    (["--clip-coef", "0"], "--clip-coef must be in (0, 1e+30]"),
    (["--clip-coef", "1e308"], "--clip-coef"),  # overflowed float32 inside the loss
    (["--ent-coef", "-0.01"], "--ent-coef must be in [0, 1e+30]"),
    (["--vf-coef", "-1"], "--vf-coef"),
    (["--max-grad-norm", "0"], "--max-grad-norm"),
    (["--target-kl", "0"], "--target-kl must be in (0, 1e+30]"),
    (["--sticky-actions", "1.5"], "--sticky-actions must be in [0, 1]"),
    (["--dist-timeout", "0"], "--dist-timeout"),
    (["--env-timeout", "-1"], "--env-timeout"),
    (["--max-env-restarts", "-1"], "--max-env-restarts"),
    (["--num-envs", "0"], "--num-envs must be at least 1 (parallel environments, over all processes), got 0."),
    (["--num-steps", "-5"], "--num-steps"),
    (["--num-minibatches", "0"], "--num-minibatches"),
    (["--update-epochs", "0"], "--update-epochs"),
    (["--total-timesteps", "-1"], "--total-timesteps"),
    (["--checkpoint-every", "0"], "--checkpoint-every"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints"),
    (["--async-batch", "0"], "--async-batch must be at least 1"),
    (["--num-envs", "4", "--async-batch", "3"], "--async-batch 3 must divide --num-envs 4"),
    (["--policy-lag", "2"], "--policy-lag must be in [0, 1]"),
    (["--torch-threads", "0"], "--torch-threads"),
    (["--torch-threads", "2147483648"], "--torch-threads must be in [1, 1024]"),  # crashed torch
    (["--seed", "-1"], "--seed must be in [0, 2147483647]"),
    (["--run-dir", ""], "--run-dir is empty"),  # wrote runs/ and checkpoints/ into the working directory
    (["--num-envs", "1", "--num-steps", "4", "--num-minibatches", "4", "--total-timesteps", "4"], "1 sample per minibatch"),
]


@pytest.mark.parametrize("flags, needle", TRAIN_REFUSALS, ids=[" ".join(f) for f, _ in TRAIN_REFUSALS])
def test_train_refuses_each_value_out_of_range_before_the_start(flags, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", *(["--run-dir", "run"] if "--run-dir" not in flags else []), *flags]
    assert needle in cli_error(argv, capsys)
    assert list(tmp_path.iterdir()) == []  # refused before the start: no run folder, nothing else


def write_non_checkpoints(folder):
    (folder / "notes.txt").write_text("a text file\n")
    (folder / "empty.pt").write_bytes(b"")
    (folder / "no_checkpoints").mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "args": {"env_id": "CartPole-v1"}, "global_step": 1}, folder / "edited.pt")
    torch.save({"model": {}, "args": {"seed": 1}, "global_step": 1}, folder / "no_env.pt")


EVAL_REFUSALS = [
    (["notes.txt"], "notes.txt is not a fleetrl checkpoint (it is not a file written by torch.save)"),
    (["empty.pt"], "empty.pt is empty, not a fleetrl checkpoint"),
    (["no_checkpoints"], "No checkpoint in no_checkpoints/checkpoints"),
    (["missing.pt"], "missing.pt does not exist"),
    (["edited.pt"], "The network in edited.pt does not fit CartPole-v1"),
    (["no_env.pt"], "no_env.pt is not a fleetrl checkpoint (its saved arguments name no env id"),
    (["edited.pt", "--episodes", "0"], "--episodes must be at least 1"),
    (["edited.pt", "--seed", "-1"], "--seed must be in [0, 2147483647]"),  # numpy refused it with a traceback
]


@pytest.mark.parametrize("argv, needle", EVAL_REFUSALS, ids=[" ".join(a) for a, _ in EVAL_REFUSALS])
def test_eval_refuses_what_is_not_a_checkpoint_and_numbers_out_of_range(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_non_checkpoints(tmp_path)
    assert needle in cli_error(["eval", *argv], capsys)


def test_eval_of_a_checkpoint_kept_outside_its_run_writes_videos_beside_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["train", "ppo", "--env-backend", "sync", "--num-envs", "1", "--num-steps", "32", "--total-timesteps", "32", "--no-progress", "--run-dir", "run"])
    (tmp_path / "kept").mkdir()
    ckpt = next((tmp_path / "run" / "checkpoints").glob("ckpt_*.pt"))
    (tmp_path / "kept" / "model.pt").write_bytes(ckpt.read_bytes())
    monkeypatch.chdir(tmp_path / "kept")
    main(["eval", "model.pt", "--episodes", "1", "--capture-video"])
    assert list((tmp_path / "kept" / "videos_eval").glob("*.mp4")) and not (tmp_path / "videos_eval").exists()
    main(["eval", str(tmp_path / "run"), "--episodes", "1", "--capture-video"])  # a run folder: its own videos_eval
    assert list((tmp_path / "run" / "videos_eval").glob("*.mp4"))


TOOL_REFUSALS = [
    (["bench-env", "--seconds", "nan"], "--seconds must be a finite number, above 0"),
    (["bench-env", "--seconds", "inf"], "--seconds"),  # ran forever
    (["bench-env", "--seconds", "0"], "--seconds"),
    (["bench-env", "--repeats", "0"], "--repeats must be at least 1"),
    (["bench-env", "--async-batch", "0"], "--async-batch must be at least 1"),
    (["bench-env", "--num-envs", "2,4", "--async-batch", "4"], "--async-batch 4 must divide --num-envs 2"),
    (["bench-env", "--num-envs", "0"], "--num-envs takes comma-separated whole numbers of at least 1"),
    (["bench-env", "--num-envs", ""], "--num-envs takes comma-separated whole numbers"),
    (["bench-env", "--backends", "sync,nope"], "(unknown: nope)"),
    (["bench-env", "--backends", ","], "--backends takes comma-separated backends"),
    (["benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "0", "--", "true"], "--num-seeds must be in [1, 10000]"),
    (["benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "100000000000", "--", "true"], "--num-seeds"),  # filled the memory
    (["benchmark", "--env-ids", "CartPole-v1", "--start-seed", "-1", "--", "true"], "--start-seed must be in [0, 2147483647]"),
    (["benchmark", "--env-ids", "CartPole-v1", "--start-seed", "2147483647", "--num-seeds", "2", "--", "true"], "runs seeds past 2147483647"),
    (["benchmark", "--env-ids", "CartPole-v1", "--workers", "0", "--", "true"], "--workers"),
    (["benchmark", "--env-ids", "CartPole-v1", "--slurm-cpus-per-task", "0", "--", "true"], "--slurm-cpus-per-task"),
    (["benchmark", "--env-ids", "", "--", "true"], "none empty"),
    (["benchmark", "--env-ids", "CartPole-v1", "--out", "", "--", "true"], "--out is empty"),
    (["benchmark", "--env-ids", "CartPole-v1", "--out", "afile", "--", "true"], "Cannot create the output folder afile/logs"),
    (["benchmark", "--env-ids", "CartPole-v1", "--bootstrap-reps", "0", "--", "true"], "--bootstrap-reps must be in [100, 1000000]"),
    (["plot", "runs", "--smooth", "0"], "--smooth must be in [1, 1000000000]"),
    (["compare", "runs", "--bootstrap-seed", "-1"], "--bootstrap-seed must be in [0, 2147483647]"),
    (["preflight", "--seconds", "nan"], "--seconds must be a finite number, above 0"),
    (["preflight", "--seconds", "inf"], "--seconds"),  # ran forever
]


@pytest.mark.parametrize("argv, needle", TOOL_REFUSALS, ids=[" ".join(a) for a, _ in TOOL_REFUSALS])
def test_tools_refuse_each_value_out_of_range_before_they_start(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file where a folder goes\n")
    assert needle in cli_error(argv, capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]
