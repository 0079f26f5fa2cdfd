"""`fleetrl benchmark`: real runs on a worker pool, failures reported not dropped, reruns skip finished runs,
and the Slurm array script runs the same grid."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fleetrl.errors import FleetError
from fleetrl.tools.benchmark import Run, check_command, run_command
from fleetrl.tools.runs import split_command

from conftest import killed_on_exit, run_fleetrl_in_process, start_fleetrl

TINY_TRAIN = ["fleetrl", "train", "ppo", "--total-timesteps", "1024"]
# a command that only prints the arguments the runner appended, so the grid costs no training
ECHO = [sys.executable, "-c", "import sys; print('ARGS', ' '.join(sys.argv[1:]))"]


def returns_logged(folder, seeds: range) -> list[str]:
    """A command that puts into its --run-dir the event file of ten episodic returns of 100 x its --seed, so that the
    summary has known numbers without training. The files are written here, once per seed (tensorboard's own event
    writer): each run only copies its own, without importing tensorboard (about 0.5 s a process)."""
    import time

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for seed in seeds:
        writer = EventFileWriter(str(folder / f"seed{seed}"))
        for step in range(1, 11):
            value = Summary.Value(tag="charts/episodic_return", simple_value=100.0 * seed)
            writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
        writer.close()
    return [sys.executable, "-c", f"""import shutil, sys
args = sys.argv[1:]
shutil.copytree({str(folder)!r} + "/seed" + args[args.index("--seed") + 1], args[args.index("--run-dir") + 1], dirs_exist_ok=True)
"""]


# a run that starts a worker process of its own, as a trainer starts env workers, writes both pids to its --run-dir and
# waits; on SIGTERM it ends its worker and exits, as a trainer does. With --leave-worker, SIGTERM ends the run alone, so
# only a signal to its process group ends the worker. With --ignore-term it ignores SIGTERM, so only a SIGKILL of its
# process group ends it, and the parent watcher kills it 1 s after its tool is gone instead of 30.
WITH_WORKER = [sys.executable, "-c", """import os, signal, subprocess, sys, time
from pathlib import Path
from fleetrl import parent_watch
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent_watch.KILL_AFTER_S = 1.0
parent_watch.watch_parent()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if "--ignore-term" not in sys.argv and "--leave-worker" not in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: (worker.terminate(), sys.exit(143)))
run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
run_dir.mkdir(parents=True)
(run_dir / "pids.tmp").write_text(f"{os.getpid()} {worker.pid}")
os.replace(run_dir / "pids.tmp", run_dir / "pids")
time.sleep(600)
"""]


def started_processes(run_dir, timeout: float = 60) -> list:
    """The run's process and its worker, once the run has written their pids."""
    import psutil

    deadline = time.monotonic() + timeout
    while not (run_dir / "pids").exists():
        assert time.monotonic() < deadline, f"no run wrote {run_dir / 'pids'} within {timeout} s"
        time.sleep(0.1)
    return [psutil.Process(int(pid)) for pid in (run_dir / "pids").read_text().split()]


def seconds_until_gone(procs: list, timeout: float) -> float:
    """How long the processes took to end; an AssertionError (after killing them) if some outlive ``timeout``."""
    import psutil

    start = time.monotonic()
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        proc.kill()
    assert not alive, f"still running {timeout} s later: {[p.pid for p in alive]}"
    return time.monotonic() - start


def summary_rows(out):
    with open(out / "summary.csv") as f:
        return {row["env_id"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_failed_run_is_reported_with_exit_code_and_log_tail_and_the_others_finish_then_a_rerun_skips_them(tmp_path):
    out = tmp_path / "bench"
    args = ["benchmark", "--env-ids", "CartPole-v1", "NoSuchEnv-v9", "--num-seeds", "1", "--workers", "2", "--out", str(out), "--", *TINY_TRAIN]
    proc = run_fleetrl_in_process(*args)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Traceback" not in proc.stderr
    assert "FAILED NoSuchEnv-v9 seed 1: exit code 2" in output
    assert "Unknown --env-id 'NoSuchEnv-v9'" in output  # the tail of the failed run's log is shown
    assert "1 of 2 runs failed" in proc.stderr

    rows = summary_rows(out)
    assert float(rows["CartPole-v1"]["final_return_mean"]) > 0 and rows["CartPole-v1"]["seeds_ok"] == "1"
    assert rows["NoSuchEnv-v9"]["final_return_mean"] == "" and rows["NoSuchEnv-v9"]["seeds_failed"] == "1"
    assert "## Failed runs" in (out / "summary.md").read_text()
    log = out / "logs" / "CartPole-v1__1.log"
    first_line = log.read_text().splitlines()[0]
    # the exact command, with what the runner appended: one thread per worker on this pool
    for part in ("-m fleetrl train ppo", "--env-id CartPole-v1", "--seed 1", f"--run-dir {out / 'CartPole-v1__1'}", "--torch-threads"):
        assert part in first_line, first_line
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(out / "CartPole-v1__1"))

    log_stat = log.stat()
    rerun = run_fleetrl_in_process(*args)
    assert rerun.returncode != 0  # the bad env fails again
    assert "skipped CartPole-v1 seed 1" in rerun.stdout
    assert log.stat().st_mtime_ns == log_stat.st_mtime_ns and log.stat().st_size == log_stat.st_size
    assert summary_rows(out)["CartPole-v1"]["final_return_mean"] == rows["CartPole-v1"]["final_return_mean"]


def test_slurm_template_maps_array_tasks_to_env_ids_and_seeds_and_its_runs_count_as_finished(tmp_path):
    out = tmp_path / "bench"
    flags = ["--env-ids", "CartPole-v1", "ALE/Pong-v5", "--num-seeds", "3", "--start-seed", "4", "--out", str(out)]
    proc = run_fleetrl_in_process("benchmark", *flags, "--slurm-template", "--", *ECHO)
    assert proc.returncode == 0, proc.stderr
    script = out / "benchmark.slurm"
    assert str(script) in proc.stdout
    text = script.read_text()
    assert "#SBATCH --array=0-5\n" in text
    assert "ENV_IDS=(CartPole-v1 CartPole-v1 CartPole-v1 ALE/Pong-v5 ALE/Pong-v5 ALE/Pong-v5)" in text
    assert "SEEDS=(4 5 6 4 5 6)" in text
    assert "ALE-Pong-v5__5" in text  # the path-safe folder name
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0

    # run array task 4 by hand, as Slurm would: ALE/Pong-v5 with seed 5
    task = subprocess.run(["bash", str(script)], env={**os.environ, "SLURM_ARRAY_TASK_ID": "4"}, capture_output=True, text=True, timeout=60)
    assert task.returncode == 0, task.stdout + task.stderr
    log = (out / "logs" / "ALE-Pong-v5__5.log").read_text()
    assert f"ARGS --env-id ALE/Pong-v5 --seed 5 --run-dir {out}/ALE-Pong-v5__5" in log
    status = json.loads((out / "status" / "ALE-Pong-v5__5.json").read_text())
    assert status["ok"] is True and status["seed"] == 5 and status["command"] == ECHO

    # the local runner reads the status the array task wrote, and runs only the other five
    local = run_fleetrl_in_process("benchmark", *flags, "--workers", "2", "--", *ECHO)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "skipped ALE/Pong-v5 seed 5" in local.stdout and "5 to run" in local.stdout
    assert (out / "logs" / "CartPole-v1__6.log").read_text().count("ARGS --env-id CartPole-v1 --seed 6") == 1
    rows = summary_rows(out)
    assert rows["ALE/Pong-v5"]["seeds_ok"] == "3" and rows["CartPole-v1"]["seeds_ok"] == "3"


def test_a_command_that_cannot_start_is_a_failed_run_not_a_crash(tmp_path):
    out = tmp_path / "bench"
    proc = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "2", "--out", str(out), "--", "no-such-program-xyz")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.count("exit code 127") >= 2
    assert "could not start the command" in proc.stdout
    assert summary_rows(out)["CartPole-v1"]["seeds_failed"] == "2"


def test_bad_benchmark_input_is_a_clear_error(tmp_path):
    no_command = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1")
    assert no_command.returncode == 2 and "needs the command to run after `--`" in no_command.stderr
    seeded = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--out", str(tmp_path / "b"), "--", "fleetrl", "train", "ppo", "--seed", "3")
    assert seeded.returncode == 2 and "Remove --seed" in seeded.stderr
    zero = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--workers", "0", "--", *ECHO)
    assert zero.returncode == 2 and "--workers must be at least 1" in zero.stderr
    both = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--slurm", "--slurm-template", "--", *ECHO)
    assert both.returncode == 2 and "Give --slurm (submit the array and follow it) or --slurm-template" in both.stderr
    for stderr in (no_command.stderr, seeded.stderr, zero.stderr, both.stderr):
        assert "Traceback" not in stderr


def test_a_different_command_in_the_same_out_folder_is_refused(tmp_path):
    out = tmp_path / "bench"
    first = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "1", "--out", str(out), "--", *ECHO)
    assert first.returncode == 0, first.stderr
    other = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "1", "--out", str(out), "--", *ECHO, "extra")
    assert other.returncode == 2 and "of another command" in other.stderr and "Use a new --out" in other.stderr


def test_fleetrl_runs_with_this_interpreter_and_gets_threads_resume_and_the_run_flags(tmp_path):
    run = Run("ALE/Breakout-v5", 7)
    assert run.name == "ALE-Breakout-v5__7" and Run("mypkg.envs:My-v0", 1).name == "mypkg.envs-My-v0__1"
    command = run_command(["fleetrl", "train", "ppo", "--total-timesteps", "10"], run, tmp_path, threads=3)
    assert command[:3] == [sys.executable, "-m", "fleetrl"]
    assert command[3:] == ["train", "ppo", "--total-timesteps", "10", "--torch-threads", "3", "--resume", "auto",
                           "--env-id", "ALE/Breakout-v5", "--seed", "7", "--run-dir", str(tmp_path / "ALE-Breakout-v5__7")]  # fmt: skip
    given = run_command(["fleetrl", "train", "ppo", "--torch-threads=2"], run, tmp_path, threads=3)
    assert given.count("--torch-threads") == 0 and "--torch-threads=2" in given
    other = run_command(["python", "my_ppo.py"], run, tmp_path, threads=3)
    assert other[:2] == ["python", "my_ppo.py"] and "--torch-threads" not in other
    assert split_command(["--env-ids", "A", "--", "fleetrl", "train", "--", "x"]) == (["--env-ids", "A"], ["fleetrl", "train", "--", "x"])
    with pytest.raises(FleetError):
        check_command(["fleetrl", "train", "ppo", "--run-dir=x"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_slurm_task_warned_before_its_time_limit_checkpoints_requeues_and_the_requeued_task_resumes(tmp_path):
    import signal
    import time

    from fleetrl import checkpoint
    from fleetrl.monitor.tbread import read_scalars
    from fleetrl.tools.runs import run_name

    from conftest import fleetrl_env
    from fleetrl_test_envs import NO_DELAY_FILE_ENV

    # CartPole whose steps also sleep 1 ms, stepped one env after another: an iteration of 4 x 128 steps lasts at least
    # 0.5 s however fast the host is, so a signal sent once the first iteration is logged lands mid-run: the 7 left
    # give it over 3 s. The requeued start, which no signal has to catch, steps without the sleep (NO_DELAY_FILE_ENV)
    out, iterations, env_id = tmp_path / "bench", 8, "fleetrl_test_envs:SlowCartPole-v1"
    train = ["fleetrl", "train", "ppo", "--total-timesteps", str(iterations * 512), "--env-backend", "sync",
             "--checkpoint-every", "1000", "--no-cuda"]
    made = run_fleetrl_in_process("benchmark", "--env-ids", env_id, "--num-seeds", "1", "--out", str(out), "--slurm-template", "--", *train)
    assert made.returncode == 0, made.stderr
    script = out / "benchmark.slurm"
    assert "#SBATCH --requeue" in script.read_text() and "#SBATCH --signal=B:USR1@" in script.read_text()
    bin_dir = tmp_path / "bin"  # Slurm's scontrol, standing in: it records what it was asked
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.calls\n")
    (bin_dir / "scontrol").chmod(0o755)
    no_delay = tmp_path / "no-delay"
    env = {**fleetrl_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77",
           NO_DELAY_FILE_ENV: str(no_delay)}
    name = run_name(env_id, 1)
    run_dir = out / name

    def first_iteration_logged() -> bool:
        return any(run_dir.glob("events.out.tfevents.*")) and bool(read_scalars(run_dir, "charts/learning_rate"))

    task = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with killed_on_exit(task):
        deadline = time.time() + 120
        while not first_iteration_logged():  # a state the run reports, not a time
            assert task.poll() is None, task.communicate(timeout=30)[0]
            assert time.time() < deadline, "the run logged no iteration within 120 s"
            time.sleep(0.05)
        task.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@120` sends the batch shell
        task.communicate(timeout=60)
    assert task.returncode == 0
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "77_0"]
    log = (out / "logs" / f"{name}.log").read_text()
    assert "stopped by SIGTERM" in log and "requeueing" in log, log[-2000:]
    stopped_at = checkpoint.load_checkpoint(run_dir)["global_step"]
    assert 0 < stopped_at < iterations * 512, "checkpointed off the cadence, where the warning found it"
    assert not (out / "status" / f"{name}.json").exists(), "a requeued task is not finished"

    no_delay.touch()
    requeued = subprocess.run(["bash", str(script)], env={**env, "SLURM_RESTART_COUNT": "1"}, capture_output=True, text=True, timeout=300)
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    log = (out / "logs" / f"{name}.log").read_text()
    assert "stopped by SIGTERM" in log and "requeued: start 2 of this task" in log, "the requeued start appends to the log"
    assert json.loads((out / "status" / f"{name}.json").read_text())["ok"] is True
    assert checkpoint.load_checkpoint(run_dir)["global_step"] == iterations * 512
    steps = [p.step for p in read_scalars(run_dir, "charts/learning_rate")]
    assert steps == [512 * i for i in range(1, iterations + 1)], "resumed, not restarted: every iteration logged once"


def test_summary_gives_each_env_and_all_envs_iqm_median_mean_and_optimality_gap_with_intervals(tmp_path):
    out = tmp_path / "bench"
    flags = ["--env-ids", "CartPole-v1", "Acrobot-v1", "--num-seeds", "4", "--workers", "2", "--bootstrap-reps", "100", "--out", str(out)]
    command = returns_logged(tmp_path / "returns", range(1, 5))
    proc = run_fleetrl_in_process("benchmark", *flags, "--score-bounds", "CartPole-v1=0,500", "Acrobot-v1=0,1000", "--", *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # returns 100, 200, 300, 400: the IQM cuts one run at each end, (200 + 300) / 2 = 250, which is 0.5 of 0..500
    assert "| CartPole-v1 | min-max (0, 500) | 4 | 0.500 [" in proc.stdout
    assert "| Acrobot-v1 | min-max (0, 1000) | 4 | 0.250 [" in proc.stdout
    assert "| all envs | normalised | 4 (x 2 envs) |" in proc.stdout and "95% stratified bootstrap" in proc.stdout
    with open(out / "intervals.csv") as f:
        rows = {row["env_id"]: row for row in csv.DictReader(f)}
    assert float(rows["CartPole-v1"]["iqm"]) == pytest.approx(0.5) and float(rows["CartPole-v1"]["optimality_gap"]) == pytest.approx(0.5)
    assert float(rows["all envs"]["mean"]) == pytest.approx((0.5 + 0.25) / 2)
    assert "## Confidence intervals" in (out / "summary.md").read_text()


def test_bad_normalisation_is_refused_before_any_run_starts(tmp_path):
    out = tmp_path / "bench"
    proc = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--normalize", "human", "--out", str(out), "--", *ECHO)
    assert proc.returncode == 2 and "only the 57 Atari games have" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "logs").exists()


# a real benchmark's interval summary (real runs' returns, two seeds, the IQM table) is test_algorithm_tools.py's, for
# each of its algorithms, and test_multiagent.py's; the intervals' numbers and intervals.csv are the test above's


def test_a_stopped_benchmark_ends_each_runs_whole_process_group_not_only_its_leader(tmp_path):
    out = tmp_path / "bench"
    runner = start_fleetrl("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "2", "--workers", "2", "--out", str(out), "--",
                           *WITH_WORKER, "--leave-worker")
    with killed_on_exit(runner):
        procs = [p for seed in (1, 2) for p in started_processes(out / f"CartPole-v1__{seed}")]
        runner.send_signal(signal.SIGTERM)  # as Ctrl-C: the runner stops its runs, then exits
        output = runner.communicate(timeout=60)[0]
        assert runner.returncode != 0 and "Traceback" not in output, output
        seconds_until_gone(procs, timeout=5)  # the workers too: SIGTERM went to each run's group


@pytest.mark.parametrize("run_ignores_sigterm", [False, True])
def test_a_benchmark_killed_by_sigkill_leaves_no_run_behind(tmp_path, run_ignores_sigterm):
    out = tmp_path / "bench"
    command = [*WITH_WORKER, *(["--ignore-term"] if run_ignores_sigterm else [])]
    runner = start_fleetrl("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "1", "--out", str(out), "--", *command)
    with killed_on_exit(runner):
        procs = started_processes(out / "CartPole-v1__1")
        runner.kill()  # no chance to stop anything: the run notices on its own (fleetrl/parent_watch.py)
        runner.communicate(timeout=30)
        # a run that obeys SIGTERM ends within the watcher's 0.5 s poll; one that ignores it is killed, group and all, 1 s later
        seconds_until_gone(procs, timeout=10)
