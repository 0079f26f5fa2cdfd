"""fleetrl/processes.py: every kind of child (env worker, learner, gym-async worker) starts the one way, ignoring the stop
signals and finding the trainer's modules, wherever the forkserver started; and whether a process is alive, with a zombie
and a reused pid told apart from the process that was meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil

from fleetrl import processes

from conftest import fleetrl_env

CHILD_MODULE = """
import os, signal
import gymnasium as gym
import numpy as np


def ignored(signum):
    return float(signal.getsignal(signum) == signal.SIG_IGN)


def seen():
    return [float(os.getpid()), ignored(signal.SIGTERM), ignored(signal.SIGINT)]


class SeesItsProcess(gym.Env):
    observation_space = gym.spaces.Box(0, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array(seen()), {}

    def step(self, action):
        return np.array(seen()), 0.0, False, False, {}


def make():
    return SeesItsProcess()


def where():
    return dict(zip(("pid", "sigterm", "sigint"), seen()))
"""

# Run by `python -c` in a folder without the module: sys.path starts with '' (the current folder), a relative entry.
TRAINER = """
import json, os, sys
from fleetrl import processes

methods, module_dir = sys.argv[1].split(","), sys.argv[2]
for method in methods:
    first = processes.context(method).Process(target=os.getpid)  # the forkserver starts here, where '' cannot find the module
    first.start()
    first.join()
os.chdir(module_dir)  # now '' finds it, in this process
import child_module_of_the_test as mod

seen = {"me": os.getpid()}


def child(kind, start):
    for method in methods:  # each kind of child, started each way
        processes.default_start_method = lambda: method
        try:
            seen.setdefault(method, {})[kind] = start()
        except Exception as exc:
            seen[method][kind] = f"{type(exc).__name__}: {exc}"[-800:]


def env_worker():
    from fleetrl.envs.shm.vector import SharedMemoryVectorEnv

    with SharedMemoryVectorEnv([mod.make] * 2, num_workers=2) as envs:
        return envs.reset(seed=0)[0].tolist()


def gym_async_worker():
    from fleetrl.envs.vector import GymAsyncVectorEnv

    envs = GymAsyncVectorEnv([mod.make] * 2)
    try:
        return envs.reset(seed=0)[0].tolist()
    finally:
        envs.close()


def learner():
    from torch import nn
    from fleetrl.learner import Learner

    learner = Learner([mod.where], acting=nn.Linear(1, 1), owned={}, lag=1, device="cpu")
    try:
        learner(mod.where)
        return [list(learner(mod.where).values())]  # the first call's result comes with the second
    finally:
        learner.close()


child("env worker", env_worker)
child("gym-async worker", gym_async_worker)
child("learner", learner)
print(json.dumps(seen))
"""


def test_every_kind_of_child_imports_the_trainers_modules_and_ignores_the_stop_signals(tmp_path):
    """The module is found through '' in the trainer's sys.path, in a folder the trainer changed to after multiprocessing
    was imported (and the forkserver started) elsewhere: multiprocessing makes '' that first folder in its children, so a
    child must take the trainer's path made absolute. Before, gymnasium's workers failed here (ModuleNotFoundError).
    Both start methods in one trainer process (a process start that imports torch costs about 2.5 s)."""
    start, module_dir = tmp_path / "start", tmp_path / "envs"
    start.mkdir()
    module_dir.mkdir()
    (module_dir / "child_module_of_the_test.py").write_text(CHILD_MODULE)
    proc = subprocess.run([sys.executable, "-c", TRAINER, "forkserver,spawn", str(module_dir)], cwd=start, capture_output=True, text=True,
                          timeout=300, env=fleetrl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    me = seen.pop("me")
    assert sorted(seen) == ["forkserver", "spawn"]
    for method, kinds in seen.items():
        assert sorted(kinds) == ["env worker", "gym-async worker", "learner"]
        for kind, rows in kinds.items():
            assert isinstance(rows, list), f"{kind} ({method}): {rows}"
            for pid, ignores_sigterm, ignores_sigint in rows:
                assert pid != me, f"{kind} ({method}) ran in the trainer"
                assert (ignores_sigterm, ignores_sigint) == (1.0, 1.0), f"{kind} ({method}) must ignore SIGTERM and Ctrl-C"


def test_a_call_in_this_process_changes_nothing_here(tmp_path, monkeypatch):
    """gymnasium calls one env function in the trainer (for the spaces): the trainer keeps its signals and folder."""
    import signal

    monkeypatch.chdir(tmp_path)
    call = processes.CallInChild(os.getcwd)
    os.chdir("/")
    assert call() == "/" and signal.getsignal(signal.SIGTERM) != signal.SIG_IGN


def test_the_import_path_is_absolute_and_a_child_puts_it_first():
    path = processes.ImportPath.here()
    assert path.cwd == os.getcwd() and all(os.path.isabs(p) for p in path.sys_path)
    before = list(sys.path)
    try:
        sys.path[:] = ["/the/childs/own", *path.sys_path[:1]]
        processes.ImportPath(("/a", "/b"), path.cwd).apply()
        assert sys.path == ["/a", "/b", "/the/childs/own", *path.sys_path[:1]]
    finally:
        sys.path[:] = before


# ---- is it alive --------------------------------------------------------------------------------------------------


def test_this_process_is_alive_and_known_by_its_start_time():
    started = processes.start_time(os.getpid())
    assert started == psutil.Process().create_time()
    assert processes.pid_alive(os.getpid()) and processes.pid_alive(os.getpid(), started)


def test_a_pid_given_to_a_later_process_is_not_the_process_that_was_meant():
    """A pid is reused once its process is reaped: the start time tells the later process from the one recorded."""
    started = processes.start_time(os.getpid())
    assert not processes.pid_alive(os.getpid(), started - 1.0), "another start time: a later process with the same pid"


def test_a_zombie_is_not_alive():
    """A zombie has ended (only its exit status waits to be reaped): os.kill(pid, 0) still succeeds on it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.start_time(child.pid)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never ended"
            time.sleep(0.01)
        os.kill(child.pid, 0)  # the check the env workers made: it calls the zombie alive
        assert not processes.pid_alive(child.pid) and not processes.pid_alive(child.pid, started)
    finally:
        child.wait()
    assert not processes.pid_alive(child.pid, started), "reaped: gone"

