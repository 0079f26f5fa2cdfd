"""Child processes of the trainer (env workers, the learner), never forked from it: the trainer runs threads
(monitoring, TensorBoard's writer, OpenMP's pool), and a fork of a multi-threaded process can deadlock the child."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import BaseContext

PRELOAD = "fleetrl.forkserver_init"  # the forkserver imports it first: it and its children ignore SIGTERM and Ctrl-C


def default_start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``.

    Both are safe when the parent already runs threads; ``fork`` starts faster, but forking a multi-threaded
    process can deadlock the child.
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
