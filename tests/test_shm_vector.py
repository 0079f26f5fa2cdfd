"""SharedMemoryVectorEnv: the vector interface over worker processes, async send/recv, and process hygiene."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from conftest import readline_within, require_module
from envs_for_tests import COUNTING_LENGTH, MakeEnv  # importing it registers ShmCounting-v0 and ShmImage-v0
from fleetrl.envs.registry import EnvFactory
from fleetrl.envs.shm import SharedMemoryVectorEnv
from fleetrl.envs.vector import GymSyncVectorEnv, episode_stats
from fleetrl.errors import EnvWorkerError, FleetError

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
COUNTING_ID = "envs_for_tests:ShmCounting-v0"


def counting(n: int, **kwargs) -> list[MakeEnv]:
    return [MakeEnv("ShmCounting-v0", kwargs) for _ in range(n)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_same_step_autoreset_final_obs_done_flags_and_episode_stats():
    with SharedMemoryVectorEnv(counting(4), num_workers=2) as envs:
        obs, info = envs.reset(seed=10)
        assert info == {}
        assert obs[:, :3].tolist() == [[10 + i, 0, 0] for i in range(4)]  # [seed, episode, t]
        noise = obs[:, 3].copy()
        # env 1 presses 1 (terminate) on step 3; the others run to the time limit (truncation) on step 5
        for t in range(1, COUNTING_LENGTH + 1):
            actions = np.array([0, int(t == 3), 0, 0])
            obs, reward, terminated, truncated, info = envs.step(actions)
            assert reward.dtype == np.float64 and terminated.dtype == bool and truncated.dtype == bool
            if t == 3:
                assert terminated.tolist() == [False, True, False, False] and not truncated.any()
                assert info["_final_obs"].tolist() == [False, True, False, False]
                assert info["final_obs"][1].tolist() == [11, 0, 3, noise[1]]  # last obs of the finished episode
                assert obs[1, :3].tolist() == [11, 1, 0]  # obs is already the next episode's first
                assert episode_stats(info) == [(1.0 + 2 + 3, 3)]
                assert info["episode"]["r"].dtype == np.float64 and info["episode"]["l"].dtype == np.int64
            elif t == COUNTING_LENGTH:
                assert truncated.tolist() == [True, False, True, True] and not terminated.any()
                for i in (0, 2, 3):
                    assert info["final_obs"][i].tolist() == [10 + i, 0, COUNTING_LENGTH, noise[i]]
                    assert obs[i, :3].tolist() == [10 + i, 1, 0]
                assert info["_episode"].tolist() == [True, False, True, True]
                assert sorted(episode_stats(info)) == [(15.0, 5)] * 3
                assert obs[1, :3].tolist() == [11, 1, 2]  # env 1 is two steps into its second episode
            else:
                assert not terminated.any() and not truncated.any()
                assert "_final_obs" not in info and "final_obs" not in info and "_episode" not in info
            np.testing.assert_array_equal(reward, [t, t - 3 if t > 3 else t, t, t])


def test_same_seed_gives_identical_runs_and_each_env_its_own_seed():
    def run(seed: int) -> np.ndarray:
        rng = np.random.default_rng(0)
        with SharedMemoryVectorEnv(counting(4, length=4), num_workers=2) as envs:
            frames = [envs.reset(seed=seed)[0]]
            for _ in range(12):
                frames.append(envs.step(rng.integers(0, 2, 4))[0])
        return np.stack(frames)

    a, b, c = run(7), run(7), run(8)
    np.testing.assert_array_equal(a, b)
    assert len(set(a[0, :, 3].tolist())) == 4, "the envs' RNG draws differ: each env got its own seed"
    assert not np.array_equal(a[:, :, 3], c[:, :, 3])


@pytest.mark.parametrize(
    "env_id, family, num_envs, steps",
    [
        ("CartPole-v1", "classic", 7, 400),  # 7 envs over 3 workers: uneven groups (3, 2, 2) step fine
        ("Pendulum-v1", "mujoco", 3, 450),  # Box actions, which workers must copy out of shared memory
        # uint8 frames; a lost life ends a training episode every 20-25 steps, so 80 steps cover each env's autoresets
        pytest.param("BreakoutNoFrameskip-v4", "atari", 3, 80, marks=pytest.mark.slow),
    ],
)
def test_matches_gymnasium_sync_vector_env_step_for_step(env_id, family, num_envs, steps):
    if family == "atari":
        require_module("ale_py", "atari")
    factories = [EnvFactory(env_id, family) for _ in range(num_envs)]
    theirs = GymSyncVectorEnv(factories)
    with SharedMemoryVectorEnv(factories, num_workers=3) as ours:
        np.testing.assert_array_equal(ours.reset(seed=3)[0], theirs.reset(seed=3)[0])
        action_space = theirs.single_action_space
        action_space.seed(0)
        finished = 0
        for _ in range(steps):
            actions = np.stack([action_space.sample() for _ in range(num_envs)])
            a, b = ours.step(actions), theirs.step(actions)
            for x, y in zip(a[:4], b[:4]):
                np.testing.assert_array_equal(x, y)
                assert x.dtype == y.dtype
            assert a[4].keys() == b[4].keys()
            assert episode_stats(a[4]) == episode_stats(b[4])
            if "_final_obs" in b[4]:
                np.testing.assert_array_equal(a[4]["_final_obs"], b[4]["_final_obs"])
                np.testing.assert_array_equal(a[4]["final_obs"], b[4]["final_obs"])
                finished += int(b[4]["_final_obs"].sum())
        assert finished >= num_envs, "the run must cover autoresets"
    theirs.close()


def test_send_recv_with_the_full_batch_reproduces_step():
    fns = [EnvFactory("CartPole-v1", "classic") for _ in range(4)]
    with SharedMemoryVectorEnv(fns, num_workers=2) as stepped, SharedMemoryVectorEnv(fns, num_workers=2) as sent:
        stepped.reset(seed=1)
        sent.reset(seed=1)
        rng = np.random.default_rng(1)
        for _ in range(100):
            actions = rng.integers(0, 2, 4)
            expected = stepped.step(actions)
            sent.send(actions, np.arange(4))
            *got, env_ids = sent.recv()
            assert env_ids.tolist() == [0, 1, 2, 3]
            for x, y in zip(got[:4], expected[:4]):
                np.testing.assert_array_equal(x, y)
            assert episode_stats(got[4]) == episode_stats(expected[4])


def test_recv_returns_results_indexed_by_position_in_env_ids():
    with SharedMemoryVectorEnv(counting(6, length=1000), num_workers=3, async_batch=2) as envs:
        envs.reset(seed=100)
        envs.send(np.zeros(6, np.int64))
        seen = set()
        deadline = time.perf_counter() + 10.0
        # first-ready order depends on how the OS schedules 3 workers on the cores: keep going until
        # every group has been served (FIFO results make that certain), within a bound
        while seen != {0, 2, 4} and time.perf_counter() < deadline:
            obs, reward, terminated, truncated, info, env_ids = envs.recv()
            assert len(env_ids) == 2 and env_ids.tolist() in ([0, 1], [2, 3], [4, 5])
            np.testing.assert_array_equal(obs[:, 0], 100 + env_ids)  # obs[k] belongs to env env_ids[k]
            assert obs.shape == (2, 4) and reward.shape == terminated.shape == truncated.shape == (2,)
            seen.add(int(env_ids[0]))
            envs.send(np.zeros(2, np.int64), env_ids)
        assert seen == {0, 2, 4}
        envs.reset(seed=0)  # a reset waits out the sends still in flight
        assert envs.step(np.zeros(6, np.int64))[0][:, 2].tolist() == [1] * 6


@pytest.mark.slow
def test_slow_env_does_not_idle_the_fast_ones_with_async_batch(tmp_path):
    # env 0 is held in its step until the test opens its gate (as slow as the test needs, whatever the machine's load);
    # envs 1-3 step freely, one env per worker, and recv returns the first ready
    gate = tmp_path / "gate"
    fns = [MakeEnv("ShmCounting-v0", {"length": 10**9, "gate": str(gate)} if i == 0 else {"length": 10**9, "step_us": 200})
           for i in range(4)]
    with SharedMemoryVectorEnv(fns, num_workers=4, async_batch=1) as envs:
        envs.reset(seed=0)
        steps = np.zeros(4, dtype=int)
        envs.send(np.zeros(4, np.int64))
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing
        while steps[1:].min() < 50:
            assert time.monotonic() < deadline, f"fast envs waited for the held one: steps per env {steps.tolist()}"
            *_, env_ids = envs.recv()
            steps[env_ids] += 1
            envs.send(np.zeros(len(env_ids), np.int64), env_ids)
        assert steps[0] == 0, "env 0 is still in its first step"
        gate.touch()
        while steps[0] == 0:  # let through, it comes back like any other
            assert time.monotonic() < deadline, steps.tolist()
            *_, env_ids = envs.recv()
            steps[env_ids] += 1
            envs.send(np.zeros(len(env_ids), np.int64), env_ids)


@pytest.mark.parametrize("where", ["step", "reset"])
def test_env_exception_without_restarts_left_reaches_caller_as_env_worker_error_naming_env_and_worker(where):
    # restarts are tests/test_worker_restart.py's subject; with none allowed the first failure stops the run
    kwargs = {"raise_on_step": 3} if where == "step" else {"raise_on_reset": True}
    fns = counting(6)
    fns[3] = MakeEnv("ShmCounting-v0", kwargs)
    envs = SharedMemoryVectorEnv(fns, num_workers=3, max_restarts=0)  # env 3 is in worker 1 (groups 0-1, 2-3, 4-5)
    pids = envs.worker_pids
    start = time.perf_counter()
    with pytest.raises(EnvWorkerError) as caught:
        envs.reset(seed=0)
        for _ in range(5):
            envs.step(np.zeros(6, np.int64))
    assert time.perf_counter() - start < 5.0
    message = str(caught.value)
    assert "Env 3" in message and "env worker 1" in message and "ShmCounting-v0" in message
    assert f"raised during {where}" in message
    assert "Traceback" in message and "RuntimeError: CountingEnv was told to fail" in message
    assert "max_restarts=0" in message and "--max-env-restarts" in message
    assert caught.value.env_index == 3 and caught.value.worker_index == 1 and envs.worker_restarts == 0
    assert all(gone(pid) for pid in pids), "a failure closes the vector env"
    with pytest.raises(FleetError, match="closed"):
        envs.step(np.zeros(6, np.int64))


def test_env_that_fails_to_build_is_reported_at_construction_not_restarted(capsys):
    fns = counting(4)
    fns[2] = MakeEnv("ShmCounting-v0", {"no_such_argument": 1})
    with pytest.raises(EnvWorkerError, match=r"(?s)Env 2 .*env worker 1.*construction.*no_such_argument") as caught:
        SharedMemoryVectorEnv(fns, num_workers=2)
    assert "max_restarts" not in str(caught.value) and "restarting" not in capsys.readouterr().err


@pytest.mark.parametrize("when", ["idle", "in_flight"])
def test_killed_worker_without_restarts_left_is_detected_not_waited_for(when):
    envs = SharedMemoryVectorEnv(counting(4, step_us=100_000 if when == "in_flight" else 0), num_workers=2,
                                 max_restarts=0)
    envs.reset(seed=0)
    victim = envs.worker_pids[1]
    start = time.perf_counter()
    with pytest.raises(EnvWorkerError, match=r"(?s)worker 1 .*died.*SIGKILL"):
        if when == "in_flight":
            envs.send(np.zeros(4, np.int64))
            os.kill(victim, signal.SIGKILL)
            envs.recv()
        else:
            os.kill(victim, signal.SIGKILL)
            time.sleep(0.2)
            envs.step(np.zeros(4, np.int64))
    assert time.perf_counter() - start < 5.0
    assert all(gone(pid) for pid in envs.worker_pids)


def test_close_leaves_no_worker_processes():
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    envs = SharedMemoryVectorEnv(counting(4), num_workers=2)
    pids = envs.worker_pids
    envs.reset(seed=0)
    envs.send(np.zeros(4, np.int64))  # close also works with a step in flight
    envs.close()
    envs.close()  # idempotent
    assert all(gone(pid) for pid in pids)
    # What may remain is multiprocessing's own forkserver and resource tracker, shared by the process.
    new = [p for p in me.children(recursive=True) if p.pid not in before and not gone(p.pid)]
    assert all("multiprocessing" in " ".join(p.cmdline()) for p in new), [p.cmdline() for p in new]


def test_dropped_vector_env_stops_its_workers():
    envs = SharedMemoryVectorEnv(counting(2), num_workers=2)
    pids = envs.worker_pids
    del envs  # the weakref finalizer closes it (it also runs at interpreter exit)
    gc.collect()
    assert all(gone(pid) for pid in pids)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_custom_module_env_id_builds_in_workers(start_method):
    with SharedMemoryVectorEnv([EnvFactory(COUNTING_ID, "classic")] * 2, start_method=start_method) as envs:
        assert envs.start_method == start_method
        obs, _ = envs.reset(seed=5)
        assert obs[:, 0].tolist() == [5, 6]


def test_module_added_to_sys_path_after_forkserver_started_imports_in_workers(tmp_path, monkeypatch):
    # forkserver children inherit the server's sys.path; the backend must hand them the parent's
    SharedMemoryVectorEnv(counting(1), start_method="forkserver").close()  # make sure the server runs
    (tmp_path / "late_env_module_shm.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        from envs_for_tests import CountingEnv
        gym.register("LateShmCounting-v0", entry_point=CountingEnv, kwargs={"length": 3})
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    fns = [EnvFactory("late_env_module_shm:LateShmCounting-v0", "classic")] * 2
    with SharedMemoryVectorEnv(fns, start_method="forkserver") as envs:
        envs.reset(seed=0)
        for _ in range(3):
            *_, truncated, _ = envs.step(np.zeros(2, np.int64))
        assert truncated.all()


@pytest.mark.parametrize("copy", [True, False])
def test_uint8_image_observations_come_from_shared_memory(copy):
    with SharedMemoryVectorEnv([MakeEnv("ShmImage-v0")] * 4, num_workers=2, copy=copy) as envs:
        obs, _ = envs.reset(seed=0)
        for t in range(1, 8):
            obs, _, _, truncated, info = envs.step(np.zeros(4, np.int64))
        assert obs.dtype == np.uint8 and obs.shape == (4, 4, 84, 84)
        assert truncated.all() and (info["final_obs"] == 7).all() and (obs == 0).all()
        shared = envs._views["obs"]
        assert np.shares_memory(obs, shared) == (not copy)  # a view of shared memory, or its one copy


def test_async_batch_must_be_whole_worker_groups():
    with pytest.raises(FleetError, match=r"multiple of the envs each of the 2 env workers steps \(4\)"):
        SharedMemoryVectorEnv(counting(8), num_workers=2, async_batch=2)
    with pytest.raises(FleetError, match=r"each of the 4 env workers steps \(1.5\).*among \[2, 6\]"):
        SharedMemoryVectorEnv(counting(6), num_workers=4, async_batch=3)  # uneven groups
    with pytest.raises(FleetError, match="must divide --num-envs 8"):
        SharedMemoryVectorEnv(counting(8), num_workers=4, async_batch=3)
    with pytest.raises(FleetError, match="num_workers"):
        SharedMemoryVectorEnv(counting(2), num_workers=3)
    with SharedMemoryVectorEnv(counting(4), num_workers=2, async_batch=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(FleetError, match="whole worker groups"):
            envs.send(np.zeros(1, np.int64), [1])
        with pytest.raises(FleetError, match="only 0 are in flight"):
            envs.recv()
        envs.send(np.zeros(2, np.int64), [2, 3])
        with pytest.raises(FleetError, match="still in flight"):
            envs.send(np.zeros(2, np.int64), [2, 3])
        with pytest.raises(FleetError, match="step\\(\\) steps every env"):
            envs.step(np.zeros(4, np.int64))


def test_workers_ignore_sigint_and_sigterm_and_use_one_thread():
    fns = [MakeEnv("ShmCounting-v0")] * 2
    with SharedMemoryVectorEnv(fns, num_workers=2, start_method="spawn") as envs:
        envs.reset(seed=0)
        pids = list(envs.worker_pids)
        for pid in pids:
            os.kill(pid, signal.SIGINT)
            os.kill(pid, signal.SIGTERM)  # Slurm signals the whole job step; the trainer owns shutdown
            assert psutil.Process(pid).environ().get("OMP_NUM_THREADS") == "1"
        time.sleep(0.2)
        envs.step(np.zeros(2, np.int64))  # still alive and serving
        assert list(envs.worker_pids) == pids and envs.worker_restarts == 0


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed(tmp_path):
    script = tmp_path / "orphan.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {TESTS_DIR!r})
        from envs_for_tests import MakeEnv
        from fleetrl.envs.shm import SharedMemoryVectorEnv

        if __name__ == "__main__":
            envs = SharedMemoryVectorEnv([MakeEnv("ShmCounting-v0")] * 4, num_workers=2)
            envs.reset(seed=0)
            print(*envs.worker_pids, flush=True)
            time.sleep(60)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = [int(p) for p in readline_within(proc, 60).split()]
        assert len(pids) == 2
        proc.kill()  # SIGKILL: no close(), no finalizer, no atexit
        proc.wait()
        deadline = time.monotonic() + 5.0
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(pid) for pid in pids), "orphaned workers must notice and exit"
    finally:
        with contextlib.suppress(ProcessLookupError):  # its workers too, should the test fail before they exit
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_ctrl_c_in_the_parent_stops_cleanly(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(textwrap.dedent(f"""
        import signal
        import sys
        sys.path.insert(0, {TESTS_DIR!r})
        import numpy as np
        from envs_for_tests import MakeEnv
        from fleetrl.envs.shm import SharedMemoryVectorEnv

        if __name__ == "__main__":
            # a program started from a terminal has Python's Ctrl-C handler; a suite run in the background of a
            # non-interactive shell (`make test &`) ignores SIGINT, and the script would inherit that and loop on
            signal.signal(signal.SIGINT, signal.default_int_handler)
            envs = SharedMemoryVectorEnv([MakeEnv("ShmCounting-v0", {{"step_us": 300}})] * 4, num_workers=2)
            envs.reset(seed=0)
            print("pids", *envs.worker_pids, flush=True)
            try:
                while True:
                    envs.step(np.zeros(4, np.int64))
            except KeyboardInterrupt:
                envs.close()
                print("closed cleanly", flush=True)
    """))
    # a new session, so a terminal-style SIGINT to the process group reaches the script and its workers
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        line = readline_within(proc, 60)
        assert line.startswith("pids"), line
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "closed cleanly" in out, out
    assert "Traceback" not in out, out
    assert all(gone(pid) for pid in pids)
