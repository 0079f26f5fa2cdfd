"""A checkpoint may come from anyone, so it never makes fleetrl import a module or write to a folder the user did not
name, in `fleetrl eval` or in `fleetrl train --resume`. The attack here is real: a checkpoint of a real run whose saved
env id names a module (`shipped_env:CartPole-v1`) and whose saved run folder points elsewhere, shipped beside a
`shipped_env.py` that leaves a marker file when imported, in the folder fleetrl runs in (`python -m fleetrl` puts the
current folder first on sys.path)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import fleetrl_env, run_fleetrl_in_process
from fleetrl import checkpoint

SHIPPED_ID = "shipped_env:CartPole-v1"  # gymnasium's CartPole, once the module is imported
SHIPPED_MODULE = """\
import os
import pathlib

pathlib.Path(__file__).with_name("IMPORTED").write_text(str(os.getpid()))  # what a payload would do: run, and leave a trace
"""
MORE = ["--total-timesteps", "1536", "--no-progress", "--no-cuda"]  # one iteration past the tiny run's 1,024 steps


@dataclass
class Download:
    folder: Path  # where the user runs fleetrl, with the shipped module in it
    run: Path  # the run folder, its checkpoint edited
    elsewhere: Path  # the run folder saved in the checkpoint

    @property
    def marker(self) -> Path:
        return self.folder / "IMPORTED"

    def steps(self) -> list[int]:
        return [int(p.stem.split("_")[1]) for p in checkpoint.list_checkpoints(self.run)]


def shipped_run(tmp_path: Path, finished_run: Path, env_id: str) -> Download:
    """A copy of a finished run whose checkpoint says it trained ``env_id`` in a folder outside tmp_path/download."""
    download = Download(tmp_path / "download", tmp_path / "download" / "run", tmp_path / "elsewhere")
    shutil.copytree(finished_run, download.run)
    state = checkpoint.load_checkpoint(download.run)
    state["args"] = {**state["args"], "env_id": env_id, "run_dir": str(download.elsewhere)}
    checkpoint.save_checkpoint(state, download.run, keep=1)
    (download.folder / "shipped_env.py").write_text(SHIPPED_MODULE)
    return download


@pytest.fixture
def download(tmp_path, tiny_cartpole_run) -> Download:
    return shipped_run(tmp_path, tiny_cartpole_run.run_dir, SHIPPED_ID)


def fleetrl_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m fleetrl ARGS` run in ``folder``, as a user runs it there."""
    return subprocess.run([sys.executable, "-m", "fleetrl", *args], capture_output=True, text=True, cwd=folder, timeout=240, env=fleetrl_env())


def assert_refused_naming_the_flag(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one paragraph
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_eval_imports_a_module_a_checkpoint_names_only_when_the_user_names_it_too(download):
    refused = fleetrl_in(download.folder, "eval", "run", "--episodes", "1")
    assert not download.marker.exists(), "the shipped module ran because the checkpoint named it"
    assert_refused_naming_the_flag(refused, "'shipped_env'", f"fleetrl eval run --env-id {SHIPPED_ID}")

    named = fleetrl_in(download.folder, "eval", "run", "--episodes", "1", "--env-id", SHIPPED_ID, "--json")
    assert named.returncode == 0 and download.marker.exists(), named.stderr[-3000:]  # the user's choice, made knowingly
    assert f'"env_id": "{SHIPPED_ID}"' in named.stdout


def test_resume_imports_a_module_a_checkpoint_names_only_when_the_user_names_it_too(download):
    for resume in (["--resume", "run"], ["--resume", "auto", "--run-dir", "run"]):
        refused = fleetrl_in(download.folder, "train", "ppo", *resume, *MORE)
        assert not download.marker.exists(), f"{resume}: the shipped module ran because the checkpoint named it"
        assert_refused_naming_the_flag(refused, "'shipped_env'", f"--env-id {SHIPPED_ID}")
        assert download.steps() == [1024] and not download.elsewhere.exists()

    named = fleetrl_in(download.folder, "train", "ppo", "--resume", "run", *MORE, "--env-id", SHIPPED_ID)
    assert named.returncode == 0 and download.marker.exists(), named.stderr[-3000:]
    assert download.steps() == [1024, 1536] and not download.elsewhere.exists(), "it went on in the folder it was given"


def test_a_resume_writes_into_the_run_folder_of_the_checkpoint_given_never_the_folder_saved_in_it(tmp_path, tiny_cartpole_run):
    download = shipped_run(tmp_path, tiny_cartpole_run.run_dir, "CartPole-v1")  # a plain id: nothing to import
    (ckpt,) = checkpoint.list_checkpoints(download.run)
    resumed = fleetrl_in(download.folder, "train", "ppo", "--resume", str(ckpt.relative_to(download.folder)), *MORE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert download.steps() == [1024, 1536] and not download.elsewhere.exists()

    # a checkpoint file kept outside a run's checkpoints/ folder names no run folder: the user gives one
    loose = shutil.copy(ckpt, tmp_path / "model.pt")
    refused = run_fleetrl_in_process("train", "ppo", "--resume", str(loose), *MORE, cwd=tmp_path)
    assert_refused_naming_the_flag(refused, "--run-dir FOLDER")
    assert not download.elsewhere.exists() and not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()
