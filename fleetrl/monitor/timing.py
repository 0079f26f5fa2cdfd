"""Phase timing: where each iteration's wall time goes (env, inference, learn, comm, wait, other).

A phase is a reusable context manager (two ``perf_counter`` calls and a list push/pop), so timing
every env step costs far less than 1% of a run. Phases nest without double counting: entering
``comm`` inside ``learn`` pauses ``learn`` until ``comm`` ends.

Phases may run on two threads at once (``--policy-lag 1``: a sampler thread steps envs and acts while
the trainer thread learns). Nesting is tracked per thread, and each phase's time is split by thread:

* on the trainer thread (the one that created the timer and calls :meth:`PhaseTimer.lap`) the phases
  and ``other`` add up to the wall time, as in a serial run; ``wait`` is the trainer waiting for the
  sampler's next rollout;
* time on any other thread (the sampler's ``env`` and ``inference``) runs alongside, so its shares
  are of the same wall time and the sum of all shares can exceed 1. It is counted when the phase ends.
"""

from __future__ import annotations

import threading
import time

PHASES = ("env", "inference", "learn", "comm", "wait")
ALWAYS_REPORTED = ("env", "inference", "learn")  # and comm under torchrun


class _Phase:
    __slots__ = ("name", "main_total", "background_total", "_timer")

    def __init__(self, timer: "PhaseTimer", name: str):
        self.name = name
        # monotonic totals, each written by one thread only, so lap() reads them without a lock
        self.main_total = 0.0
        self.background_total = 0.0
        self._timer = timer

    def __enter__(self):
        now = time.perf_counter()
        local = self._timer._thread_state()
        stack = local.stack
        if stack:  # pause the enclosing phase
            outer = stack[-1]
            outer[0]._add(now - outer[1], local.main)
        stack.append([self, now])
        return self

    def __exit__(self, *exc):
        now = time.perf_counter()
        local = self._timer._thread_state()
        stack = local.stack
        _, start = stack.pop()
        self._add(now - start, local.main)
        if stack:  # resume the enclosing phase
            stack[-1][1] = now
        return False

    def _add(self, seconds: float, main: bool) -> None:
        if main:
            self.main_total += seconds
        else:
            self.background_total += seconds


class PhaseTimer:
    """``with timer.env: ...``; ``timer.lap()`` returns this iteration's ``perf/*`` scalars and starts the next."""

    def __init__(self, distributed: bool = False):
        self._owner = threading.get_ident()
        self._local = threading.local()
        self.env, self.inference, self.learn, self.comm, self.wait = (_Phase(self, name) for name in PHASES)
        self.phases = PHASES[:4] if distributed else ALWAYS_REPORTED  # and any other phase from its first use on
        self._last = {name: (0.0, 0.0) for name in PHASES}
        self._lap_start = time.perf_counter()
        self.last_lap_seconds = 0.0

    def _thread_state(self) -> threading.local:
        local = self._local
        if not hasattr(local, "stack"):
            local.stack, local.main = [], threading.get_ident() == self._owner
        return local

    def lap(self) -> dict[str, float]:
        now = time.perf_counter()
        wall = max(now - self._lap_start, 1e-12)
        self._lap_start = now
        self.last_lap_seconds = wall
        scalars: dict[str, float] = {}
        on_trainer = 0.0
        for name in PHASES:
            phase: _Phase = getattr(self, name)
            main, background = phase.main_total, phase.background_total
            last_main, last_background = self._last[name]
            self._last[name] = (main, background)
            elapsed = (main - last_main) + (background - last_background)
            on_trainer += main - last_main
            if name in self.phases or main + background > 0:
                scalars[f"perf/{name}_time"] = elapsed
                scalars[f"perf/{name}_share"] = elapsed / wall
        other = max(wall - on_trainer, 0.0)
        scalars["perf/other_time"] = other
        scalars["perf/other_share"] = other / wall
        return scalars
