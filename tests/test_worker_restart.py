"""SharedMemoryVectorEnv restarts env workers that raise, die or hang, and training goes on.

Real worker processes and real envs (FlakyEnv in fleetrl_test_envs.py): each test plants one kind of
failure and checks what the step that met it returns, that later steps are normal, and what is left.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest

from envs_for_tests import MakeEnv
from fleetrl.envs.shm import SharedMemoryVectorEnv
from fleetrl.envs.vector import episode_stats
from fleetrl.errors import EnvWorkerError, FleetError

FLAKY = "fleetrl_test_envs:Flaky-v0"
T, NOISE, PID = 0, 1, 2  # FlakyEnv's observation: [step in episode, RNG draw at reset, pid]

# A restart must never turn into a hang: fail the test instead of waiting forever.
pytestmark = pytest.mark.timeout(60)


def flaky(n: int, kwargs_of: dict[int, dict] | None = None) -> list[MakeEnv]:
    """``n`` FlakyEnvs; ``kwargs_of[i]`` plants a failure in env ``i``."""
    return [MakeEnv(FLAKY, (kwargs_of or {}).get(i, {})) for i in range(n)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def step(envs: SharedMemoryVectorEnv, pids_seen: set[int] | None = None):
    out = envs.step(np.zeros(envs.num_envs, np.int64))
    if pids_seen is not None:
        pids_seen.update(envs.worker_pids)
    return out


def assert_cut(obs, reward, terminated, truncated, info, cut: list[int], last_obs: np.ndarray, new_pid: int,
               finished: tuple[int, ...] = ()):
    """The envs in ``cut`` (a restarted worker's) had their episodes ended at this step, the others stepped
    normally. ``finished``: envs of ``cut`` that had finished the step before their worker failed."""
    n = len(reward)
    others = [i for i in range(n) if i not in cut]
    aborted = [i for i in cut if i not in finished]
    assert truncated[cut].all() and not terminated.any() and not truncated[others].any()
    assert (reward[aborted] == 0).all() and (reward[others] == 1).all() and (reward[list(finished)] == 1).all()
    assert info["_final_obs"].tolist() == [i in cut for i in range(n)]
    # each episode ends on the last observation its env returned: from before the failed step, or from it
    np.testing.assert_array_equal(info["final_obs"][aborted], last_obs[aborted])
    np.testing.assert_array_equal(info["final_obs"][list(finished), T], last_obs[list(finished), T] + 1)
    assert (obs[cut, T] == 0).all() and (obs[cut, PID] == new_pid).all()  # the new worker's reset observations
    np.testing.assert_array_equal(obs[others, T], last_obs[others, T] + 1)
    assert not info.get("_episode", np.zeros(n, bool)).any(), "an aborted episode has no statistics"


@pytest.mark.parametrize("threads", [1, 2])
def test_env_raising_on_a_step_is_restarted_and_only_its_workers_episodes_are_cut(tmp_path, capsys, threads):
    fns = flaky(4, {2: {"fail_on_step": 5, "once_file": str(tmp_path / "failed"), "length": 30}})
    for i in (0, 1, 3):
        fns[i] = MakeEnv(FLAKY, {"length": 30})
    # env 2 is in worker 1 (groups 0-1, 2-3); with 2 stepping threads env 3 steps beside it and finishes the step
    with SharedMemoryVectorEnv(fns, num_workers=2, threads=threads) as envs:
        obs, _ = envs.reset(seed=0)
        pids = envs.worker_pids
        for _ in range(4):
            obs, *_ = step(envs)
        before = obs.copy()
        result = step(envs)  # env 2 raises in its 5th step
        assert envs.worker_restarts == 1
        assert envs.worker_pids[0] == pids[0] and envs.worker_pids[1] != pids[1]
        assert_cut(*result, cut=[2, 3], last_obs=before, new_pid=envs.worker_pids[1], finished=(3,) if threads == 2 else ())
        warning = capsys.readouterr().err.strip().splitlines()
        assert len(warning) == 1 and "env worker 1" in warning[0] and "envs 2..3" in warning[0]
        assert "Flaky-v0" in warning[0] and "RuntimeError: FlakyEnv was told to fail on step 5" in warning[0]

        # Training goes on: the other worker's episodes end at step 30 as planned, the restarted envs
        # 30 steps after their reset, each with its own statistics.
        ended = []
        for t in range(6, 40):
            _, _, _, truncated, info = step(envs)
            if truncated.any():
                ended.append((t, np.flatnonzero(truncated).tolist(), episode_stats(info)))
        assert ended == [(30, [0, 1], [(30.0, 30)] * 2), (35, [2, 3], [(30.0, 30)] * 2)]
        assert envs.worker_restarts == 1


def test_restarted_envs_get_fresh_seeds_that_are_reproducible():
    def noise_at_reset_and_after_each_restart() -> list[float]:
        # env 1 fails on the 2nd step of every life: restarted at steps 2 and 4
        with SharedMemoryVectorEnv(flaky(2, {1: {"fail_on_step": 2}}), num_workers=2) as envs:
            obs, _ = envs.reset(seed=7)
            noise = [obs[1, NOISE]]
            for t in range(1, 5):
                obs, *_ = step(envs)
                if t % 2 == 0:
                    noise.append(obs[1, NOISE])
            assert envs.worker_restarts == 2
        return noise

    a, b = noise_at_reset_and_after_each_restart(), noise_at_reset_and_after_each_restart()
    assert a == b, "a restart's seed follows from the run's seed and the restart count"
    assert len(set(a)) == 3, "each restart gets a new seed: the env does not replay an earlier episode"


@pytest.mark.parametrize("when", ["idle", "in_flight"])
def test_sigkilled_worker_is_restarted_with_a_new_pid(when, capsys):
    slow = {"step_s": 0.5} if when == "in_flight" else {}  # env 2: the kill lands in its step
    with SharedMemoryVectorEnv(flaky(4, {2: slow}), num_workers=2) as envs:
        envs.reset(seed=0)
        for _ in range(2):
            obs, *_ = step(envs)
        before = obs.copy()
        victim = envs.worker_pids[1]
        if when == "in_flight":  # killed while it steps: the recv that waits for it returns the cut
            envs.send(np.zeros(4, np.int64))
            os.kill(victim, signal.SIGKILL)
            *result, env_ids = envs.recv()
            assert env_ids.tolist() == [0, 1, 2, 3]
        else:  # killed between steps: its next step returns the cut
            os.kill(victim, signal.SIGKILL)
            time.sleep(0.2)
            result = step(envs)
        assert envs.worker_restarts == 1 and envs.worker_pids[1] != victim and gone(victim)
        assert_cut(*result, cut=[2, 3], last_obs=before, new_pid=envs.worker_pids[1])
        assert "worker process died (signal 9, SIGKILL)" in capsys.readouterr().err
        for t in range(1, 3):
            obs, _, _, truncated, _ = step(envs)
            assert not truncated.any() and obs[:, T].tolist() == [3 + t, 3 + t, t, t]
        assert envs.worker_restarts == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_worker_crashing_in_native_code_is_restarted(threads):
    with SharedMemoryVectorEnv(flaky(2, {0: {"fail_on_step": 2, "how": "crash"}}), num_workers=2, threads=threads) as envs:
        obs, _ = envs.reset(seed=0)
        pid = envs.worker_pids[0]
        obs, *_ = step(envs)
        before = obs.copy()
        assert_cut(*step(envs), cut=[0], last_obs=before, new_pid=envs.worker_pids[0])
        assert envs.worker_restarts == 1 and envs.worker_pids[0] != pid


@pytest.mark.serial  # real time and real load: run alone (Makefile)
@pytest.mark.parametrize("threads", [1, 2])
def test_hanging_env_is_killed_after_env_timeout_and_restarted(tmp_path, capsys, threads):
    fns = flaky(4, {1: {"fail_on_step": 3, "how": "hang", "once_file": str(tmp_path / "hung")}})
    # with 2 stepping threads env 1 hangs in its own thread while env 0 steps beside it: the worker is killed all the same
    with SharedMemoryVectorEnv(fns, num_workers=2, env_timeout=2, threads=threads) as envs:
        envs.reset(seed=0)
        for _ in range(2):
            obs, *_ = step(envs)
        before, hung = obs.copy(), envs.worker_pids[0]
        start = time.monotonic()
        result = step(envs)
        waited = time.monotonic() - start
        assert 2.0 <= waited < 8.0, f"the hang was seen after {waited:.1f} s, with env_timeout=2"
        assert envs.worker_restarts == 1 and gone(hung)
        # env 0 had finished the step when env 1 hung in it: its result stands, and its episode ends after it
        assert_cut(*result, cut=[0, 1], last_obs=before, new_pid=envs.worker_pids[0], finished=(0,))
        assert "no answer within 2 s" in capsys.readouterr().err
        for _ in range(20):
            assert not step(envs)[3].any()


def test_env_that_always_fails_stops_after_max_restarts_naming_env_worker_and_exception():
    envs = SharedMemoryVectorEnv(flaky(4, {1: {"fail_on_step": 1}}), num_workers=2, max_restarts=2)
    envs.reset(seed=0)
    pids: set[int] = set(envs.worker_pids)
    steps = 0
    with pytest.raises(EnvWorkerError) as caught:
        for steps in range(1, 10):
            step(envs, pids)
    assert steps == 3, "two failures are restarted, the third one raises"
    message = str(caught.value)
    assert "Env 1 (" in message and "env worker 0" in message and "raised during step" in message
    assert "RuntimeError: FlakyEnv was told to fail on step 1" in message
    assert "restarted 2 times" in message and "max_restarts=2" in message and "--max-env-restarts" in message
    assert caught.value.env_index == 1 and caught.value.worker_index == 0
    assert envs.worker_restarts == 2 and len(pids) == 4  # two replaced workers
    assert all(gone(pid) for pid in pids), "the error closes the vector env"
    with pytest.raises(FleetError, match="closed"):
        step(envs)


def test_fleet_error_raised_in_an_env_stops_at_once_without_restart(capsys):
    # a FleetError (fleetrl's output checks raise them) says the env is wrong: a restart would not help
    envs = SharedMemoryVectorEnv(flaky(2, {1: {"fail_on_step": 2, "how": "fleet"}}), num_workers=2)
    pids = envs.worker_pids
    envs.reset(seed=0)
    step(envs)
    with pytest.raises(FleetError) as caught:
        step(envs)
    assert type(caught.value) is FleetError, "the env's own error, as the in-process backends raise it"
    assert str(caught.value) == "FlakyEnv found its own observation wrong on step 2"
    assert envs.worker_restarts == 0 and "restarting" not in capsys.readouterr().err
    assert all(gone(pid) for pid in pids), "the error closes the vector env"


@pytest.mark.parametrize("threads", [1, 2])
def test_send_recv_with_split_groups_and_first_ready_batches_go_on_across_a_restart(tmp_path, threads):
    # the zero-lag sampler: two halves sent and received apart; env 3 (worker 1, half B) fails once
    with SharedMemoryVectorEnv(flaky(4, {3: {"fail_on_step": 4, "once_file": str(tmp_path / "a")}}),
                               num_workers=2, threads=threads) as envs:
        half_a, half_b = envs.split(2)
        obs, _ = envs.reset(seed=0)
        envs.send(np.zeros(2, np.int64), half_a)
        envs.send(np.zeros(2, np.int64), half_b)
        cuts = []
        for t in range(1, 10):
            for half in (half_a, half_b):
                obs, _, _, truncated, info, env_ids = envs.recv(half)
                assert env_ids.tolist() == half.tolist()
                if truncated.any():
                    cuts.append((t, env_ids[truncated].tolist(), info["final_obs"][truncated, T].tolist()))
                    assert (obs[:, T] == 0).all()
                envs.send(np.zeros(2, np.int64), env_ids)
        # env 2 had finished step 4 when env 3 raised in it: its episode ends on that step's observation
        assert cuts == [(4, [2, 3], [4, 3])] and envs.worker_restarts == 1
        envs.recv(half_a), envs.recv(half_b)

    # first-ready batches of one worker's envs; env 4 (worker 2) fails once. The others may run far
    # ahead while worker 2 restarts: their episodes must not end on their own meanwhile.
    endless = {"length": 10**9}
    fns = flaky(6, {i: endless for i in range(6)})
    fns[4] = MakeEnv(FLAKY, {**endless, "fail_on_step": 3, "once_file": str(tmp_path / "b")})
    with SharedMemoryVectorEnv(fns, num_workers=3, async_batch=2, threads=threads) as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(6, np.int64))
        steps, cut = np.zeros(6, int), []
        deadline = time.monotonic() + 20.0
        # the other workers go on while worker 2 restarts: wait until every env has stepped a while
        while steps.min() < 10 and time.monotonic() < deadline:
            obs, _, _, truncated, info, env_ids = envs.recv()
            steps[env_ids] += 1
            if truncated.any():
                cut.append((env_ids[truncated].tolist(), info["final_obs"][truncated, T].tolist(), obs[:, T].tolist()))
            else:
                np.testing.assert_array_equal(obs[:, T], steps[env_ids] - (3 if env_ids[0] == 4 and cut else 0))
            envs.send(np.zeros(2, np.int64), env_ids)
        # env 5 steps after env 4 in one thread (never reached), beside it with two (it finished its 3rd step)
        assert cut == [([4, 5], [2, 3] if threads == 2 else [2, 2], [0, 0])] and envs.worker_restarts == 1
        assert steps.min() >= 10


class ConstructorHangsEnv(gym.Env):
    """An env whose constructor waits for something that never comes (a simulator's server, a licence, a prompt)."""

    observation_space, action_space = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2)

    def __init__(self):
        NEVER.wait(3600)  # set when the test ends, so its builder thread does not outlive it


NEVER = threading.Event()
gym.register("fleetrl_test_hang/ConstructorHangs-v0", entry_point=ConstructorHangsEnv)


class HangsInWorkersEnv(ConstructorHangsEnv):
    """Built here (gymnasium's AsyncVectorEnv builds one for the spaces), it is fine; in a worker process it hangs."""

    def __init__(self):
        # a worker imports this module afresh (so a pid taken at import would be its own): ask multiprocessing instead
        if multiprocessing.parent_process() is not None:
            time.sleep(3600)


@pytest.mark.parametrize("build", ["env_family", "SharedMemoryVectorEnv", "make_vec", "gym-async"])
def test_an_env_built_only_for_its_spaces_that_hangs_ends_in_one_paragraph_in_bounded_time(build, monkeypatch):
    from fleetrl.envs import env_family, make_vec, vector
    from fleetrl.envs.shm import supervisor

    monkeypatch.setattr(supervisor, "MIN_BUILD_TIMEOUT_S", 0.5)  # the least a build gets (30 s): short here
    monkeypatch.setattr(vector, "GYM_ASYNC_BUILD_TIMEOUT_S", 0.5)
    builds = {"env_family": lambda: env_family("fleetrl_test_hang/ConstructorHangs-v0", env_timeout=0.5),
              "SharedMemoryVectorEnv": lambda: SharedMemoryVectorEnv([ConstructorHangsEnv] * 2, env_timeout=0.5),
              "make_vec": lambda: make_vec([ConstructorHangsEnv] * 2, backend="async", env_timeout=0.5),
              "gym-async": lambda: vector.GymAsyncVectorEnv([HangsInWorkersEnv] * 2)}  # gymnasium's workers: their builds hang
    children = set(multiprocessing.active_children())
    NEVER.clear()
    began = time.monotonic()
    try:
        with pytest.raises(FleetError) as refused:
            builds[build]()
        took = time.monotonic() - began
    finally:
        NEVER.set()
    assert took < 20, f"{build} waited {took:.1f} s for an env that hangs, with --env-timeout 0.5 (a generous guard)"
    said = str(refused.value)
    expected = ("did not finish building its 2 envs within 0.5 s", "Its workers were killed") if build == "gym-async" else \
        ("was built to read its spaces, and its construction gave no answer within 0.5 s", "--env-timeout")
    assert "\n" not in said and all(words in said for words in expected), said
    left = [p for p in set(multiprocessing.active_children()) - children if p.is_alive()]
    assert not left, "a build that hung leaves no worker behind"


def test_close_after_restarts_leaves_no_worker_processes(tmp_path):
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    fns = flaky(6, {0: {"fail_on_step": 2, "once_file": str(tmp_path / "raise")},
                    2: {"fail_on_step": 3, "how": "crash", "once_file": str(tmp_path / "crash")}})
    envs = SharedMemoryVectorEnv(fns, num_workers=3)
    pids = set(envs.worker_pids)
    envs.reset(seed=0)
    for _ in range(4):
        step(envs, pids)
    os.kill(envs.worker_pids[2], signal.SIGKILL)
    for _ in range(3):
        step(envs, pids)
    assert envs.worker_restarts == 3 and len(pids) == 6
    envs.send(np.zeros(6, np.int64))  # close also works with a step in flight
    envs.close()
    assert all(gone(pid) for pid in pids), {pid: gone(pid) for pid in pids}
    # What may remain is multiprocessing's own forkserver and resource tracker, shared by the process.
    new = [p for p in me.children(recursive=True) if p.pid not in before and not gone(p.pid)]
    assert all("multiprocessing" in " ".join(p.cmdline()) for p in new), [p.cmdline() for p in new]


def test_closing_a_worker_hung_in_a_step_kills_it_once_the_grace_is_over(tmp_path, monkeypatch):
    """Workers ignore SIGTERM (fleetrl/forkserver_init.py), so close() has no SIGTERM stage to wait through: a worker
    that has not exited when the grace is over is SIGKILLed then. (With a SIGTERM stage, a hung worker's close took the
    grace plus the second that stage waited, for nothing.) The others exit on their own.

    Proved by what close() does, not by how long it takes on a loaded machine: it signals the hung worker once, with
    SIGKILL, after giving it the grace, and nothing else; the time bound is only a hang guard, far below the env timeout."""
    from fleetrl.envs.shm import supervisor

    monkeypatch.setattr(supervisor, "CLOSE_GRACE_S", 0.5)
    hung = tmp_path / "hung"
    env_timeout = 300.0  # the hung step would count as hung only after this: close must not wait for it
    envs = SharedMemoryVectorEnv(flaky(4, {2: {"fail_on_step": 1, "how": "hang", "once_file": str(hung)}}), num_workers=2,
                                 env_timeout=env_timeout)
    procs = [w.proc for w in envs._workers]
    signalled = []  # (worker, how): every signal close() sends a worker goes through these two methods
    for i, proc in enumerate(procs):
        for how in ("terminate", "kill"):
            monkeypatch.setattr(proc, how, lambda i=i, how=how, send=getattr(proc, how): (signalled.append((i, how)), send())[1])
    envs.reset(seed=0)
    envs.send(np.zeros(4, np.int64))
    deadline = time.monotonic() + 30
    while not hung.exists():  # env 2 is in its step for good
        assert time.monotonic() < deadline, "env 2 never began its step"
        time.sleep(0.01)
    start = time.monotonic()
    envs.close()
    took = time.monotonic() - start
    assert procs[0].exitcode == 0 and procs[1].exitcode == -signal.SIGKILL, [p.exitcode for p in procs]
    assert signalled == [(1, "kill")], "only the hung worker is signalled, with SIGKILL and no SIGTERM stage before it"
    assert took >= supervisor.CLOSE_GRACE_S, "the hung worker was given the grace to exit first"
    assert took < 30 < env_timeout, f"close took {took:.2f} s: it waited for the hung step instead of killing it"
