"""The tools' live view: event lines, with a status line under them that rich redraws on a terminal; without one
(a log, CI) the status is a plain line, printed when it changes and at least every PLAIN_STATUS_S."""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime

PLAIN_STATUS_S = 30.0  # without a terminal, the status line is printed when it changes, and at least this often


class Display:
    """Timestamped event lines, and one status line under them (rich on a terminal; plain lines otherwise)."""

    def __init__(self, enabled: bool = True):
        self.interactive = enabled and sys.stdout.isatty()
        self._lock = threading.Lock()
        self._last_text, self._last_print = "", 0.0
        self._live = None
        if self.interactive:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(), refresh_per_second=4, transient=True)
            self._live.start()

    def event(self, message: str) -> None:
        line = f"[{datetime.now():%H:%M:%S}] {message}"
        with self._lock:
            if self._live is not None:
                self._live.console.print(line, highlight=False, markup=False)
            else:
                print(line, flush=True)

    def show(self, text: str, force: bool = False) -> None:
        """Set the status line to ``text``."""
        with self._lock:
            if self._live is not None:
                from rich.text import Text

                self._live.update(Text(text, style="bold"))
            elif force or text != self._last_text or time.monotonic() - self._last_print >= PLAIN_STATUS_S:
                print(text, flush=True)
                self._last_print = time.monotonic()
            self._last_text = text

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if self._last_text:
                print(self._last_text, flush=True)
