"""A benchmark's runs, wherever they run (this machine's pool or a Slurm array): their names and commands, the status
file each writes as it ends (so a rerun skips it), their results, and how a result is shown."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from fleetrl.errors import FleetError
from fleetrl.files import write_atomically
from fleetrl.tools.returns import final_return
from fleetrl.tools.runs import describe_exit, has_flag, log_tail, resolve_command, run_name, train_args
from fleetrl.tools.slurm_array import Task


@dataclass(frozen=True)
class Run:
    env_id: str
    seed: int

    @property
    def name(self) -> str:
        """The run's folder, log and status name."""
        return run_name(self.env_id, self.seed)


@dataclass
class Result:
    run: Run
    returncode: int
    wall_s: float
    skipped: bool = False  # finished in an earlier call with the same --out
    final_return: float | None = None
    task: Task | None = None  # the Slurm array task that ran it (--slurm)
    job_id: str = ""  # and its array

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and (self.task is None or self.task.ok)

    def how_it_ended(self) -> str:
        """e.g. ``exit code 2``, ``killed by SIGKILL``; under Slurm with the node and the task, or the task's end when the
        run never reported one (cancelled, timed out, a node failure)."""
        if self.task is None:
            return describe_exit(self.returncode)
        ended = describe_exit(self.returncode) + (f" on {self.task.node}" if self.task.node else "") if self.returncode else self.task.end()
        return f"{ended} (Slurm task {self.job_id}_{self.task.index})"


def log_path(out: Path, run: Run) -> Path:
    return out / "logs" / f"{run.name}.log"


# ---- the command each run executes ------------------------------------------------------------


def train_extras(base: list[str], threads: str) -> list[str]:
    """Flags added to a `fleetrl train` command: a thread count that fits the pool, and `--resume auto`
    so a run interrupted earlier continues from its newest checkpoint instead of mixing two curves."""
    if train_args(base) is None:
        return []
    extras = [] if has_flag(base, "--torch-threads") else ["--torch-threads", threads]
    return extras + ([] if has_flag(base, "--resume") else ["--resume", "auto"])


def run_command(base: list[str], run: Run, out: Path, threads: int) -> list[str]:
    return [*resolve_command(base), *train_extras(base, str(threads)), "--env-id", run.env_id, "--seed", str(run.seed), "--run-dir", str(out / run.name)]


# ---- per-run status, so a rerun skips what finished ---------------------------------------------


def status_path(out: Path, run: Run) -> Path:
    return out / "status" / f"{run.name}.json"


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing, or cut short by a crash: the run is simply run again


def write_status(path: Path, status: dict) -> None:
    """Written through a temporary file: a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(status) + "\n")


def finished_runs(runs: list[Run], out: Path, base: list[str]) -> set[Run]:
    """The runs an earlier call with this --out finished; refuses an --out that holds another command's runs."""
    done = set()
    for run in runs:
        status = read_status(status_path(out, run))
        if not status or not status.get("ok"):
            continue
        if status.get("command") != base:
            raise FleetError(
                f"{out} already holds a finished run ({run.name}) of another command: {shlex.join(status.get('command') or [])!r}, "
                f"not {shlex.join(base)!r}. Use a new --out, or delete {status_path(out, run)} to run it again."
            )
        done.add(run)
    return done


def skipped_result(run: Run, out: Path) -> Result:
    status = read_status(status_path(out, run)) or {}
    return Result(run, 0, float(status.get("wall_s", float("nan"))), skipped=True, final_return=final_return(out / run.name))


# ---- how a result is shown ----------------------------------------------------------------------


def progress_line(result: Result, out: Path) -> str:
    run = result.run
    if result.ok:
        shown = "no episodes logged" if result.final_return is None else f"final return {result.final_return:.2f}"
        return f"ok      {run.env_id} seed {run.seed}: {shown} ({result.wall_s:.1f}s)"
    return f"FAILED  {run.env_id} seed {run.seed}: {result.how_it_ended()}{after(result)}; log: {explaining_log(result, out)}"


def after(result: Result) -> str:
    """`` after 3.2s``; nothing for a Slurm run that never said how long it ran (cancelled before it started, say)."""
    return f" after {result.wall_s:.1f}s" if math.isfinite(result.wall_s) else ""


def explaining_log(result: Result, out: Path) -> Path:
    """The run's log; under Slurm, the task's own output when the run left no log (the task failed before it started)."""
    path = log_path(out, result.run)
    if result.task is not None and result.task.output is not None and not log_tail(path):
        return result.task.output
    return path


def failure_report(result: Result, out: Path) -> str:
    run, path = result.run, explaining_log(result, out)
    tail = log_tail(path)
    lines = [f"FAILED {run.env_id} seed {run.seed}: {result.how_it_ended()}{after(result)}. Log: {path}"]
    lines.append(f"  last {len(tail)} lines of the log:")
    return "\n".join(lines + [f"  | {line}" for line in tail])
