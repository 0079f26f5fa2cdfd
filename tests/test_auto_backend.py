"""`--env-backend auto` picks from the family, the cores and the extras, and explains itself; bench-env."""

import json
import time

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.envs import auto, env_family, make_vector_env
from fleetrl.envs.auto import ProbeResult, choose_backend, probe_backends

from conftest import run_fleetrl


def test_cheap_envs_stay_in_process():
    choice = choose_backend("CartPole-v1", env_family("CartPole-v1"), num_envs=8, cores=2)
    assert choice.backend == "sync" and "us" in choice.reason


def test_expensive_python_envs_go_to_worker_processes_when_there_are_cores():
    family = env_family("fleetrl_test_envs:Busy-v0")
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=2).backend == "async"
    assert choose_backend("fleetrl_test_envs:Busy-v0", family, num_envs=8, cores=1).backend == "sync"


BREAKOUT = "BreakoutNoFrameskip-v4"


def _installed_atari_backends() -> list[str]:
    from fleetrl.envs.native import native_backend_support

    support = native_backend_support(BREAKOUT, "atari")
    return [b for b in auto.ATARI_CANDIDATES if support[b]]


def _support(monkeypatch, **installed: bool) -> None:
    import fleetrl.envs.native as native

    monkeypatch.setattr(native, "native_backend_support", lambda env_id, family: {"ale": False, "envpool": False, **installed})


def _no_probe(*args, **kwargs):
    raise AssertionError("the backends were probed, but there was nothing to compare")


def test_atari_auto_measures_the_installed_backends_and_names_the_numbers():
    pytest.importorskip("ale_py")
    installed = _installed_atari_backends()
    if len(installed) < 2:
        pytest.skip("needs both ale-py and envpool")
    choice = choose_backend(BREAKOUT, env_family(BREAKOUT), num_envs=8, cores=2)
    assert choice.backend in installed and choice.probe is not None
    assert set(choice.probe.rates) == set(installed)
    for backend, rate in choice.probe.rates.items():
        assert rate > 0 and f"{backend} {rate:,.0f} steps/s" in choice.reason
    assert "measured" in choice.reason


def test_the_atari_probe_keeps_within_its_budget_construction_included():
    pytest.importorskip("ale_py")
    installed = _installed_atari_backends()
    start = time.perf_counter()
    probe = probe_backends(BREAKOUT, env_family(BREAKOUT), installed)
    elapsed = time.perf_counter() - start
    # a build that has started cannot be stopped, so allow one overrun on a loaded host
    assert probe.seconds <= elapsed < auto.PROBE_BUDGET_S + 2.0
    assert set(probe.rates) | set(probe.skipped) == set(installed) and probe.rates


def test_in_overlapped_mode_ale_and_envpool_are_timed_by_halves():
    pytest.importorskip("ale_py")
    installed = _installed_atari_backends()
    probe = probe_backends(BREAKOUT, env_family(BREAKOUT), installed, split=True)
    assert probe.num_envs == 2 and probe.rates
    assert set(probe.modes.values()) == {"split"} and "two halves by send/recv" in probe.describe()


@pytest.mark.parametrize("installed,missing", [("ale", "envpool"), ("envpool", "ale")])
def test_with_one_atari_backend_missing_auto_takes_the_other_without_probing(monkeypatch, installed, missing):
    _support(monkeypatch, **{installed: True})
    monkeypatch.setattr(auto, "probe_backends", _no_probe)
    choice = choose_backend(BREAKOUT, env_family(BREAKOUT), num_envs=8, cores=2)
    assert choice.backend == installed and missing in choice.reason and choice.probe is None


def test_capture_video_keeps_atari_on_python_envs_without_probing(monkeypatch):
    pytest.importorskip("ale_py")
    monkeypatch.setattr(auto, "probe_backends", _no_probe)
    family = env_family(BREAKOUT)
    assert choose_backend(BREAKOUT, family, num_envs=8, cores=2, need_frames=True).backend in ("sync", "async")


def test_atari_falls_back_to_python_envs_when_no_native_backend_builds(monkeypatch):
    pytest.importorskip("ale_py")
    _support(monkeypatch, ale=True, envpool=True)
    failed = ProbeResult(skipped={"ale": "RuntimeError: no ROM", "envpool": "RuntimeError: no pool"}, num_envs=1)
    monkeypatch.setattr(auto, "probe_backends", lambda *a, **k: failed)
    choice = choose_backend(BREAKOUT, env_family(BREAKOUT), num_envs=8, cores=2)
    assert choice.backend in ("sync", "async") and "no ROM" in choice.reason and "no pool" in choice.reason


class _FakeVector:
    """A vector env whose step costs ``step_s`` per call, with send/recv (FIFO per send) when ``split``."""

    def __init__(self, num_envs: int, step_s: float = 0.0, fail_on_reset: bool = False):
        self.num_envs, self.step_s, self.fail_on_reset = num_envs, step_s, fail_on_reset
        self.single_action_space = gym.spaces.Discrete(2)
        self.closed, self.steps, self.sent = False, 0, []

    def reset(self, seed=None):
        if self.fail_on_reset:
            raise RuntimeError("this backend cannot start here")
        return np.zeros((self.num_envs, 1)), {}

    def step(self, actions):
        time.sleep(self.step_s)
        self.steps += len(actions)
        n = len(actions)
        return np.zeros((n, 1)), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}

    def close(self):
        self.closed = True


class _FakeSplitVector(_FakeVector):
    def split(self, count):
        return np.array_split(np.arange(self.num_envs), count)

    def send(self, actions, env_ids=None):
        self.sent.append(np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids))

    def recv(self, env_ids=None):
        ids = self.sent.pop(0)
        assert env_ids is None or np.array_equal(ids, env_ids), "the probe receives the halves in the order it sent them"
        return (*self.step(np.zeros(len(ids))), ids)


def test_split_probe_alternates_halves_on_backends_with_send_recv_and_steps_the_others():
    built = {}

    def build(backend, n):
        built[backend] = (_FakeSplitVector if backend == "halves" else _FakeVector)(n, step_s=1e-4)
        return built[backend]

    probe = probe_backends("Fake-v0", env_family("CartPole-v1"), ["halves", "plain"], split=True, budget_s=0.5, build=build)
    assert probe.modes == {"halves": "split", "plain": "step"} and probe.num_envs == 2
    assert all(rate > 0 for rate in probe.rates.values())
    assert all(env.closed for env in built.values())
    assert "halves" in probe.describe() and "send/recv" in probe.describe()


def test_split_probe_on_the_shared_memory_backend_uses_send_recv():
    # gym-sync steps its envs as one group; gym-sync first: it builds at once, so the worker processes'
    # start-up cannot crowd it out of the budget
    probe = probe_backends("CartPole-v1", env_family("CartPole-v1"), ["gym-sync", "async"], split=True, budget_s=3.0)
    assert probe.modes == {"gym-sync": "step", "async": "split"} and not probe.skipped


def test_a_backend_that_fails_to_build_is_skipped_with_the_reason():
    probe = probe_backends("Fake-v0", env_family("CartPole-v1"), ["broken", "fine"], budget_s=0.5,
                           build=lambda backend, n: _FakeVector(n, fail_on_reset=backend == "broken"))
    assert probe.fastest() == "fine" and "cannot start here" in probe.skipped["broken"]
    assert "broken skipped" in probe.describe()


def test_the_budget_leaves_out_a_candidate_it_has_no_time_to_build():
    def slow_build(backend, n):
        time.sleep(0.6)
        return _FakeVector(n)

    start = time.perf_counter()
    probe = probe_backends("Fake-v0", env_family("CartPole-v1"), ["first", "second"], budget_s=1.0, build=slow_build)
    assert time.perf_counter() - start < 1.5
    assert set(probe.rates) == {"first"} and "budget" in probe.skipped["second"]


def test_rates_within_the_tie_margin_keep_the_preferred_backend():
    close = ProbeResult(rates={"ale": 1000.0, "envpool": 1000.0 * (1 + auto.PROBE_TIE / 2)})
    apart = ProbeResult(rates={"ale": 1000.0, "envpool": 1300.0})
    assert close.fastest(preference=["ale", "envpool"]) == "ale"
    assert apart.fastest(preference=["ale", "envpool"]) == "envpool"


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
