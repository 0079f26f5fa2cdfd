"""How fleetrl starts child processes (env workers, the learner, gym-async's workers; never a fork of the trainer), what
each does first, and whether a process is alive. No torch here: env workers and the tools import it."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import BaseContext

PRELOAD = "fleetrl.forkserver_init"  # the forkserver imports it first: it and its children ignore SIGTERM and Ctrl-C


def default_start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``.

    Both are safe when the parent already runs threads (the trainer's monitoring, TensorBoard's writer, OpenMP's pool);
    ``fork`` starts faster, but forking a multi-threaded process can deadlock the child.
    """
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def context(method: str | None = None) -> BaseContext:
    """The multiprocessing context that starts children with ``method`` (default :func:`default_start_method`). A
    forkserver is a single-threaded server that forks each child; it is started with :data:`PRELOAD`, so it and its
    children ignore stop signals from birth (the trainer handles them, then closes its children)."""
    ctx = mp.get_context(method or default_start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([PRELOAD])  # takes effect when the server starts; every caller asks for the same
    return ctx


# ---- is it alive ----------------------------------------------------------------------------------------------------


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (psutil's ``create_time``), or None when there is none: with its pid, what tells a
    process from a later one that was given the same pid (:func:`pid_alive`)."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether process ``pid`` still runs: it exists and is not a zombie (an ended process its parent has not reaped),
    and, given ``started`` (:func:`start_time`), it is that process and not a later one that got its pid. A process
    that exists but may not be read (another user's, behind ``hidepid``) counts as alive."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if started is not None and proc.create_time() != started:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess is one
        return False
    except psutil.AccessDenied:
        return True
