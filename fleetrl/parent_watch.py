"""A run that a fleetrl tool started stops when the tool is gone, even killed by SIGKILL: the tool puts its pid in
FLEETRL_PARENT_PID, and a daemon thread here sends the run SIGTERM (it checkpoints and stops) once that process is gone.
No torch here: the tools import this module for the variable's name."""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_PID_ENV = "FLEETRL_PARENT_PID"
POLL_S = 0.5  # how soon a run notices that its tool is gone
KILL_AFTER_S = 30.0  # a run still alive this long after that SIGTERM is killed (a stuck iteration must not live on unowned)


def watch_parent() -> threading.Thread | None:
    """Start the watcher when FLEETRL_PARENT_PID is set; the variable is taken out of this process's environment, so that
    the run's own children (env workers, a learner process) do not watch the tool as well."""
    value = os.environ.pop(PARENT_PID_ENV, "")
    if not value.isdigit():
        return None
    import psutil

    try:
        parent = psutil.Process(int(value))  # its start time is kept: a reused pid is another process, not the tool
    except psutil.Error:
        parent = None  # gone before this run started
    watcher = threading.Thread(target=_stop_when_gone, args=(parent,), name="fleetrl-parent-watch", daemon=True)
    watcher.start()
    return watcher


def _alive(parent) -> bool:
    import psutil

    try:
        return parent is not None and parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop_when_gone(parent) -> None:
    while _alive(parent):
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(KILL_AFTER_S)  # a daemon thread: a run that stopped took this thread with it
    leads_group = os.getpgrp() == os.getpid()  # the tools start each run in a session of its own, its env workers inside
    if leads_group:
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
