"""Phase timing: where each iteration's wall time goes (env, inference, learn, comm, other).

A phase is a reusable context manager (two ``perf_counter`` calls, well under a microsecond),
so timing every env step costs far less than 1% of a run. Phases nest without double counting:
entering ``comm`` inside ``learn`` pauses ``learn`` until ``comm`` ends, so the phases and
``other`` add up to the wall time.
"""

from __future__ import annotations

import time

PHASES = ("env", "inference", "learn", "comm")


class _Phase:
    __slots__ = ("elapsed", "_t0", "_outer", "_timer")

    def __init__(self, timer: "PhaseTimer"):
        self.elapsed = 0.0
        self._t0 = 0.0
        self._outer: _Phase | None = None
        self._timer = timer

    def __enter__(self):
        now = time.perf_counter()
        outer = self._timer._active
        if outer is not None:  # pause the enclosing phase
            outer.elapsed += now - outer._t0
        self._outer, self._timer._active, self._t0 = outer, self, now
        return self

    def __exit__(self, *exc):
        now = time.perf_counter()
        self.elapsed += now - self._t0
        outer, self._outer = self._outer, None
        if outer is not None:  # resume the enclosing phase
            outer._t0 = now
        self._timer._active = outer
        return False


class PhaseTimer:
    """``with timer.env: ...``; ``timer.lap()`` returns this iteration's ``perf/*`` scalars and starts the next."""

    def __init__(self, distributed: bool = False):
        self._active: _Phase | None = None
        self.env, self.inference, self.learn, self.comm = (_Phase(self) for _ in range(4))
        self.phases = PHASES if distributed else tuple(p for p in PHASES if p != "comm")
        self._lap_start = time.perf_counter()
        self.last_lap_seconds = 0.0

    def lap(self) -> dict[str, float]:
        now = time.perf_counter()
        wall = max(now - self._lap_start, 1e-12)
        self._lap_start = now
        self.last_lap_seconds = wall
        scalars: dict[str, float] = {}
        accounted = 0.0
        for name in PHASES:
            phase: _Phase = getattr(self, name)
            if name in self.phases:
                accounted += phase.elapsed
                scalars[f"perf/{name}_time"] = phase.elapsed
                scalars[f"perf/{name}_share"] = phase.elapsed / wall
            phase.elapsed = 0.0
        other = max(wall - accounted, 0.0)
        scalars["perf/other_time"] = other
        scalars["perf/other_share"] = other / wall
        return scalars
