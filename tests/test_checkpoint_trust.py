"""A checkpoint may come from anyone, so it never makes fleetrl import a module or write to a folder the user did not
name, in `fleetrl eval` or in `fleetrl train --resume`. The attack here is real: a checkpoint of a real run whose saved
env id names a module (`shipped_env:CartPole-v1`) and whose saved run folder points elsewhere, shipped beside a
`shipped_env.py` that leaves a marker file when imported, in the folder fleetrl runs in (`python -m fleetrl` puts the
current folder first on sys.path)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import fleetrl_env, run_fleetrl_here, run_fleetrl_in_process, run_python_file_here
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


def fleetrl_here_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """:func:`fleetrl_in` in this process: run in ``folder``, with it first on the import path as `python -m fleetrl` puts
    it; a module imported from it (the shipped one) is forgotten after, so the next import runs it again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        return run_fleetrl_here(*args, cwd=folder)


def assert_refused_naming_the_flag(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one paragraph
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_eval_imports_a_module_a_checkpoint_names_only_when_the_user_names_it_too(download):
    # in a process of its own, whose import path starts at the folder it runs in (the other tests here emulate it)
    refused = fleetrl_in(download.folder, "eval", "run", "--episodes", "1")
    assert not download.marker.exists(), "the shipped module ran because the checkpoint named it"
    assert_refused_naming_the_flag(refused, "'shipped_env'", f"fleetrl eval run --env-id {SHIPPED_ID}")

    named = fleetrl_in(download.folder, "eval", "run", "--episodes", "1", "--env-id", SHIPPED_ID, "--json")
    assert named.returncode == 0 and download.marker.exists(), named.stderr[-3000:]  # the user's choice, made knowingly
    assert f'"env_id": "{SHIPPED_ID}"' in named.stdout


def test_resume_imports_a_module_a_checkpoint_names_only_when_the_user_names_it_too(download):
    for resume in (["--resume", "run"], ["--resume", "auto", "--run-dir", "run"]):
        refused = fleetrl_here_in(download.folder, "train", "ppo", *resume, *MORE)
        assert not download.marker.exists(), f"{resume}: the shipped module ran because the checkpoint named it"
        assert_refused_naming_the_flag(refused, "'shipped_env'", f"--env-id {SHIPPED_ID}")
        assert download.steps() == [1024] and not download.elsewhere.exists()

    named = fleetrl_here_in(download.folder, "train", "ppo", "--resume", "run", *MORE, "--env-id", SHIPPED_ID)
    assert named.returncode == 0 and download.marker.exists(), named.stderr[-3000:]
    assert download.steps() == [1024, 1536] and not download.elsewhere.exists(), "it went on in the folder it was given"


def test_a_resume_writes_into_the_run_folder_of_the_checkpoint_given_never_the_folder_saved_in_it(tmp_path, tiny_cartpole_run):
    download = shipped_run(tmp_path, tiny_cartpole_run.run_dir, "CartPole-v1")  # a plain id: nothing to import
    (ckpt,) = checkpoint.list_checkpoints(download.run)
    resumed = fleetrl_here_in(download.folder, "train", "ppo", "--resume", str(ckpt.relative_to(download.folder)), *MORE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert download.steps() == [1024, 1536] and not download.elsewhere.exists()

    # a checkpoint file kept outside a run's checkpoints/ folder names no run folder: the user gives one
    loose = shutil.copy(ckpt, tmp_path / "model.pt")
    refused = run_fleetrl_in_process("train", "ppo", "--resume", str(loose), *MORE, cwd=tmp_path)
    assert_refused_naming_the_flag(refused, "--run-dir FOLDER")
    assert not download.elsewhere.exists() and not (tmp_path / "runs").exists() and not (tmp_path / "checkpoints").exists()


# ------------------------------------------------------------------------------------------ the algorithm's code
def crafted_algo_record(download: Download, kind: str) -> Path:
    """The attack seen by hand: the checkpoint's algorithm record names a module ``./evil.py`` (shipped beside it, leaving
    the marker when imported), and its path and sha256 name an empty file the user owns."""
    (download.folder / "evil.py").write_text(SHIPPED_MODULE)
    empty = download.folder / "empty_algo.py"
    empty.write_bytes(b"")
    state = checkpoint.load_checkpoint(download.run)
    state["algo"] = "evil"
    state["algo_file"] = {"kind": kind, "module": "./evil.py", "path": str(empty), "sha256": hashlib.sha256(b"").hexdigest()}
    checkpoint.save_checkpoint(state, download.run, keep=1)
    return empty


def test_eval_never_imports_the_module_a_checkpoint_names_for_its_algorithm(tmp_path, tiny_cartpole_run):
    download = shipped_run(tmp_path, tiny_cartpole_run.run_dir, "CartPole-v1")
    empty = crafted_algo_record(download, "module")
    refused = fleetrl_here_in(download.folder, "eval", "run", "--episodes", "1")
    assert not download.marker.exists(), "evil.py ran because the checkpoint named it"
    assert_refused_naming_the_flag(refused, f"--algo-file {empty}", "no sign that you ran that code yourself")
    for kind in ("file", "something-else"):  # whatever kind it claims, the record's path is read, never its module name
        crafted_algo_record(download, kind)
        refused = fleetrl_here_in(download.folder, "eval", "run", "--episodes", "1")
        assert not download.marker.exists() and refused.returncode == 2 and "--algo-file" in refused.stderr, refused.stderr


def test_code_the_user_ran_is_loaded_from_its_verified_bytes_never_by_the_recorded_module_name(tmp_path, tiny_cartpole_run, monkeypatch):
    from fleetrl.algos import eval_code, trusted
    from fleetrl.errors import FleetError

    download = shipped_run(tmp_path, tiny_cartpole_run.run_dir, "CartPole-v1")
    empty = crafted_algo_record(download, "module")
    monkeypatch.setenv("FLEETRL_HOME", str(tmp_path / "home"))
    trusted.remember(hashlib.sha256(b"").hexdigest(), str(empty))  # even when the user did run those bytes
    monkeypatch.chdir(download.folder)
    monkeypatch.syspath_prepend(str(download.folder))  # `python -m fleetrl` puts the current folder first
    with pytest.raises(FleetError, match="is not a fleetrl algorithm"):  # the empty file was loaded, by its path
        eval_code.for_checkpoint(checkpoint.load_checkpoint(download.run), "run", None)
    assert not download.marker.exists()
    monkeypatch.delitem(sys.modules, "empty_algo", raising=False)


@pytest.mark.timeout(300)
def test_a_run_folder_trained_under_another_home_needs_its_file_named_once(tmp_path, monkeypatch):
    """The tarball case: a colleague trains their own file under their home; the run folder and the file reach this user,
    who owns both once unpacked. Eval asks for --algo-file once, then remembers the file."""
    from fleetrl.algos import eval_code
    from fleetrl.errors import FleetError
    from fleetrl.tools.new import template

    theirs, mine = tmp_path / "their-home", tmp_path / "my-home"
    file = tmp_path / "shared_algo_t.py"
    file.write_text(template("ppo", "shared_algo_t"))
    run_dir = tmp_path / "run"
    monkeypatch.setenv("FLEETRL_HOME", str(theirs))
    trained = run_python_file_here(str(file), "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128", "--env-backend", "sync",
                                   "--no-progress", "--precision", "fp32", "--run-dir", str(run_dir), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    assert sha in (theirs / "code-you-ran.sha256").read_text()
    assert os.stat(theirs / "code-you-ran.sha256").st_mode & 0o777 == 0o600 and os.stat(theirs).st_mode & 0o077 == 0
    state = checkpoint.load_checkpoint(run_dir)

    monkeypatch.setenv("FLEETRL_HOME", str(mine))
    with pytest.raises(FleetError, match=f"--algo-file {file}") as refused:
        eval_code.for_checkpoint(state, str(run_dir), None)
    assert "shared_algo_t" not in sys.modules and "you have no record of code you ran yet" in str(refused.value)
    named = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", "--algo-file", str(file), "--json", user_code=tmp_path)
    assert named.returncode == 0, named.stderr[-3000:]
    again = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", "--json", user_code=tmp_path)  # remembered: no flag needed now
    assert again.returncode == 0 and json.loads(again.stdout)["episodes"] == 1, again.stderr[-3000:]
    monkeypatch.delitem(sys.modules, "shared_algo_t", raising=False)


def test_the_record_lives_in_the_users_home_and_is_believed_only_when_private(tmp_path, monkeypatch):
    from fleetrl.algos import trusted

    monkeypatch.delenv("FLEETRL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert trusted.record_path() == tmp_path / ".fleetrl" / "code-you-ran.sha256"
    trusted.remember("ab" * 32, "/somewhere/x.py")
    trusted.remember("ab" * 32, "/somewhere/x.py")  # once on the record
    assert trusted.record_path().read_text() == f"{'ab' * 32}  /somewhere/x.py\n"
    assert trusted.knows("ab" * 32) == (True, "") and not trusted.knows("cd" * 32)[0]
    trusted.record_path().chmod(0o666)  # anyone could have added a line
    ran, why = trusted.knows("ab" * 32)
    assert not ran and "open to other users" in why and "chmod 600" in why
    trusted.record_path().chmod(0o600)
    if os.geteuid() == 0:  # a record someone else owns is not this user's
        os.chown(trusted.record_path(), 65534, 65534)
        ran, why = trusted.knows("ab" * 32)
        assert not ran and "belongs to another user" in why


def test_a_resumed_checkpoint_never_turns_on_uploads_the_command_line_did_not_ask_for(tmp_path, tiny_cartpole_run):
    download = shipped_run(tmp_path, tiny_cartpole_run.run_dir, "CartPole-v1")
    state = checkpoint.load_checkpoint(download.run)
    state["args"] = {**state["args"], "track": True, "wandb_project_name": "someone-elses", "wandb_entity": "their-team"}
    checkpoint.save_checkpoint(state, download.run, keep=1)
    resumed = run_fleetrl_here("train", "ppo", "--resume", "auto", "--run-dir", str(download.run), *MORE, cwd=download.folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "a resume uploads only when its command line asks" in resumed.stderr
    args = checkpoint.load_checkpoint(download.run)["args"]
    assert (args["track"], args["wandb_project_name"], args["wandb_entity"]) == (False, "fleetrl", None)
    assert not list(download.run.rglob("wandb*")) and download.steps() == [1024, 1536]
