"""A user's own algorithm file (`fleetrl new NAME --from ALGO`) runs every way a built-in does: `python FILE`,
`fleetrl train ./FILE` and a module path, resume, torchrun, `fleetrl benchmark`, `fleetrl tune`; `fleetrl eval` rebuilds
its policy with the file's own code, and refuses an edited or missing file in one paragraph (docs/engine.md)."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import ALGOS
from fleetrl.tools.new import template

from conftest import (fleetrl_env, require_module, run_fleetrl, run_fleetrl_here, run_fleetrl_in_process, run_python_file_here,
                      skip_unless_ci)

# per algorithm: an env, and flags that make a run of `total` steps a few seconds long (two envs: torchrun splits them)
TINY = {
    "ppo": ("CartPole-v1", ["--num-envs", "2", "--num-steps", "64", "--precision", "fp32"], 512),
    "ppo_trxl": ("ProofofMemory-v0", ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--trxl-num-layers", "1",
                                      "--trxl-num-heads", "1", "--trxl-dim", "32"], 512),
    "ppo_lstm": ("CartPole-v1", ["--num-envs", "2", "--num-steps", "64", "--precision", "fp32"], 512),
    "ppg": ("CartPole-v1", ["--num-envs", "2", "--num-steps", "64", "--precision", "fp32", "--n-iteration", "2", "--e-auxiliary", "1",
                            "--num-aux-rollouts", "2"], 512),
    "ppo_rnd": ("CartPole-v1", ["--num-envs", "2", "--num-steps", "64", "--precision", "fp32", "--num-iterations-obs-norm-init", "1"], 512),
    "dqn": ("CartPole-v1", ["--num-envs", "2", "--learning-starts", "200", "--buffer-size", "1000"], 600),
    "c51": ("CartPole-v1", ["--num-envs", "2", "--learning-starts", "200", "--buffer-size", "1000"], 600),
    "rainbow": ("CartPole-v1", ["--num-envs", "2", "--learning-starts", "200", "--buffer-size", "1000", "--batch-size", "32"], 600),
    "pqn": ("CartPole-v1", ["--num-envs", "2", "--num-steps", "64", "--precision", "fp32"], 512),
    "sac": ("InvertedPendulum-v5", ["--num-envs", "2", "--learning-starts", "200", "--batch-size", "32"], 600),
    "td3": ("InvertedPendulum-v5", ["--num-envs", "2", "--learning-starts", "200", "--batch-size", "32"], 600),
    "ddpg": ("InvertedPendulum-v5", ["--num-envs", "2", "--learning-starts", "200", "--batch-size", "32"], 600),
    "sac_discrete": ("CartPole-v1", ["--num-envs", "2", "--learning-starts", "200", "--buffer-size", "1000", "--batch-size", "32"], 600),
    # its three phases: 200 teacher steps, 100 offline updates, 300 online steps; TEACHER: a short DQN run (dqn_teacher)
    "qdagger": ("CartPole-v1", ["--teacher-checkpoint", "TEACHER", "--teacher-steps", "200", "--offline-steps", "100", "--learning-starts",
                                "100", "--buffer-size", "1000", "--batch-size", "32", "--teacher-eval-episodes", "1"], 300),
}
COMMON = ["--env-backend", "sync", "--no-progress"]


def new_file(folder: Path, name: str, algo: str, *flags: str) -> subprocess.CompletedProcess:
    """`fleetrl new` in this process (the every-way tests run it for real)."""
    return run_fleetrl_in_process("new", name, "--from", algo, *flags, cwd=folder)


def dqn_teacher(folder: Path) -> str:
    """QDagger's teacher: a DQN run of 300 CartPole steps in ``folder``, in this process."""
    from fleetrl.algos import dqn

    dqn.train(dqn.Args(env_id="CartPole-v1", total_timesteps=300, learning_starts=100, buffer_size=1000, torch_threads=1, cuda=False,
                       env_backend="sync", progress=False, run_dir=str(folder)))
    return str(folder)


def train_flags(algo: str, total: int, run_dir: Path) -> list[str]:
    env_id, flags, _ = TINY[algo]
    flags = [dqn_teacher(run_dir.parent / "teacher") if flag == "TEACHER" else flag for flag in flags]
    return ["--env-id", env_id, *flags, *COMMON, "--total-timesteps", str(total), "--run-dir", str(run_dir)]


def python(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=fleetrl_env())


def saved(run_dir: Path) -> dict:
    return checkpoint.load_checkpoint(run_dir)


# ------------------------------------------------------------------------------------------ every way a built-in runs
class _UsersCopy:
    """`fleetrl new my_ALGO --from ALGO`, then the copy trains as `python FILE`, resumes under `fleetrl train ./FILE`,
    evaluates with its own code, trains under torchrun on 2 processes, and under `fleetrl benchmark` and `fleetrl tune`.
    How a file is imported, resumed, launched and handed to the tools is the same for every algorithm, so this runs for
    one on-policy and one off-policy algorithm; every other algorithm's copy trains and evaluates (test_each_copy_...)."""

    algo = ""
    # `fleetrl new` and `python FILE` as processes of their own: once (PPO's copy) is their proof; DQN's runs them here
    real = False

    @pytest.mark.slow
    @pytest.mark.timeout(600)
    def test_the_copy_runs_every_way_a_builtin_does(self, tmp_path):
        algo, name = self.algo, f"my_{self.algo}"
        total = TINY[algo][2]
        file = copy_of(algo, name, tmp_path, real=self.real)

        # python FILE (a real process for PPO's copy): half the budget; then fleetrl train ./FILE (in this process) resumes
        # it to the whole
        run_dir = tmp_path / "run"
        first_flags = train_flags(algo, total // 2, run_dir)
        first = python(file.name, *first_flags, cwd=tmp_path) if self.real else run_python_file_here(file.name, *first_flags, cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-3000:]
        state = saved(run_dir)
        assert state["algo"] == name and state["global_step"] < total
        assert state["algo_file"] == {"kind": "file", "module": name, "path": str(file.resolve()),
                                      "sha256": __import__("hashlib").sha256(file.read_bytes()).hexdigest()}
        resumed = run_fleetrl_here("train", f"./{file.name}", *train_flags(algo, total, run_dir), "--resume", "auto", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert saved(run_dir)["global_step"] == total
        assert saved(run_dir)["iteration"] > state["iteration"], "it went on from the checkpoint"

        # eval rebuilds the policy with the file's code
        evaluated = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", "--json", cwd=tmp_path)
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]

        # torchrun with 2 processes runs the file itself
        torchrun = Path(sys.executable).parent / "torchrun"
        dist_dir = tmp_path / "dist"
        proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", file.name, *train_flags(algo, total, dist_dir)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300, env=fleetrl_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert saved(dist_dir)["world_size"] == 2 and saved(dist_dir)["algo_file"]["path"] == str(file.resolve())

        # the tools (in this process; each run they start is a real `fleetrl train ./FILE`): a benchmark of one run, a study
        # of one trial (how a study goes on from trial to trial is test_tune's)
        env_id, flags, _ = TINY[algo]
        command = ["fleetrl", "train", f"./{file.name}", *flags, *COMMON, "--total-timesteps", str(total)]
        bench = run_fleetrl_here("benchmark", "--env-ids", env_id, "--num-seeds", "1", "--workers", "1", "--out", str(tmp_path / "bench"),
                                 "--", *command, cwd=tmp_path)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        assert saved(tmp_path / "bench" / f"{env_id}__1")["algo"] == name
        require_module("optuna", "tune")
        (tmp_path / "space.yaml").write_text("gamma: {type: float, low: 0.9, high: 0.99}\n")
        tune = run_fleetrl_here("tune", "--env-ids", env_id, "--search", "space.yaml", "--trials", "1", "--out", str(tmp_path / "tune"),
                                "--", *command, cwd=tmp_path)
        assert tune.returncode == 0, tune.stdout[-3000:] + tune.stderr[-3000:]
        assert re.search(r"trials 1/1 done: 1 complete", tune.stdout), tune.stdout[-3000:]
        assert saved(next((tmp_path / "tune").rglob("checkpoints")).parent)["algo"] == name, "the trial trained the file"


def copy_of(algo: str, name: str, folder: Path, real: bool = False) -> Path:
    """`fleetrl new NAME --from ALGO` in ``folder`` (``real``: as a process of its own): the copy's path."""
    if TINY[algo][0].startswith("Inverted"):
        require_module("mujoco", "mujoco")
    made = run_fleetrl("new", name, "--from", algo, cwd=folder, timeout=60) if real else new_file(folder, name, algo)
    assert made.returncode == 0, made.stderr
    file = folder / f"{name}.py"
    assert f"fleetrl new {name} --from {algo}" in file.read_text()
    return file


# a class each, so that the workers of `make test` share them out (pytest-xdist's loadscope)
class TestACopyOfPPO(_UsersCopy):
    algo = "ppo"
    real = True


class TestACopyOfDQN(_UsersCopy):
    algo = "dqn"


EVERY_WAY = {cls.algo for cls in _UsersCopy.__subclasses__()}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", [a for a in ALGOS if a not in EVERY_WAY])
def test_each_copy_trains_as_python_file_and_evaluates_with_its_own_code(tmp_path, algo):
    name = f"my_{algo}"
    file = copy_of(algo, name, tmp_path)
    run_dir = tmp_path / "run"
    # `python FILE` in this process (runpy, as __main__); ppo's and dqn's copies run it as a real process
    trained = run_python_file_here(file.name, *train_flags(algo, TINY[algo][2], run_dir), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    state = saved(run_dir)
    before_online = 300 if algo == "qdagger" else 0  # QDagger's clock counts its teacher's steps and offline updates first
    assert state["algo"] == name and state["global_step"] == TINY[algo][2] + before_online and state["algo_file"]["path"] == str(file.resolve())
    evaluated = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", "--json", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


def test_every_builtin_has_a_copy_test():
    assert set(ALGOS) == set(TINY), "each algorithm's copy trains and evaluates (and ppo's and dqn's run every way)"


# ------------------------------------------------------------------------------------------ the template
@pytest.mark.parametrize("algo", ALGOS)
def test_a_template_is_the_builtin_with_its_names_changed_and_the_same_imports(algo):
    builtin = (Path(__file__).parent.parent / "fleetrl" / "algos" / f"{algo}.py").read_text()
    copy = template(algo, "mine")
    assert copy.startswith("# mine.py: your own copy of fleetrl's")
    differing = [(a, b) for a, b in zip(builtin.splitlines(), copy.splitlines()[3:]) if a != b]
    assert len(copy.splitlines()) == len(builtin.splitlines()) + 3
    assert len(differing) == 2 and all("mine" in b and algo in a for a, b in differing), differing
    assert 'exp_name: str = "mine"' in copy

    def imports(text: str) -> set[tuple[str, str]]:
        return {(node.module, alias.name) for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imports(copy) == imports(builtin)
    assert "train_main(__name__)" in copy


# ------------------------------------------------------------------------------------------ eval uses the file's code
@pytest.mark.timeout(300)
def test_eval_uses_the_files_own_network_and_refuses_an_edited_or_missing_file(tmp_path):
    assert new_file(tmp_path, "wide", "ppo").returncode == 0
    file = tmp_path / "wide.py"
    text = file.read_text()
    # a wider actor than the built-in's: only this file's network fits the checkpoint
    file.write_text(text.replace("self.actor = mlp(int(np.prod(obs_shape)), num_outputs, out_std=0.01)",
                                 "self.actor = mlp(int(np.prod(obs_shape)), num_outputs, out_std=0.01, hidden=(96, 96))", 1))
    assert file.read_text() != text
    run_dir = tmp_path / "run"
    trained = run_python_file_here("wide.py", *train_flags("ppo", 256, run_dir), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert saved(run_dir)["model"]["actor.0.weight"].shape == (96, 4)

    def evaluate(*flags: str) -> subprocess.CompletedProcess:  # from another folder: the path is recorded
        return run_fleetrl_here("eval", str(run_dir), "--episodes", "1", *flags, user_code=tmp_path)

    evaluated = evaluate()
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    recorded = saved(run_dir)["algo_file"]["sha256"]

    # edited: one paragraph naming both hashes, and the two ways out
    file.write_text(file.read_text() + "\n# an edit after training\n")
    edited = evaluate()
    now = __import__("hashlib").sha256(file.read_bytes()).hexdigest()
    assert edited.returncode == 2 and "Traceback" not in edited.stderr
    assert recorded in edited.stderr and now in edited.stderr and "--algo-file" in edited.stderr, edited.stderr
    named = evaluate("--algo-file", str(file))
    assert named.returncode == 0, named.stderr[-3000:]
    assert "not the code this checkpoint was trained with" in named.stderr

    # missing: never a built-in in its place
    file.rename(tmp_path / "elsewhere.py")
    missing = evaluate()
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "not there" in missing.stderr and "--algo-file" in missing.stderr and recorded in missing.stderr, missing.stderr
    # the built-in's network does not fit: eval with it would have to fail, so naming it says so, no traceback
    builtin = evaluate("--algo-file", "ppo")
    assert builtin.returncode == 2 and "does not fit" in builtin.stderr and "Traceback" not in builtin.stderr, builtin.stderr


def test_eval_runs_no_file_that_belongs_to_another_user(tmp_path):
    if os.geteuid() != 0:
        skip_unless_ci("giving a file to another user needs root")
    from fleetrl.algos import eval_code
    from fleetrl.algos.source import sha256_of
    from fleetrl.errors import FleetError

    file = tmp_path / "theirs.py"
    file.write_text("raise SystemExit('this code must not run')\n")
    os.chown(file, 65534, 65534)
    state = {"algo": "theirs", "algo_file": {"kind": "file", "module": "theirs", "path": str(file), "sha256": sha256_of(file)}}
    with pytest.raises(FleetError, match="belongs to another user"):
        eval_code.for_checkpoint(state, "ckpt.pt", None)


def test_a_checkpoint_of_an_unknown_algorithm_without_a_file_record_is_refused_not_built_in(tmp_path):
    from fleetrl.algos import eval_code
    from fleetrl.errors import FleetError

    with pytest.raises(FleetError, match="--algo-file"):
        eval_code.for_checkpoint({"algo": "my_ppo"}, "ckpt.pt", None)
    assert eval_code.for_checkpoint({"algo": "dqn"}, "ckpt.pt", None).__name__ == "fleetrl.algos.dqn"  # older checkpoints


# ------------------------------------------------------------------------------------------ a module path
@pytest.mark.timeout(300)
def test_a_module_path_trains_and_evaluates(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "my_algo.py").write_text(template("ppo", "my_algo"))
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", "mypkg.my_algo", *train_flags("ppo", 256, run_dir), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    record = saved(run_dir)["algo_file"]
    assert record["kind"] == "module" and record["module"] == "mypkg.my_algo" and record["path"] == str(package / "my_algo.py")
    evaluated = run_fleetrl_here("eval", str(run_dir), "--episodes", "1", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


# ------------------------------------------------------------------------------------------ bad input
def test_bad_algorithm_files_are_one_clear_paragraph(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("import numpy\n\n\ndef helper():\n    raise ValueError('my own bug')\n\n\nhelper()\n")
    cases = {
        ("train", "./empty.py"): ["is not a fleetrl algorithm", "no Args and no train", "fleetrl new"],
        ("train", "./broken.py"): ["failed to import", "my own bug", 'broken.py", line 8', 'broken.py", line 5, in helper'],
        ("train", "./nowhere.py"): ["There is no algorithm file ./nowhere.py"],
        ("train", "no_such_pkg.algo"): ["There is no algorithm module 'no_such_pkg.algo'"],
        ("train", "./empty.py", "--help"): ["is not a fleetrl algorithm"],
    }
    for args, expected in cases.items():
        proc = run_fleetrl_here(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("fleetrl: error: "), (args, proc.stderr)
        assert "fleetrl/" not in proc.stderr, "the traceback shown is the user's own code, not fleetrl's frames"
        for text in expected:
            assert text in proc.stderr, (args, text, proc.stderr)


def test_new_never_overwrites_a_file_without_force_and_refuses_bad_names(tmp_path):
    (tmp_path / "mine.py").write_text("# my work\n")
    refused = new_file(tmp_path, "mine", "ppo")
    assert refused.returncode == 2 and "--force" in refused.stderr and "never overwrites" in refused.stderr
    assert (tmp_path / "mine.py").read_text() == "# my work\n"
    forced = new_file(tmp_path, "mine", "dqn", "--force")
    assert forced.returncode == 0 and 'exp_name: str = "mine"' in (tmp_path / "mine.py").read_text()
    for name, message in (("json", "already the name of the module json"), ("torch", "already the name of the module torch"),
                          ("2fast", "must be a Python module name"), ("my-ppo", "must be a Python module name")):
        proc = new_file(tmp_path, name, "ppo")
        assert proc.returncode == 2 and message in proc.stderr, (name, proc.stderr)
        assert not (tmp_path / f"{name}.py").exists()
    unknown = new_file(tmp_path, "x1", "a2c")
    assert unknown.returncode == 2 and ", ".join(ALGOS) in unknown.stderr
    sub = new_file(tmp_path, "experiments/x2.py", "ppo")
    assert sub.returncode == 2 and "mkdir -p experiments" in sub.stderr


def test_the_copy_checkpoint_refuses_to_resume_under_another_algorithm(tmp_path):
    assert new_file(tmp_path, "my_ppo", "ppo").returncode == 0
    run_dir = tmp_path / "run"
    assert run_python_file_here("my_ppo.py", *train_flags("ppo", 256, run_dir), cwd=tmp_path).returncode == 0
    other = run_fleetrl_here("train", "ppo", *train_flags("ppo", 512, run_dir), "--resume", "auto", cwd=tmp_path)
    assert other.returncode == 2 and "my_ppo" in other.stderr, other.stderr
    assert torch.is_tensor(saved(run_dir)["model"]["actor.0.weight"])


# ------------------------------------------------------------------------------------------ SIGTERM and exact resume
@pytest.mark.timeout(300)
def test_sigterm_stops_a_users_file_that_names_itself_to_resume_and_the_resume_is_exact(tmp_path):
    """`python my_ppo.py` under SIGTERM checkpoints and says to continue with `python my_ppo.py --resume auto`; that resume
    ends bit-identical to an uninterrupted run of the same file. The stopped run is a real process (the signal is real);
    the uninterrupted run and the resume run the file in this process, all three on one torch thread."""
    from conftest import assert_same_learner

    assert new_file(tmp_path, "my_ppo", "ppo").returncode == 0
    iterations, batch = 24, 4 * 128
    train = ["my_ppo.py", "--env-id", "fleetrl_test_envs:Stateless-v0", "--env-backend", "sync", "--no-cuda", "--num-envs", "4",
             "--total-timesteps", str(iterations * batch), "--checkpoint-every", "4", "--no-progress", "--torch-threads", "1"]
    whole = run_python_file_here(*train, "--run-dir", "whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    proc = subprocess.Popen([sys.executable, *train, "--run-dir", "stopped"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env=fleetrl_env())
    try:
        deadline = time.time() + 120
        while not checkpoint.list_checkpoints(tmp_path / "stopped"):
            assert proc.poll() is None and time.time() < deadline, "no first checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in output, output[-3000:]
    assert "continue it with: python my_ppo.py --resume auto --run-dir stopped" in output, output[-3000:]
    assert saved(tmp_path / "stopped")["global_step"] < iterations * batch
    resumed = run_python_file_here(*train, "--run-dir", "stopped", "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_learner(saved(tmp_path / "whole"), saved(tmp_path / "stopped"))


def test_the_algorithm_a_command_trains_is_forgotten_when_it_ends(tmp_path):
    """`fleetrl train` run in this process records its file for its checkpoints only: a train() called after it here
    (a test, a notebook) must not record another algorithm's file."""
    from fleetrl import run_setup

    proc = run_fleetrl_here("train", "ppo", *train_flags("ppo", 128, tmp_path / "run"), "--num-steps", "64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert saved(tmp_path / "run")["algo_file"]["module"] == "fleetrl.algos.ppo"
    assert run_setup.training_code() is None and run_setup.command_for("ppo") == "fleetrl train ppo"
