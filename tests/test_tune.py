"""`fleetrl tune`: real Optuna studies (journal, SQLite, PostgreSQL) of tiny CartPole trials: the trial count is global and
exact, tuned values reach the trainer, crashes fail one trial, weak trials are pruned mid-run, tuners share studies, a
stopped or killed tuner leaves the storage consistent, and bad input is one clear error."""

from __future__ import annotations

import csv
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import require_module  # noqa: E402

optuna = require_module("optuna", "tune")  # under CI=true a missing tune extra fails, never skips
from optuna.trial import TrialState  # noqa: E402

from fleetrl import cli  # noqa: E402
from fleetrl.checkpoint import load_checkpoint  # noqa: E402
from fleetrl.cores import available_cores  # noqa: E402
from fleetrl.monitor.tbread import read_scalars  # noqa: E402
from fleetrl.tools.tune.score import EpisodeFollower, run_score, trial_score  # noqa: E402
from fleetrl.tools.tune.storage import open_storage, parse_storage  # noqa: E402
from fleetrl.tools.tune.study import counted  # noqa: E402

from conftest import fleetrl_env, killed_on_exit, run_fleetrl_in_process, start_fleetrl  # noqa: E402

# 8 iterations of 2 envs x 128 steps: a trial costs a few seconds, mostly the trainer's start
TINY = ["fleetrl", "train", "ppo", "--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "128", "--env-backend", "sync"]
SPACE = """\
learning-rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
update-epochs: {type: int, low: 2, high: 4}
anneal-lr: {type: categorical, choices: [true, false]}
"""
MINIBATCHES = "num-minibatches: {type: categorical, choices: [2, 4, 8]}\n"


@pytest.fixture(autouse=True)
def trials_find_the_test_envs(monkeypatch):
    """A tuner run in this test's process (run_fleetrl_in_process) starts its trials with this environment: the tests'
    folder importable (fleetrl_test_envs), as conftest.fleetrl_env gives a tuner process."""
    monkeypatch.setenv("PYTHONPATH", fleetrl_env()["PYTHONPATH"])


def write_space(tmp_path: Path, text: str = SPACE) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def tune_args(tmp_path: Path, *flags: str, space: Path | None = None, command: list[str] = TINY, env_ids: tuple[str, ...] = ("CartPole-v1",)) -> list[str]:
    return ["tune", "--env-ids", *env_ids, "--search", str(space or write_space(tmp_path)), "--study-name", "test", *flags, "--", *command]


def load(storage: str):
    return optuna.load_study(study_name="test", storage=open_storage(parse_storage(storage), stale_after=600))


def queue_trials(storage: str, *params: dict) -> None:
    """Create the study with these trials queued: the tuner runs them first, in this order. A test that needs given
    values does not depend on which ones a sampler draws, an order that may change with Optuna's version."""
    study = optuna.create_study(study_name="test", storage=open_storage(parse_storage(storage), stale_after=600), direction="maximize")
    for values in params:
        study.enqueue_trial(values)


def threads_per_run(parallel: int) -> int:
    """The threads the tuner gives each of ``parallel`` runs on this machine: its cores shared out."""
    return max(1, available_cores() // parallel)


def assert_trained_with(t, run_dir: str, seed: int, env_id: str = "CartPole-v1") -> None:
    """The run of trial ``t`` trained with the trial's values (the first parameter too: CleanRL's #533), the command's
    fixed flags, its seed and env, and the threads the tuner gave it (each of 2 runs at once)."""
    saved = load_checkpoint(run_dir)["args"]  # what the trainer actually trained with
    assert saved["learning_rate"] == t.params["learning-rate"] and saved["update_epochs"] == t.params["update-epochs"]
    assert saved["anneal_lr"] is t.params["anneal-lr"] and saved["num_minibatches"] == t.params["num-minibatches"]
    assert saved["seed"] == seed and saved["env_id"] == env_id and saved["torch_threads"] == threads_per_run(2)
    assert saved["total_timesteps"] == 2048 and saved["num_steps"] == 128


def trials_csv(out: Path) -> list[dict]:
    with open(out / "trials.csv") as f:
        return list(csv.DictReader(f))


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def trainers_in(folder: Path) -> list[psutil.Process]:
    """Live processes started for runs under ``folder`` (their command line holds its path)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if any(str(folder) in part for part in cmdline) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


# ---- a study runs, records every trial, and resumes ---------------------------------------------


@pytest.mark.slow
def test_two_trial_study_with_parallel_two_trains_each_with_its_values_and_a_rerun_with_three_adds_one(tmp_path):
    # the tuner in this process (the trials are processes, as always): a tuner process is only needed for signals. Two
    # trials run at once; the rerun's two workers then ask together for the one trial left, and only one gets it (the
    # count includes running trials). A worker that runs one trial after another: the crashing-trial test below
    out, storage = tmp_path / "out", f"sqlite:///{tmp_path / 'tune.db'}"
    space = write_space(tmp_path, SPACE + MINIBATCHES)
    proc = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "2", "--parallel", "2", "--storage", storage, "--out", str(out),
                                             space=space))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    threads = threads_per_run(2)
    assert "2 trials at once here" in proc.stdout and f"with {threads} thread{'s' if threads > 1 else ''}" in proc.stdout
    study = load(storage)
    assert len(study.trials) == 2 and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert max(t.datetime_start for t in study.trials) < min(t.datetime_complete for t in study.trials)  # two at once
    for t in study.trials:
        assert len(t.intermediate_values) >= 5 and all(step % 204 == 0 for step in t.intermediate_values)  # aligned steps
        (run_dir,) = t.user_attrs["run_dirs"]
        assert Path(run_dir).is_dir() and Path(run_dir).parent.name == f"trial_{t.number:04d}"
        assert_trained_with(t, run_dir, seed=1)  # each trial's own values, in its own run
    assert "train with them:" in proc.stdout and "fleetrl train ppo --total-timesteps 2048" in proc.stdout
    assert f"optuna-dashboard {storage}" in proc.stdout
    assert (out / "optimization_history.png").stat().st_size > 0 and (out / "param_importances.png").stat().st_size > 0
    assert len(trials_csv(out)) == 2

    again = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "3", "--parallel", "2", "--storage", storage, "--out", str(out),
                                              space=space))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "has 2 of 3 trials" in again.stdout and again.stdout.count(" started: ") == 1
    study = load(storage)
    assert [t.number for t in study.trials] == list(range(3)) and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert_trained_with(study.trials[2], study.trials[2].user_attrs["run_dirs"][0], seed=1)
    rows = trials_csv(out)
    assert [r["number"] for r in rows] == [str(n) for n in range(3)] and {r["state"] for r in rows} == {"COMPLETE"}


@pytest.mark.slow
def test_a_trial_on_two_envs_and_two_seeds_gives_every_run_its_values_and_scores_the_mean_of_the_envs_normalised_returns(tmp_path):
    out = tmp_path / "out"
    proc = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "1", "--parallel", "2", "--num-seeds", "2", "--start-seed", "5",
                                             "--target-scores", "CartPole-v1=0,500", "CartPole-v0=10,210", "--last-episodes", "5",
                                             "--out", str(out), space=write_space(tmp_path, SPACE + MINIBATCHES),
                                             env_ids=("CartPole-v1", "CartPole-v0")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (trial,) = load(str(out / "study.log")).trials  # the default storage: a journal file in --out
    assert trial.state == TrialState.COMPLETE
    run_dirs = trial.user_attrs["run_dirs"]
    assert [Path(d).name for d in run_dirs] == ["CartPole-v1__5", "CartPole-v1__6", "CartPole-v0__5", "CartPole-v0__6"]
    for run_dir, (env_id, seed) in zip(run_dirs, [(e, s) for e in ("CartPole-v1", "CartPole-v0") for s in (5, 6)]):
        assert_trained_with(trial, run_dir, seed, env_id)
    # each env's last 5 returns normalised by its targets, the envs averaged, then the seeds
    last = [[p.value for p in read_scalars(d, "charts/episodic_return")][-5:] for d in run_dirs]
    v1, v0 = [sum(r) / len(r) / 500 for r in last[:2]], [(sum(r) / len(r) - 10) / 200 for r in last[2:]]
    expected = sum((a + b) / 2 for a, b in zip(v1, v0)) / 2
    assert trial.value == pytest.approx(expected, rel=1e-6)
    assert "best: trial 0, score" in proc.stdout and "(mean return)" not in proc.stdout
    assert "--env-id CartPole-v1" in proc.stdout and "--env-id CartPole-v0" in proc.stdout  # a command for each env


@pytest.mark.slow
def test_a_crashing_trial_is_failed_with_its_exit_code_and_log_a_weak_one_is_pruned_mid_run_and_the_study_completes(tmp_path):
    out, total = tmp_path / "out", 4096
    space = write_space(tmp_path, "learning-rate: {type: categorical, choices: [1.0e-7, 2.5e-3]}\n"
                                  "num-minibatches: {type: categorical, choices: [4, 7]}\n")
    command = ["fleetrl", "train", "ppo", "--total-timesteps", str(total), "--num-envs", "4", "--num-steps", "128", "--env-backend", "sync"]
    # three trials in turn. A batch of 4 x 128 does not split into 7 minibatches: the trainer refuses the first and exits 2.
    # Then a learning trial (2.5e-3) and one that cannot learn (1e-7); prune from the first complete trial on (a failed one
    # does not count). CartPole with 1 ms of sleep a step: a run lasts seconds on any machine, so the tuner (polling every
    # 0.2 s) can catch it mid-run. The weak trial falls below the learning one's curve by step 1024-1536 (seen: 18 against
    # 24-30, then 45 at 2048), and its last 2,560 steps still sleep 2.6 s
    queue_trials(str(out / "study.log"), {"learning-rate": 2.5e-3, "num-minibatches": 7}, {"learning-rate": 2.5e-3, "num-minibatches": 4},
                 {"learning-rate": 1.0e-7, "num-minibatches": 4})
    proc = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "3", "--sampler", "random", "--prune-after-trials", "1",
                                             "--prune-warmup", "0", "--report-every", "512", "--out", str(out), space=space,
                                             command=command, env_ids=("fleetrl_test_envs:SlowCartPole-v1",)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = load(str(out / "study.log"))
    failed, complete, weak = study.trials

    assert failed.state == TrialState.FAIL and failed.params["num-minibatches"] == 7
    assert failed.user_attrs["exit_code"] == 2
    assert "--num-minibatches 7" in Path(failed.user_attrs["log"]).read_text()
    assert "exit code 2" in failed.user_attrs["fail_reason"]
    # the report, with the log's tail
    assert f"trial {failed.number} failed: fleetrl_test_envs:SlowCartPole-v1 seed 1: exit code 2" in proc.stdout, proc.stdout
    (row,) = [r for r in trials_csv(out) if r["number"] == str(failed.number)]
    assert row["state"] == "FAIL" and row["exit_code"] == "2" and row["log"] == failed.user_attrs["log"]

    assert complete.state == TrialState.COMPLETE and complete.params["learning-rate"] == 2.5e-3
    assert weak.state == TrialState.PRUNED, [(t.state, t.intermediate_values) for t in study.trials]
    step = weak.user_attrs["pruned_at_step"]
    assert step < total and max(weak.intermediate_values) == step
    (run_dir,) = weak.user_attrs["run_dirs"]
    last = read_scalars(run_dir, "charts/SPS")[-1].step
    assert last < total, f"the weak trial's run went on to step {last}"  # stopped mid-run, not after it
    assert "pruned at step" in proc.stdout


# ---- tuners share a study -----------------------------------------------------------------------


def two_tuners_share_one_study(tmp_path: Path, storage: str) -> None:
    """Two tuners at once, a process and this test's own, on one study of 3 trials: exactly 3 (a count kept by each tuner
    would make up to 6), none lost, none run twice."""
    space = write_space(tmp_path)
    other = start_fleetrl(*tune_args(tmp_path, "--trials", "3", "--storage", storage, "--out", str(tmp_path / "out0"), space=space))
    with killed_on_exit(other):
        here = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "3", "--storage", storage, "--out", str(tmp_path / "out1"),
                                                 space=space))
        outputs = [other.communicate(timeout=400)[0], here.stdout]
    for code, output in zip((other.returncode, here.returncode), outputs):
        assert code == 0, output
    study = load(storage)
    assert sorted(t.number for t in study.trials) == [0, 1, 2]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    run_dirs = [d for t in study.trials for d in t.user_attrs["run_dirs"]]
    assert len(set(run_dirs)) == 3 and all(Path(d).is_dir() for d in run_dirs)
    started = [output.count(" started: ") for output in outputs]
    assert sum(started) == 3, outputs


@pytest.mark.slow
def test_two_tuners_share_one_sqlite_study_without_losing_or_duplicating_trials(tmp_path):
    two_tuners_share_one_study(tmp_path, f"sqlite:///{tmp_path / 'shared.db'}")


@pytest.mark.slow
def test_two_tuners_share_one_postgresql_study_without_losing_or_duplicating_trials(tmp_path, postgres_url):
    two_tuners_share_one_study(tmp_path, postgres_url)


# ---- a stopped or killed tuner ------------------------------------------------------------------

LONG = ["fleetrl", "train", "ppo", "--total-timesteps", "500000", "--num-envs", "2", "--num-steps", "128", "--env-backend", "sync"]


@pytest.mark.slow
def test_sigterm_stops_the_running_trials_records_them_failed_and_a_rerun_runs_them_again(tmp_path):
    out = tmp_path / "out"
    args = tune_args(tmp_path, "--trials", "1", "--out", str(out), command=LONG)
    tuner = start_fleetrl(*args)
    wait_for(lambda: list(out.glob("trial_0000/*/events.out.tfevents.*")), 120, "the first trial's run to log")
    tuner.send_signal(signal.SIGTERM)
    output = tuner.communicate(timeout=60)[0]
    assert tuner.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output and "The same command resumes the study" in output
    wait_for(lambda: not trainers_in(out), 10, "the trial's processes to end")
    study = load(str(out / "study.log"))
    interrupted, retry = study.trials
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["fail_reason"].startswith("interrupted")
    assert retry.state == TrialState.WAITING and retry.user_attrs["retry_of"] == 0  # its parameters: checked when it runs, below
    assert counted(study.trials) == 0  # an interrupted trial does not use up --trials: its retry will
    assert read_scalars(interrupted.user_attrs["run_dirs"][0], "charts/SPS")[-1].step < 500000

    rerun = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "1", "--out", str(out), "--trial-timeout", "0.5", command=LONG))
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr  # the retry timed out: no trial completed
    assert "No trial of the study 'test' completed" in rerun.stderr
    study = load(str(out / "study.log"))
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert study.trials[1].params == interrupted.params and "timeout" in study.trials[1].user_attrs["fail_reason"]


def the_next_tuner_fails_them_as_stale_and_runs_them_again(tmp_path: Path, out: Path, storage: str, killed: float, command: list[str]) -> None:
    """The study's trials are RUNNING, left by a tuner SIGKILLed at ``killed`` (time.monotonic()). A tuner started 3.5 s
    after the kill (the last heartbeat came before it: longer than --stale-after 3 without one) fails each as stale and
    runs its retry, with the same parameters; --trial-timeout then ends each retry."""
    stale = load(storage).trials
    assert stale and all(t.state == TrialState.RUNNING for t in stale), [t.state for t in stale]  # what a killed tuner leaves
    time.sleep(max(0.0, killed + 3.5 - time.monotonic()))
    n = str(len(stale))
    rerun = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", n, "--parallel", n, "--out", str(out), "--storage", storage,
                                              "--stale-after", "3", "--trial-timeout", "0.5", command=command))
    assert "Traceback" not in rerun.stderr, rerun.stderr
    trials = load(storage).trials
    assert [t.state for t in trials] == [TrialState.FAIL] * (2 * len(stale)), rerun.stdout  # stale, then the retries' timeouts
    retries = trials[len(stale):]
    assert sorted(t.user_attrs["retry_of"] for t in retries) == [t.number for t in stale]
    for retry in retries:
        assert retry.params == stale[retry.user_attrs["retry_of"]].params and "timeout" in retry.user_attrs["fail_reason"]


@pytest.mark.slow
def test_a_killed_tuners_trial_on_sqlite_is_failed_as_stale_by_the_next_tuner_and_run_again(tmp_path):
    """Optuna's own heartbeat, on an RDB storage; a journal's (the tuner's user attribute): the SIGKILL test below."""
    out, storage = tmp_path / "out", f"sqlite:///{tmp_path / 'tune.db'}"
    tuner = start_fleetrl(*tune_args(tmp_path, "--trials", "1", "--out", str(out), "--storage", storage, command=LONG))
    wait_for(lambda: list(out.glob("trial_0000/*/events.out.tfevents.*")), 120, "the first trial's run to log")
    tuner.kill()  # SIGKILL: no chance to record anything
    killed = time.monotonic()
    tuner.communicate(timeout=30)
    wait_for(lambda: not trainers_in(out), 30, "the orphaned run to end (it gets SIGTERM when its tuner dies)")
    the_next_tuner_fails_them_as_stale_and_runs_them_again(tmp_path, out, storage, killed, LONG)


@pytest.mark.slow
def test_a_tuner_killed_by_sigkill_leaves_no_process_of_its_trials_behind_and_the_next_fails_them_as_stale_and_runs_them_again(tmp_path):
    """Each run watches its tuner (fleetrl/parent_watch.py): a tuner killed outright stops nothing itself, yet the trainers
    of its running trials, started from its worker threads, end within seconds with a checkpoint, and their env workers
    with them. Its trials stay RUNNING in the journal until the next tuner finds them stale."""
    out = tmp_path / "out"
    storage = str(out / "study.log")
    command = [*LONG[:-1], "async"]  # env worker processes in each run's group, besides the trainer
    tuner = start_fleetrl(*tune_args(tmp_path, "--trials", "2", "--parallel", "2", "--out", str(out), "--storage", storage, command=command))
    with killed_on_exit(tuner):
        wait_for(lambda: len(list(out.glob("trial_000[01]/*/events.out.tfevents.*"))) == 2, 180, "both trials' runs to log")
        trainers = [p for p in trainers_in(out) if p.pid != tuner.pid]
        assert len(trainers) == 2, trainers
        procs = [*trainers, *(child for trainer in trainers for child in trainer.children(recursive=True))]
        tuner.kill()
        killed = time.monotonic()
        tuner.communicate(timeout=30)
        _, left = psutil.wait_procs(procs, timeout=30)
        took = time.monotonic() - killed
        for proc in left:
            proc.kill()
    # 30 s is a hang guard, not a speed bound: how fast they end is `benchmarks/speed.py tune --parts orphans`
    assert not left, f"{len(left)} of the trials' {len(procs)} processes outlived their tuner by 30 s"
    print(f"the trials' {len(procs)} processes ended {took:.1f} s after their tuner was killed")
    for log in out.glob("trial_000[01]/*.log"):
        assert "SIGTERM received: writing a checkpoint" in log.read_text()  # stopped by the watcher, as a scheduler stops a run
    the_next_tuner_fails_them_as_stale_and_runs_them_again(tmp_path, out, storage, killed, command)


# ---- the score ----------------------------------------------------------------------------------


def test_run_score_is_the_mean_of_the_last_episodes_up_to_the_step():
    steps, returns = [10, 20, 30, 40], [1.0, 2.0, 3.0, 10.0]
    assert run_score(steps, returns, last=2) == 6.5
    assert run_score(steps, returns, last=2, step=35) == 2.5
    assert run_score(steps, returns, last=10, step=30) == 2.0
    assert run_score(steps, returns, last=2, step=5) is None


def test_trial_score_normalises_each_env_aggregates_the_envs_then_averages_the_seeds():
    targets = {"A": (0.0, 100.0), "B": (-100.0, 0.0), "C": (0.0, 10.0)}
    scores = {("A", 1): 50.0, ("B", 1): -50.0, ("C", 1): 10.0, ("A", 2): 100.0, ("B", 2): -100.0, ("C", 2): 0.0}
    # seed 1: 0.5, 0.5, 1.0; seed 2: 1.0, 0.0, 0.0
    assert trial_score(scores, ["A", "B", "C"], [1, 2], targets, "mean") == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert trial_score(scores, ["A", "B", "C"], [1, 2], targets, "median") == pytest.approx((0.5 + 0.0) / 2)
    assert trial_score({("A", 1): 42.0}, ["A"], [1], {}, "mean") == 42.0  # one env without targets: the raw return
    assert trial_score({**scores, ("C", 2): None}, ["A", "B", "C"], [1, 2], targets, "mean") is None  # a run without episodes yet


def test_episode_follower_reads_only_new_events_and_every_episode(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    follower = EpisodeFollower(tmp_path)
    for i in range(3):
        writer.add_scalar("charts/episodic_return", float(i), 100 + i)
    writer.add_scalar("losses/value_loss", 0.1, 128)
    writer.flush()
    follower.update()
    assert follower.steps == [100, 101, 102] and follower.returns == [0.0, 1.0, 2.0] and follower.reached == 128
    for i in range(10_010):  # more than the 10,000 points EventAccumulator keeps by default
        writer.add_scalar("charts/episodic_return", 5.0, 200 + i)
    writer.flush()
    follower.update()
    assert len(follower.returns) == 10_013 and follower.reached == 128  # episodes never advance the reached step
    assert follower.score(last=10) == 5.0 and follower.score(last=3, step=150) == 1.0
    writer.close()


# ---- bad input: one clear error, before any trial -----------------------------------------------


def fails_clearly(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err and err.startswith("fleetrl: error: ")
    return " ".join(err.split())


@pytest.mark.parametrize(
    "entry, message",
    [
        ("learning-rat: {type: float, low: 1.0e-4, high: 1.0e-3}", "unknown flag --learning-rat for fleetrl train ppo (did you mean learning-rate?)"),
        ("update-epochs: {type: float, low: 2, high: 8}", "bad type: --update-epochs takes a whole number; use type: int"),
        ("anneal-lr: {type: int, low: 0, high: 1}", "bad type: --anneal-lr takes true or false; use type: categorical"),
        ("update-epochs: {type: categorical, choices: [4, fast]}", "bad type: --update-epochs takes a whole number, got the choice 'fast'"),
        ("ent-coef: {type: float, low: 0.05, high: 0.0}", "low (0.05) must be below high (0.0)"),
        ("learning-rate: {type: float, low: 0, high: 1.0e-3, log: true}", "a log distribution needs low > 0, got low 0.0"),
        ("num-minibatches: {type: categorical, choices: []}", "choices must be a non-empty list"),
        ("gamma: {type: float, low: 0.9, high: 1.5}", "high 1.5 is refused by the trainer: --gamma must be in [0, 1]"),
        ("seed: {type: int, low: 1, high: 9}", "--seed is set by the tuner for each run"),
        ("total-timesteps: {type: int, low: 1000, high: 9000}", "set it in the command after `--`"),
        ("vf-coef: {type: float, lo: 0.1, high: 1.0}", "lo is not a key of a float distribution"),
        ("vf-coef: {type: uniform, low: 0.1, high: 1.0}", "type must be one of float, int, categorical, got 'uniform'"),
        ("vf-coef: [0.1, 1.0]", "expected a mapping like"),
        ("vf-coef: {type: float, low: 0.1", "is not valid YAML"),
    ],
)
def test_a_bad_search_space_is_one_clear_error(tmp_path, capsys, entry, message):
    space = write_space(tmp_path, entry + "\n")
    err = fails_clearly(capsys, tune_args(tmp_path, "--out", str(tmp_path / "out"), space=space))
    assert message in err, err
    assert not (tmp_path / "out" / "study.log").exists()  # refused before the study was opened


def test_a_flag_also_given_in_the_command_is_refused(tmp_path, capsys):
    err = fails_clearly(capsys, tune_args(tmp_path, command=[*TINY, "--learning-rate", "0.001"]))
    assert "--learning-rate is also given in the command after `--`" in err


@pytest.mark.parametrize(
    "storage, message",
    [
        ("redis://localhost/0", "unknown storage 'redis'"),
        ("study.txt", "neither a URL nor a file ending in .log (journal) or .db (SQLite)"),
        ("sqlite://study.db", "is not an SQLite file"),
        ("sqlite:///:memory:", "is not an SQLite file"),
        ("postgresql://nobody@127.0.0.1:1/none", "Cannot open the study storage postgresql"),
    ],
)
def test_a_bad_storage_url_is_one_clear_error(tmp_path, capsys, storage, message):
    err = fails_clearly(capsys, tune_args(tmp_path, "--storage", storage, "--out", str(tmp_path / "out")))
    assert message in err, err


BOTH = ("CartPole-v1", "Acrobot-v1")


@pytest.mark.parametrize(
    "flags, env_ids, command, message",
    [
        ([], ["CartPole-v1"], ["python", "train.py"], "must be `fleetrl train ALGO [flags]`"),
        ([], ["CartPole-v1"], [*TINY, "--seed", "3"], "Remove --seed from the command after `--`"),
        ([], ["CartPole-v1"], [*TINY, "--no-such-flag", "1"], "is not a valid `fleetrl train ppo` command"),
        ([], ["NoSuchEnv-v9"], TINY, "NoSuchEnv-v9"),
        ([], BOTH, TINY, "each needs --target-scores ENV=LO,HI (e.g. random and expert returns) so their scores can be combined; missing: CartPole-v1 Acrobot-v1"),
        (["--target-scores", "CartPole-v1=0,500", "Acrobot-v1=0,0"], BOTH, TINY, "two different finite numbers"),
        (["--target-scores", "CartPole-v0=0,500"], BOTH, TINY, "which is not one of --env-ids"),
        (["--parallel", "0"], ["CartPole-v1"], TINY, "--parallel must be at least 1 (training processes at once), got 0"),
        (["--slurm", "--slurm-template"], ["CartPole-v1"], TINY, "Give --slurm (submit the array and follow it) or --slurm-template"),
    ],
)
def test_bad_tuner_flags_and_commands_are_one_clear_error(tmp_path, capsys, flags, env_ids, command, message):
    err = fails_clearly(capsys, tune_args(tmp_path, *flags, command=command, env_ids=tuple(env_ids)))
    assert message in err, err


def test_a_study_joined_with_another_search_space_is_refused(tmp_path, capsys):
    storage = str(tmp_path / "study.log")
    study = optuna.create_study(study_name="test", storage=open_storage(parse_storage(storage), 600), direction="maximize")
    study.set_user_attr("fleetrl", {"command": ["fleetrl", "train", "ppo"]})
    err = fails_clearly(capsys, tune_args(tmp_path, "--storage", storage, "--out", str(tmp_path / "out")))
    assert "was run with other settings" in err and "command" in err


# ---- Slurm --------------------------------------------------------------------------------------


def test_slurm_template_runs_tuner_workers_on_one_shared_study(tmp_path):
    out = tmp_path / "out"
    proc = run_fleetrl_in_process(*tune_args(tmp_path, "--trials", "40", "--parallel", "2", "--sampler-seed", "7", "--out", str(out),
                                             "--slurm-template", "--slurm-workers", "3", "--slurm-cpus-per-task", "8"))
    assert proc.returncode == 0, proc.stderr
    script = out / "tune.slurm"
    text = script.read_text()
    assert "#SBATCH --array=0-2\n" in text and "#SBATCH --cpus-per-task=8\n" in text
    assert f"--storage {out}/study.log" in text and f"--search {tmp_path}/space.yaml" in text  # absolute: tasks start elsewhere
    assert "--trials 40 --parallel 2" in text and "--study-name test" in text
    assert "--sampler-seed $(( 7 + SLURM_ARRAY_TASK_ID ))" in text  # each worker its own seed
    assert "-- fleetrl train ppo --total-timesteps 2048" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert f"sbatch {script}" in proc.stdout

    sqlite = run_fleetrl_in_process(*tune_args(tmp_path, "--storage", f"sqlite:///{tmp_path}/t.db", "--out", str(out), "--slurm-template"))
    assert sqlite.returncode == 2 and "SQLite breaks on a network filesystem" in " ".join(sqlite.stderr.split())


@pytest.mark.parametrize("storage", ["postgresql://postgres@127.0.0.1:5432/db", "postgresql://postgres@localhost/db", "postgresql://u@[::1]/db"])
def test_a_slurm_array_on_a_loopback_database_is_refused_before_anything_is_submitted(tmp_path, capsys, storage):
    for flag in ("--slurm", "--slurm-template"):  # on each node, loopback is the node itself
        err = fails_clearly(capsys, tune_args(tmp_path, flag, "--storage", storage, "--out", str(tmp_path / "out")))
        assert "is loopback, and on each node that is the node itself" in err and "listen_addresses" in err, err
    assert not list((tmp_path / "out").glob("*.slurm"))


def test_storage_forms():
    assert parse_storage("tune.log").kind == "journal" and parse_storage("journal:///abs/t.log").path == Path("/abs/t.log")
    assert parse_storage("sqlite:///tune.db").path == Path("tune.db") and parse_storage("t.sqlite3").url == "sqlite:///t.sqlite3"
    pg = parse_storage("postgres://u:secret@host/db")
    assert pg.kind == "rdb" and pg.url.startswith("postgresql") and "secret" not in pg.shown


def test_a_storage_url_with_a_password_is_warned_about_and_never_echoed(tmp_path):
    # run here (not on Slurm, which refuses it: tests/test_slurm.py), the password shows in this tuner's command line
    proc = run_fleetrl_in_process(*tune_args(tmp_path, "--out", str(tmp_path / "out"), "--storage",
                                             "postgresql://tuner:s3cret@127.0.0.1:1/study"))
    text = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr  # nothing listens on port 1
    assert "carries a password" in text and "PGPASSWORD" in text and "~/.pgpass" in text, text
    assert "postgresql+psycopg://tuner@127.0.0.1:1/study" in text or "postgresql://tuner@127.0.0.1:1/study" in text, text
    assert "s3cret" not in proc.stdout + proc.stderr
