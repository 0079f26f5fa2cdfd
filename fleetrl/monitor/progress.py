"""Progress display: a rich live bar on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PLAIN_INTERVAL_S = 5.0


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True, plain_interval: float = PLAIN_INTERVAL_S):
        self.total = total_steps
        self.enabled = enabled
        self.interactive = enabled and sys.stdout.isatty()
        self.plain_interval = plain_interval
        self._last_print = 0.0
        self._start_time = time.perf_counter()
        self._start_step = start_step
        self._bar = None
        if self.interactive:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,}/{task.total:,} steps"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(),
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start_step, info="")
            self._bar.start()

    def update(self, step: int, sps: float, mean_return: float | None, extra: str = "") -> None:
        if not self.enabled:
            return
        ret = "-" if mean_return is None else f"{mean_return:.1f}"
        info = f"SPS {sps:,.0f}  return {ret}" + (f"  {extra}" if extra else "")
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
            return
        now = time.perf_counter()
        if now - self._last_print >= self.plain_interval or step >= self.total:
            self._last_print = now
            done = max(step - self._start_step, 1)
            eta = (self.total - step) * (now - self._start_time) / done
            print(f"step {step:,}/{self.total:,} ({100 * step / self.total:.0f}%)  {info}  ETA {eta:.0f}s", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
