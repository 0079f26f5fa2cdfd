"""The tools work for DQN, SAC and TD3 as they do for PPO: `fleetrl tune` passes their own flags to them,
`--capture-video` records them, `fleetrl eval` plays their checkpoints and `fleetrl benchmark` runs them."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetrl.checkpoint import load_checkpoint

from conftest import fleetrl_env, require_module, run_fleetrl_in_process, skip_unless_ci

# a short run of each, learning on its last steps; SAC and TD3 need MuJoCo (their only env family). SAC and TD3 update on
# their last iteration's 100 steps (a run with 200 updates took 6.2 s of CPU here, with one 2.6 s)
CASES = {
    "dqn": ("CartPole-v1", ["--total-timesteps", "1500", "--learning-starts", "500", "--train-frequency", "4"], "target-network-frequency: {type: int, low: 100, high: 400}\n", "target_network_frequency"),
    "sac": ("InvertedPendulum-v5", ["--total-timesteps", "600", "--learning-starts", "500"], "q-lr: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\n", "q_lr"),
    "td3": ("InvertedPendulum-v5", ["--total-timesteps", "600", "--learning-starts", "500"], "policy-noise: {type: float, low: 0.1, high: 0.3}\n", "policy_noise"),
}


def fleetrl(monkeypatch, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`fleetrl ARGS` through the CLI's entry point in this process; the trainers that tune and benchmark start are real
    processes, and get ``env`` (with the tests' folder importable and one thread) as a run started by hand would."""
    for name, value in {**fleetrl_env(1), **(env or {})}.items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    return run_fleetrl_in_process(*args)


@functools.lru_cache(maxsize=None)
def offscreen_gl() -> str | None:
    """The MUJOCO_GL with which MuJoCo renders off-screen here (a video needs one without a display): EGL (Mesa's or
    NVIDIA's libEGL), else OSMesa's software renderer (libosmesa6); None where neither works."""
    probe = ("import gymnasium as gym; e = gym.make('InvertedPendulum-v5', render_mode='rgb_array'); e.reset(seed=0); "
             "assert e.render().ndim == 3; e.close()")
    for gl in ("egl", "osmesa"):
        if subprocess.run([sys.executable, "-c", probe], capture_output=True, env={**os.environ, "MUJOCO_GL": gl}, timeout=120).returncode == 0:
            return gl
    return None


def check_eval(run_dir, steps: int) -> None:
    """`fleetrl eval` plays the run's checkpoint through the policy interface."""
    evaluated = run_fleetrl_in_process("eval", str(run_dir), "--episodes", "2", "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and result["global_step"] == steps, result


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", list(CASES))
def test_a_tuned_trial_with_video_then_eval(algo, tmp_path, monkeypatch):
    """`fleetrl tune` passes the algorithm's own flag to its trainer, which records video; eval plays the trial's run."""
    env_id, flags, space, tuned_field = CASES[algo]
    if env_id.startswith("Inverted"):
        require_module("mujoco", "mujoco")
    optuna = require_module("optuna", "tune")
    from fleetrl.tools.tune import open_storage, parse_storage

    gl = "egl"
    if env_id.startswith("Inverted"):
        gl = offscreen_gl()
        if gl is None:  # .ci/run installs both renderers: a video check dropped there would hide a broken setup
            skip_unless_ci("MuJoCo cannot render off-screen here with MUJOCO_GL=egl or osmesa (apt-get install libegl1 libegl-mesa0 "
                           "libosmesa6), so the video of a MuJoCo run cannot be checked")
    (tmp_path / "space.yaml").write_text(space)
    tuned = fleetrl(monkeypatch, "tune", "--env-ids", env_id, "--search", str(tmp_path / "space.yaml"), "--trials", "1", "--study-name", algo,
                    "--out", str(tmp_path / "tune"), "--", "fleetrl", "train", algo, *flags, "--env-backend", "sync", "--no-cuda",
                    "--capture-video", env={"MUJOCO_GL": gl})
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    study = optuna.load_study(study_name=algo, storage=open_storage(parse_storage(str(tmp_path / "tune" / "study.log")), stale_after=600))
    (trial,) = study.trials
    name = space.split(":")[0]
    (run_dir,) = trial.user_attrs["run_dirs"]
    assert load_checkpoint(run_dir)["args"][tuned_field] == trial.params[name]  # what the trainer trained with
    assert f"--{name}" in tuned.stdout  # the ready-to-run command names it
    assert sorted((Path(run_dir) / "videos").glob("*.mp4")), f"{algo}: no video in {run_dir}"
    check_eval(run_dir, int(flags[1]))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_benchmark_runs_dqn_and_its_checkpoint_evaluates(tmp_path, monkeypatch):
    """`fleetrl benchmark` takes any algorithm's command (the runner does not look inside it): DQN here."""
    env_id, flags, _, _ = CASES["dqn"]
    out = tmp_path / "bench"
    proc = fleetrl(monkeypatch, "benchmark", "--env-ids", env_id, "--num-seeds", "1", "--out", str(out), "--", "fleetrl", "train", "dqn", *flags,
                   "--env-backend", "sync", "--no-cuda")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = out / f"{env_id}__1"
    assert load_checkpoint(run_dir)["global_step"] == int(flags[1])
    check_eval(run_dir, int(flags[1]))
