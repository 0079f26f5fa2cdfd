"""Env calls under a deadline: a probe (or a build only for an env's spaces) runs in a daemon thread of its own, each env
call it makes through a :class:`Watch` gets ``--env-timeout`` seconds (a construction at least as long as an env worker's
build), and the caller stops waiting when one overruns; the hung thread is left with its env until the process exits (a
thread cannot be killed). Below the registry, which bounds its own builds with it
(fleetrl/envs/registry.py's ``read_built``); fleetrl/envs/probe.py's start-up probes are built on it."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

from fleetrl.errors import FleetError

WATCH_POLL_S = 0.05  # how often the caller checks the probe's calls against their deadlines

T = TypeVar("T")


class ProbeHung(FleetError):
    """A call of the env in a probe gave no answer within its time (an env that hangs)."""

    def __init__(self, what: str, timeout: float):
        super().__init__(f"its {what} gave no answer within {timeout:g} s")
        self.what, self.timeout = what, timeout


class Watch:
    """The deadlines of the env calls that a probe's threads are in: the probe makes each call through :meth:`call`, and
    :func:`run_bounded` gives up on the probe when one of them is overdue."""

    def __init__(self, env_timeout: float | None):
        from fleetrl.envs.shm.supervisor import MIN_BUILD_TIMEOUT_S  # the time an env worker gets to build its envs

        self.env_timeout = env_timeout or None  # 0 or None: wait forever, as --env-timeout 0 asks
        self.build_timeout = max(env_timeout, MIN_BUILD_TIMEOUT_S) if env_timeout else None
        self._calls: dict[int, tuple[float, str, float]] = {}  # thread ident -> (deadline, what, timeout)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, an env call named ``what`` ("construction", "reset", "step"), under its deadline."""
        timeout = self.build_timeout if what == "construction" else self.env_timeout
        if timeout is None:
            return fn(*args, **kwargs)
        me = threading.get_ident()
        self._calls[me] = (time.monotonic() + timeout, what, timeout)
        try:
            return fn(*args, **kwargs)
        finally:
            self._calls.pop(me, None)

    def overdue(self) -> ProbeHung | None:
        now = time.monotonic()
        for deadline, what, timeout in list(self._calls.values()):
            if now > deadline:
                return ProbeHung(what, timeout)
        return None


def run_bounded(probe: Callable[[Watch], T], env_timeout: float | None, name: str = "fleetrl-env-probe") -> T:
    """``probe(watch)`` in a daemon thread: its result or its error, or :class:`ProbeHung` as soon as one of the env calls
    it makes through ``watch`` is overdue (the thread is then left behind, see the module's docstring)."""
    watch, outcome = Watch(env_timeout), {}

    def target() -> None:
        try:
            outcome["result"] = probe(watch)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(WATCH_POLL_S)
        hung = watch.overdue()
        if hung is not None and thread.is_alive():
            raise hung
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
