"""A run that a fleetrl tool started stops when the tool is gone, even killed by SIGKILL: the tool puts its pid in
FLEETRL_PARENT_PID, and a daemon thread here sends the run SIGTERM (it checkpoints and stops) once that process is gone.
A run still alive ``KILL_AFTER_S`` later is killed, unless it is writing a checkpoint that makes progress: the
checkpoint (multi-GB with ``--save-buffer``) is let finish. No torch here: the tools import this module for the
variable's name."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

from fleetrl.processes import pid_alive, start_time

PARENT_PID_ENV = "FLEETRL_PARENT_PID"
POLL_S = 0.5  # how soon a run notices that its tool is gone
KILL_AFTER_S = 30.0  # a run still alive this long after that SIGTERM is killed (a stuck iteration must not live on unowned)
# A checkpoint being written pushes the kill back each time its files grow: to KILL_AFTER_S from then, plus the time a
# slow disk (network storage) takes to flush what was written, since its fsync makes no visible progress.
SLOW_DISK_BYTES_PER_S = 50 * 2**20

_checkpoints: dict[int, Callable[[], int]] = {}  # checkpoint writes in progress in this process: their bytes so far
_ids = itertools.count()


@contextlib.contextmanager
def checkpoint_in_progress(written: Callable[[], int]) -> Iterator[None]:
    """Mark a checkpoint being written; ``written()`` gives the bytes its files hold so far (its temporary files). While
    they grow, the watcher does not kill the run."""
    key = next(_ids)
    _checkpoints[key] = written
    try:
        yield
    finally:
        del _checkpoints[key]


def watch_parent() -> threading.Thread | None:
    """Start the watcher when FLEETRL_PARENT_PID is set; the variable is taken out of this process's environment, so that
    the run's own children (env workers, a learner process) do not watch the tool as well."""
    value = os.environ.pop(PARENT_PID_ENV, "")
    if not value.isdigit():
        return None
    pid = int(value)
    started = start_time(pid)  # kept: a reused pid is another process, not the tool (None: gone before this run started)
    watcher = threading.Thread(target=_stop_when_gone, args=(pid, started), name="fleetrl-parent-watch", daemon=True)
    watcher.start()
    return watcher


def _checkpoint_bytes() -> int | None:
    """The bytes the checkpoints in progress have written, or None when none is being written."""
    progress = list(_checkpoints.values())
    if not progress:
        return None
    total = 0
    for written in progress:
        with contextlib.suppress(OSError):  # a file renamed into place meanwhile: the checkpoint is ending
            total += written()
    return total


def _stop_when_gone(pid: int, started: float | None) -> None:
    while started is not None and pid_alive(pid, started):
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = kill_at = time.monotonic() + KILL_AFTER_S
    last, said = None, False
    while True:  # a daemon thread: a run that stopped took this thread with it
        time.sleep(POLL_S)
        now, written = time.monotonic(), _checkpoint_bytes()
        if written is not None and written != last:  # a checkpoint that makes progress is let finish
            kill_at = max(kill_at, now + KILL_AFTER_S + written / SLOW_DISK_BYTES_PER_S)
        last = written
        if now >= kill_at:
            break
        if now >= deadline and written is not None and not said:
            said = True
            print(f"fleetrl: the tool that started this run is gone, and the run is still writing a checkpoint "
                  f"({written / 2**20:,.2f} MB so far): it is let finish while it makes progress.", file=sys.stderr, flush=True)
    leads_group = os.getpgrp() == os.getpid()  # the tools start each run in a session of its own, its env workers inside
    if leads_group:
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
