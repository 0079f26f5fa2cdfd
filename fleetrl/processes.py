"""How fleetrl starts child processes (env workers, the learner, gym-async's workers; never a fork of the trainer), what
each does first, and whether a process is alive. No torch here: env workers and the tools import it."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any, Callable

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


# ---- what every child does first -------------------------------------------------------------------------------------


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and Ctrl-C (SIGINT), as every child of the trainer does from its first instruction on: both reach
    the whole process group (Slurm's SIGTERM before a preemption, Ctrl-C in the terminal), and the trainer owns the stop.
    It checkpoints the run and then closes its children; children dying mid-step would turn that into restarts."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class ImportPath:
    """Where the trainer finds modules: its ``sys.path`` with every entry absolute ('' is its folder now), and its folder.
    A child takes it (:meth:`apply`) before it unpickles anything, so that a custom env module (``mymod:MyEnv-v0``) or a
    function it is sent imports there as it does in the trainer. multiprocessing hands its children nearly this, but
    with '' made the folder it was first imported in: another folder once the trainer has changed folder."""

    sys_path: tuple[str, ...]
    cwd: str

    @classmethod
    def here(cls) -> ImportPath:
        """This process's import path: built in the parent, passed to the child."""
        cwd = os.getcwd()
        return cls(tuple(os.path.abspath(p) if p else cwd for p in sys.path), cwd)

    def apply(self) -> None:
        """In the child: the parent's entries first, in its order, then the child's own; and the parent's folder."""
        sys.path[:] = [*self.sys_path, *(p for p in sys.path if p not in self.sys_path)]
        with contextlib.suppress(OSError):  # a folder since removed: the absolute entries still find the modules
            os.chdir(self.cwd)


def become_child(import_path: ImportPath) -> None:
    """What every child of the trainer does first: ignore the stop signals, then take the trainer's import path."""
    ignore_stop_signals()
    import_path.apply()


class CallInChild:
    """``fn`` for a library to call in the child processes it starts from :func:`context` (gymnasium's AsyncVectorEnv
    calls each env function first thing in its worker): there the call first makes the process a child as fleetrl's own
    are (:func:`become_child`), then unpickles ``fn``, which may import its module. Called in this process (gymnasium
    builds one env here for its spaces), it only calls ``fn``."""

    def __init__(self, fn: Callable[..., Any]):
        import cloudpickle  # as gymnasium pickles env functions: a lambda too

        self.payload, self.import_path, self.parent = cloudpickle.dumps(fn), ImportPath.here(), os.getpid()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != self.parent:
            become_child(self.import_path)
        return pickle.loads(self.payload)(*args, **kwargs)


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
