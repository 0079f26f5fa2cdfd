"""A submitted Slurm job array, followed until each task has ended: the live view shows every task's state as it changes
(PENDING, RUNNING, COMPLETED, FAILED, ...), and a failed task is reported with its exit code and the end of its log.
`fleetrl benchmark --slurm` and `fleetrl tune --slurm` submit their arrays through it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from fleetrl import files
from fleetrl.errors import FleetError
from fleetrl.parent_watch import PARENT_PID_ENV
from fleetrl.tools import slurm_jobs
from fleetrl.tools.live import Display
from fleetrl.tools.runs import describe_exit, log_tail

POLL_S = 2.0  # how often slurmctld is asked for the tasks' states; far below MinJobAge (300 s), after which it forgets them
FORGOTTEN_POLLS = 3  # a task slurmctld no longer knows on this many polls in a row ended while nobody looked
STOP_WAIT_S = 120.0  # after Ctrl-C or SIGTERM (scancel), how long to watch the tasks end: KillWait (30 s by default) and more
SILENT_CONTROLLER_S = 600.0  # a controller that answers no poll for this long is gone for now: stop following, say so
UNKNOWN = "UNKNOWN"  # the state of a task slurmctld forgot before it was seen to end


@dataclass
class Task:
    """One array task: what it runs, the file that explains its end, and its state as Slurm last reported it."""

    index: int  # SLURM_ARRAY_TASK_ID
    label: str  # what it runs, e.g. "CartPole-v1 seed 2" or "tuner worker 1"
    log: Path  # what explains its end: its run's log, or its Slurm output
    output: Path | None = None  # its Slurm output (#SBATCH --output), when that is not ``log``
    state: str = "PENDING"
    node: str = ""
    exit_code: int = 0  # the batch script's exit code
    signal: int = 0  # the signal that ended it, if one did
    reason: str = ""  # why it waits (Resources, Priority, ...), while PENDING
    restarts: int = 0  # requeues so far
    missing: int = 0  # polls in a row that slurmctld did not know it

    @property
    def ended(self) -> bool:
        return self.state in slurm_jobs.FINISHED or self.state == UNKNOWN

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    @property
    def returncode(self) -> int:
        """As :class:`subprocess.Popen` gives it: the exit code, or minus the signal that ended the task."""
        return -self.signal if self.signal else self.exit_code

    def describe(self) -> str:
        """Its state for the live view, e.g. ``PENDING (Resources)``, ``RUNNING on node2``, ``FAILED: exit code 3 on node1``."""
        if self.state == "PENDING":
            return "PENDING" + (f" ({self.reason})" if self.reason not in ("", "None") else "") + \
                (f", requeued {self.restarts}x" if self.restarts else "")
        if not self.ended or self.ok:
            return self.state + (f" on {self.node}" if self.node else "")
        return f"FAILED: {self.end()}" if self.state == "FAILED" else self.end()

    def end(self) -> str:
        """How a task that did not complete ended, e.g. ``exit code 3 on node1``, ``CANCELLED on node2 (killed by signal 15)``,
        ``CANCELLED before it started``."""
        if self.state == UNKNOWN:
            return "ended while not followed: slurmctld has forgotten it (see its log)"
        if not self.node:
            return f"{self.state} before it started"
        if self.state == "FAILED":
            return f"{describe_exit(self.returncode)} on {self.node}"
        return f"{self.state} on {self.node} ({describe_exit(self.returncode)})"

    def update(self, fields: dict[str, str] | None) -> bool:
        """Take slurmctld's record of this task (None: it does not know it now); True if its state changed."""
        before = (self.state, self.restarts)
        if fields is None:
            self.missing += 1
            if not self.ended and self.missing >= FORGOTTEN_POLLS:
                self.state = UNKNOWN
            return (self.state, self.restarts) != before
        self.missing = 0
        self.state = fields.get("JobState", self.state)
        self.node = fields.get("BatchHost", "") if fields.get("BatchHost") not in (None, "(null)") else ""
        self.reason = fields.get("Reason", "")
        self.restarts = int(fields.get("Restarts", "0") or 0)
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        self.exit_code, self.signal = int(code or 0), int(sig or 0)
        return (self.state, self.restarts) != before

    def failure_report(self, job_id: str, lines: int = 20) -> str:
        """A failed task: what it ran, how it ended, and the end of its log."""
        tail = log_tail(self.log, lines)
        return "\n".join([f"FAILED task {job_id}_{self.index} ({self.label}): {self.end()}. Log: {self.log}",
                          f"  last {len(tail)} lines of the log:", *(f"  | {line}" for line in tail)])


def submit(script: Path, indices: Sequence[int], cwd: Path, env: dict[str, str] | None = None) -> str:
    """``sbatch --array=INDICES script``; the array's job id. The tasks get this environment (sbatch's default), less the
    tool's pid: a run on a compute node cannot watch a process on this one (fleetrl/parent_watch.py)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != PARENT_PID_ENV}
    return slurm_jobs.submit(script, sbatch=[f"--array={slurm_jobs.index_list(indices)}"], cwd=cwd, env=env)


class ArrayJob:
    """Follow the array ``job_id``'s ``tasks`` until each has ended. ``on_end(task)`` is called once as each task ends;
    ``status()`` (optional) adds to the status line. Ctrl-C or SIGTERM cancels the array (scancel), then follows its
    tasks as they stop; a second one stops following at once."""

    def __init__(self, job_id: str, tasks: list[Task], display: Display, env: dict[str, str] | None = None,
                 on_end: Callable[[Task], None] | None = None, status: Callable[[], str] | None = None, poll_s: float = POLL_S):
        self.job_id, self.tasks, self.display, self.env = job_id, tasks, display, env
        self.on_end, self.status, self.poll_s = on_end, status, poll_s
        self.stopped_by: int | None = None  # the signal that cancelled the array
        self._leave = False
        self._answered = time.monotonic()  # when slurmctld last answered a poll

    def follow(self) -> list[Task]:
        in_main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
        previous = {s: signal.signal(s, self._request_stop) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        cancelled_at = None
        try:
            while True:
                if self.stopped_by is not None and cancelled_at is None:
                    self.display.event(f"stopping: cancelling the array {self.job_id} (scancel): each task's run gets SIGTERM, writes a "
                                       f"checkpoint and stops (Ctrl-C again stops following at once)")
                    slurm_jobs.cancel(self.job_id, self.env)
                    cancelled_at = time.monotonic()
                self.poll()
                if all(t.ended for t in self.tasks) or self._leave:
                    break
                if cancelled_at is not None and time.monotonic() - cancelled_at > STOP_WAIT_S:
                    self.display.event(f"the array {self.job_id}'s tasks did not all end within {STOP_WAIT_S:g} s of scancel; "
                                       f"not following them any longer (squeue -j {self.job_id})")
                    break
                time.sleep(self.poll_s)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self.tasks

    def poll(self) -> None:
        try:
            known = slurm_jobs.array_tasks(self.job_id, self.env)
        except slurm_jobs.SlurmError as exc:  # the controller busy or restarting: ask again at the next poll
            if time.monotonic() - self._answered > SILENT_CONTROLLER_S:
                raise slurm_jobs.SlurmError(f"Slurm's controller has not answered for {SILENT_CONTROLLER_S:g} s ({exc}); the array "
                                            f"{self.job_id} may still be running. Run the same command again once `squeue` answers.") from None
            self.display.event(f"could not read the array's state ({exc}); asking again")
            return
        self._answered = time.monotonic()
        for task in self.tasks:
            was_ended = task.ended
            if task.update(known.get(task.index)):
                self.display.event(f"task {self.job_id}_{task.index} ({task.label}): {task.describe()}")
                if task.ended and not was_ended and self.on_end is not None:
                    self.on_end(task)
        self.display.show(self.status_line())

    def status_line(self) -> str:
        counts = Counter(t.state for t in self.tasks)
        order = ["PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED", "FAILED", "CANCELLED"]
        shown = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (order.index(s) if s in order else len(order), s)))
        line = f"array {self.job_id}: {shown}"
        return f"{line}; {self.status()}" if self.status is not None else line

    def _request_stop(self, signum: int, frame=None) -> None:
        if self.stopped_by is not None:
            self._leave = True
            return
        self.stopped_by = signum


# ---- an output folder's array, so that the same command does not submit its runs twice ------------------------------


def record_path(out: Path, tool: str) -> Path:
    return out / f"{tool}.slurm.json"


def record(out: Path, tool: str, job_id: str, tasks: list[Task]) -> None:
    """Note the array submitted for ``out`` (written then renamed: a reader never sees half of it)."""
    files.write_atomically(record_path(out, tool), json.dumps({"job_id": job_id, "tasks": {t.index: t.label for t in tasks}}) + "\n")


def live_array(out: Path, tool: str, env: dict[str, str] | None = None) -> tuple[str, list[str]] | None:
    """The array an earlier call submitted for ``out`` if some of its tasks still wait or run: its job id and their
    labels; None otherwise. A record that is not as :func:`record` writes it is a FleetError: the array it stood for
    may still run."""
    path = record_path(out, tool)
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        saved = {"unreadable": str(exc)}
    job_id = saved.get("job_id") if isinstance(saved, dict) else None
    if not (isinstance(job_id, str) and job_id.isdigit()):
        raise FleetError(f"{path} is not a record of a Slurm array as fleetrl {tool} writes it (no job id in it): another version "
                         f"of fleetrl wrote it, or it was edited. An array of an earlier call may still run: look with `squeue --me` "
                         f"(and cancel it with scancel JOBID), then remove {path} and run the same command again.")
    known = slurm_jobs.array_tasks(job_id, env)
    labels = saved.get("tasks") if isinstance(saved.get("tasks"), dict) else {}
    live = [labels.get(str(i), f"task {i}") for i, fields in sorted(known.items())
            if fields.get("JobState") not in slurm_jobs.FINISHED]
    return (job_id, live) if live else None
