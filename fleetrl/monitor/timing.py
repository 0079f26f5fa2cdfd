"""Phase timing: where each iteration's wall time goes (env, inference, learn, comm, other).

A phase is a reusable context manager (two ``perf_counter`` calls, well under a microsecond),
so timing every env step costs far less than 1% of a run.
"""

from __future__ import annotations

import time

PHASES = ("env", "inference", "learn", "comm")


class _Phase:
    __slots__ = ("elapsed", "_t0")

    def __init__(self):
        self.elapsed = 0.0
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed += time.perf_counter() - self._t0
        return False


class PhaseTimer:
    """``with timer.env: ...``; ``timer.lap()`` returns this iteration's ``perf/*`` scalars and starts the next."""

    def __init__(self, distributed: bool = False):
        self.env, self.inference, self.learn, self.comm = _Phase(), _Phase(), _Phase(), _Phase()
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
        for name in self.phases:
            phase: _Phase = getattr(self, name)
            accounted += phase.elapsed
            scalars[f"perf/{name}_time"] = phase.elapsed
            scalars[f"perf/{name}_share"] = phase.elapsed / wall
            phase.elapsed = 0.0
        other = max(wall - accounted, 0.0)
        scalars["perf/other_time"] = other
        scalars["perf/other_share"] = other / wall
        return scalars
