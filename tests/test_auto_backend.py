"""`--env-backend auto` picks from the family, the cores and the extras, and explains itself; bench-env."""

import json

import pytest

from fleetrl.envs import env_family, make_vector_env
from fleetrl.envs.auto import choose_backend

from conftest import run_fleetrl


def test_cheap_envs_stay_in_process():
    choice = choose_backend("CartPole-v1", env_family("CartPole-v1"), num_envs=8, cores=2)
    assert choice.backend == "sync" and "us" in choice.reason


def test_expensive_python_envs_go_to_worker_processes_when_there_are_cores():
    family = env_family("fleetrl_test_envs:Busy-v0")
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=2).backend == "async"
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=1).backend == "sync"


def test_atari_goes_to_a_native_vector_unless_frames_are_needed():
    pytest.importorskip("ale_py")
    family = env_family("BreakoutNoFrameskip-v4")
    assert choose_backend("BreakoutNoFrameskip-v4", family, num_envs=8, cores=2).backend in ("ale", "envpool")
    assert choose_backend("BreakoutNoFrameskip-v4", family, num_envs=8, cores=2, need_frames=True).backend in ("sync", "async")


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
