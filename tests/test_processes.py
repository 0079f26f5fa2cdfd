"""fleetrl/processes.py: whether a process is alive, with a zombie and a reused pid told apart from the process that was
meant."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from fleetrl import processes


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

