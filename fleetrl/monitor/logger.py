"""TensorBoard logging under CleanRL's scalar names, plus the recent-episode window the display shows."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Iterable

from torch.utils.tensorboard import SummaryWriter

from fleetrl.errors import require

RECENT_EPISODES = 20
MONITOR_INTERVAL_S = 1.0  # perf/* and resources/* are logged at most this often: a TensorBoard scalar costs ~70 us


EVENT_FILE_PREFIX = "events.out.tfevents."
MAX_CLOCK_WAIT_S = 2.0


def after_the_newest_event_file(run_dir: str) -> None:
    """Wait, if need be, until the clock has passed the second in the newest event file's name in ``run_dir``.

    TensorBoard reads a folder's event files in the order of their names, which begin with the second each was opened
    in, then the host and the pid. A run resumed within the second its interrupted run opened its file (a short run
    killed at once, a restart in the same process) could sort first: TensorBoard would then read the old file's steps
    after the new one's, take them for a restart and drop points. A clock more than a couple of seconds behind the
    newest file's (another node's, after a restart elsewhere) is not waited for."""
    try:
        seconds = [int(name[len(EVENT_FILE_PREFIX):].split(".")[0]) for name in os.listdir(run_dir)
                   if name.startswith(EVENT_FILE_PREFIX)]
    except (OSError, ValueError):
        return
    wait = max(seconds, default=0) + 1 - time.time()
    if 0 < wait <= MAX_CLOCK_WAIT_S:
        time.sleep(wait)


class Logger:
    """Writes scalars to TensorBoard (rank 0 only; other ranks pass ``enabled=False``).

    ``purge_step`` is the step a resumed run continues from: TensorBoard drops anything an
    interrupted run wrote after it, so curves never hold duplicated steps.

    A write that fails (a full disk, a vanished folder) stops the logging, not the run: one warning paragraph says
    so, and training and checkpoints go on (checkpoints have their own retries and stop the run if they keep
    failing). TensorBoard's writer thread, which meets the error first, is kept from printing a traceback.
    """

    def __init__(self, run_dir: str, enabled: bool = True, purge_step: int | None = None, track: bool = False,
                 wandb_project: str = "fleetrl", wandb_entity: str | None = None, config: Any = None):
        if enabled and track:  # before the SummaryWriter exists, so wandb can mirror it
            start_wandb(run_dir, wandb_project, wandb_entity, config)
        self.run_dir = run_dir
        if enabled:
            after_the_newest_event_file(run_dir)
        self.writer = self._guarded(lambda: SummaryWriter(run_dir, purge_step=purge_step)) if enabled else None
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.episodes = 0
        self._last_monitor = float("-inf")

    def _guarded(self, write: Any) -> Any:
        """Run one write to the event file; on an OSError, stop logging with one warning and return None."""
        try:
            return write()
        except OSError as exc:
            self._stop_logging(exc)
            return None

    def _stop_logging(self, exc: OSError) -> None:
        writer, self.writer = getattr(self, "writer", None), None
        print(f"fleetrl: warning: TensorBoard logging stopped: writing the event file in {self.run_dir} failed "
              f"({exc.strerror or exc}). Training goes on without logs from here; checkpoints are still written, and if "
              f"they fail too the run stops after a few tries, naming the last good one. Free space on that disk to keep "
              f"logging in later runs (a resumed run logs again).", file=sys.stderr, flush=True)
        if writer is not None:
            try:
                writer.close()
            except OSError:  # it cannot flush either; what it held is lost, the checkpoint is not
                pass

    def hparams(self, args: Any) -> None:
        """The hyperparameters as a markdown table, as CleanRL logs them."""
        values = asdict(args) if is_dataclass(args) else dict(args)
        table = "\n".join(f"|{k}|{v}|" for k, v in values.items())
        self.text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    def text(self, name: str, value: str) -> None:
        if self.writer:
            self._guarded(lambda: self.writer.add_text(name, value))

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.writer:
            self._guarded(lambda: self.writer.add_scalar(name, value, step))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.scalar(name, value, step)

    def monitor_scalars(self, values: dict[str, float], step: int, last: bool = False) -> None:
        """Monitoring scalars (one iteration's perf/*, the latest resources/*), at most every
        ``MONITOR_INTERVAL_S`` and on the last iteration, so measuring stays well under 1% of a run."""
        now = time.monotonic()
        if last or now - self._last_monitor >= MONITOR_INTERVAL_S:
            self._last_monitor = now
            self.scalars(values, step)

    def episodes_finished(self, stats: Iterable[tuple[float, int]], step: int) -> None:
        """``charts/episodic_return`` and ``charts/episodic_length`` for each finished episode."""
        for episode_return, length in stats:
            self.episodes += 1
            self.recent_returns.append(episode_return)
            self.scalar("charts/episodic_return", episode_return, step)
            self.scalar("charts/episodic_length", length, step)

    @property
    def mean_recent_return(self) -> float | None:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def flush(self) -> None:
        if self.writer:
            self._guarded(self.writer.flush)

    def close(self) -> None:
        if self.writer:
            self._guarded(self.writer.close)
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None:
            wandb.finish()


def _quiet_event_writer_threads() -> None:
    """TensorBoard's writer thread re-raises a failed write after storing it for the main thread, which then raises it
    in ``Logger``'s next call; keep the thread from printing the same error as a traceback first."""
    previous = threading.excepthook
    if getattr(previous, "fleetrl_quiet_event_writer", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook.fleetrl_quiet_event_writer = True  # type: ignore[attr-defined]
    threading.excepthook = hook


_quiet_event_writer_threads()


def start_wandb(run_dir: str, project: str, entity: str | None, config: Any) -> None:
    """Weights & Biases, syncing the TensorBoard scalars (``WANDB_MODE=offline`` works without a network)."""
    wandb = require("wandb", "track", "--track (Weights & Biases)")
    values = asdict(config) if is_dataclass(config) else dict(config or {})
    # sync_tensorboard=True would also save copies of the event files into wandb's folder, which lies inside the run folder
    # that TensorBoard logs to: W&B then syncs its own copies as more runs and copies those again, so each scalar reached
    # W&B dozens of times. Sync the scalars only (save=False); patch once per process, as sync_tensorboard does
    if not wandb.patched["tensorboard"]:
        wandb.tensorboard.patch(save=False, root_logdir=run_dir)
    wandb.init(project=project, entity=entity, config=values, name=os.path.basename(os.path.normpath(run_dir)),
               dir=run_dir, save_code=False, resume="allow")


@dataclass
class TrainResult:
    """What a training call returns to Python callers (benchmarks, tests, the tuner)."""

    run_dir: str
    global_step: int = 0
    iteration_seconds: list[float] = field(default_factory=list)  # wall time of each iteration
    episode_returns: list[float] = field(default_factory=list)  # every finished episode, in order
