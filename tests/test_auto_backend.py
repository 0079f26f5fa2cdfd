"""`--env-backend auto` picks from the family, the cores and the extras, and explains itself; bench-env."""

import json

import pytest

from fleetrl.envs import auto, env_family, make_vector_env
from fleetrl.envs.auto import choose_backend

from conftest import require_module, run_fleetrl, run_fleetrl_in_process


def test_cheap_envs_stay_in_process():
    choice = choose_backend("CartPole-v1", env_family("CartPole-v1"), num_envs=8, cores=2)
    assert choice.backend == "sync" and "us" in choice.reason


def test_expensive_python_envs_go_to_worker_processes_when_there_are_cores():
    family = env_family("fleetrl_test_envs:Busy-v0")
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=2).backend == "async"
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=1).backend == "sync"


@pytest.mark.parametrize("step_us", [5.0, 5000.0], ids=["fast-step", "slow-step"])
def test_env_threads_with_auto_runs_on_the_async_backend_whatever_the_step_measures(monkeypatch, step_us):
    """--env-threads asks for the async backend's stepping threads: a fast step (quiet machine) and a slow one (the same
    env under load) must give the same decision, not a run on one and a refusal on the other."""
    from fleetrl.envs.probe import StepCost

    monkeypatch.setattr(auto, "measure_step", lambda *a, **k: StepCost(wall_us=step_us, cpu_us=step_us, steps=100))
    envs = make_vector_env("CartPole-v1", 4, "auto", cores=2, env_threads=2)
    try:
        assert envs.backend == "async" and "--env-threads 2" in envs.backend_reason
        assert envs.stepping.threads == 2
    finally:
        envs.close()


BREAKOUT = "BreakoutNoFrameskip-v4"


def _installed_atari_backends() -> list[str]:
    from fleetrl.envs.native import native_backend_support

    support = native_backend_support(BREAKOUT, "atari")
    return [b for b in auto.ATARI_CANDIDATES if support[b]]


def _support(monkeypatch, **installed: bool) -> None:
    import fleetrl.envs.native as native

    monkeypatch.setattr(native, "native_backend_support", lambda env_id, family: {"ale": False, "envpool": False, **installed})


@pytest.mark.parametrize("installed,missing", [("ale", "envpool"), ("envpool", "ale")])
def test_with_one_atari_backend_missing_auto_takes_the_other(monkeypatch, installed, missing):
    _support(monkeypatch, **{installed: True})
    choice = choose_backend(BREAKOUT, env_family(BREAKOUT), num_envs=8, cores=2)
    assert choice.backend == installed and missing in choice.reason


def test_with_both_atari_backends_auto_takes_ale_without_timing_them(monkeypatch):
    # ale and envpool differ in the data they give, so a timing at start would make one command train on different data
    _support(monkeypatch, ale=True, envpool=True)
    monkeypatch.setattr(auto, "measure_step", lambda *a, **k: pytest.fail("nothing is timed for Atari"))
    choice = choose_backend(BREAKOUT, env_family(BREAKOUT), num_envs=8, cores=2)
    assert choice.backend == "ale" and "whatever the load" in choice.reason


def test_capture_video_keeps_atari_on_python_envs(monkeypatch):
    require_module("ale_py", "atari")
    family = env_family(BREAKOUT)
    assert choose_backend(BREAKOUT, family, num_envs=8, cores=2, need_frames=True).backend in ("sync", "async")


def test_the_choice_is_printed_and_attached_to_the_envs(capsys):
    envs = make_vector_env("CartPole-v1", 2, "auto", verbose=True)
    try:
        assert envs.backend == "sync" and envs.backend_reason.startswith("auto:")
    finally:
        envs.close()
    assert "env backend: sync (auto:" in capsys.readouterr().out


def test_bench_env_reports_each_backend_and_the_auto_pick():
    proc = run_fleetrl("bench-env", "--env-id", "CartPole-v1", "--backends", "sync,async", "--num-envs", "4",
                       "--seconds", "0.3", "--repeats", "1", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {r["backend"] for r in report["results"]} == {"sync", "async"}
    assert all(r["steps_per_s"] > 0 and r["cpu_percent"] >= 0 for r in report["results"])
    assert report["fastest"]["backend"] in ("sync", "async") and report["auto"]["4"]["backend"] == "sync"


def test_bench_env_with_async_batch_measures_first_ready_backends_and_skips_one_that_steps_all_envs_together():
    proc = run_fleetrl_in_process("bench-env", "--env-id", "CartPole-v1", "--backends", "sync,async", "--num-envs", "4",
                                  "--async-batch", "2", "--seconds", "0.2", "--repeats", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["backend"] for r in report["results"]] == ["async"] and report["results"][0]["steps_per_s"] > 0
    assert "needs a backend that returns the first envs ready" in report["skipped"]["sync"], report["skipped"]


def test_bench_env_plans_the_async_workers_with_the_batch_size_as_training_does(monkeypatch):
    """On 2 cores, 8 envs in batches of 2: one worker per core would step 4 envs each, which no batch of 2 is made of,
    so training plans 4 workers; bench-env plans them the same way instead of skipping the backend. The cores and the
    measured step are fixed here, so the plan does not depend on this host."""
    import fleetrl.tools.bench_env as bench_env
    from fleetrl.envs import stepping
    from fleetrl.envs.probe import StepCost

    computes = StepCost(wall_us=5.0, cpu_us=5.0, steps=100)  # one step that computes: one worker per core, no threads
    monkeypatch.setattr(stepping, "measure_step", lambda *a, **k: computes)
    monkeypatch.setattr(auto, "measure_step", lambda *a, **k: computes)
    monkeypatch.setattr(bench_env, "available_cores", lambda: 2)
    proc = run_fleetrl_in_process("bench-env", "--env-id", "CartPole-v1", "--backends", "async", "--num-envs", "8",
                                  "--async-batch", "2", "--seconds", "0.2", "--repeats", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["skipped"] == {} and [r["backend"] for r in report["results"]] == ["async"], report
    envs = make_vector_env("CartPole-v1", 8, "async", async_batch=2, cores=2)  # what training builds for the same flags
    try:
        assert envs.stepping.workers == 4
        assert report["results"][0]["stepping"] == envs.stepping.describe()
    finally:
        envs.close()


def test_bench_envs_cpu_counts_each_process_of_the_tree_and_one_that_ended_meanwhile_drops_out():
    import subprocess
    import sys
    import time

    import psutil

    from fleetrl.tools.bench_env import _cpu_used_since, _tree_cpu_seconds

    me = psutil.Process()
    # a child that burns 0.3 s of CPU, then idles: an earlier measurement's worker, still shutting down
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"])
    try:
        deadline = time.time() + 30
        while sum(_tree_cpu_seconds(me).values()) - sum(me.cpu_times()[:2]) < 0.3:
            assert time.time() < deadline and child.poll() is None
            time.sleep(0.05)
        before = _tree_cpu_seconds(me)
    finally:
        child.kill()
        child.wait()
    burn = time.process_time()
    while time.process_time() - burn < 0.05:  # this process's own CPU, several clock ticks of it (psutil counts ticks)
        pass
    used = _cpu_used_since(before, _tree_cpu_seconds(me))
    assert 0 < used < 0.3, "the ended child's CPU must not come off the total (bench-env printed CPU -61%)"


def _hogs(count: int) -> list:
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


@pytest.mark.serial  # real time and real load: run alone (Makefile)
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.cpu_choice
def test_one_command_and_seed_train_alike_on_a_quiet_and_on_a_loaded_machine(tmp_path):
    """The backend (Atari), the thread plan and the precision are chosen the same whatever the load, so the run is the
    same: its losses and returns match exactly."""
    require_module("ale_py", "atari")
    import os

    from fleetrl.monitor.tbread import read_scalars, scalar_tags

    # two iterations of one epoch: the second iteration's losses come from the network the first update made, so a
    # different precision or thread count under load would show there; more updates would only cost the loaded run time
    command = ["train", "ppo", "--env-id", BREAKOUT, "--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2",
               "--update-epochs", "1", "--total-timesteps", str(2 * 4 * 16), "--no-cuda", "--no-progress"]
    quiet = run_fleetrl(*command, "--run-dir", str(tmp_path / "quiet"), timeout=300, threads=None)
    hogs = _hogs(os.cpu_count() or 2)
    try:
        loaded = run_fleetrl(*command, "--run-dir", str(tmp_path / "loaded"), timeout=400, threads=None)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert quiet.returncode == 0 and loaded.returncode == 0, (quiet.stderr + loaded.stderr)[-3000:]
    lines = [next(line for line in p.stdout.splitlines() if line.startswith(what)) for p in (quiet, loaded)
             for what in ("env backend:", "threads on", "precision:")]
    assert [line.split(" (")[0] for line in lines[:3]] == [line.split(" (")[0] for line in lines[3:]], lines
    tags = sorted(t for t in scalar_tags(tmp_path / "quiet") if t.startswith(("losses/", "charts/episodic")))
    assert any(t.startswith("losses/") for t in tags)
    for tag in tags:
        assert read_scalars(tmp_path / "quiet", tag) and [p[:2] for p in read_scalars(tmp_path / "quiet", tag)] == \
            [p[:2] for p in read_scalars(tmp_path / "loaded", tag)], tag
