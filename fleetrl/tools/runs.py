"""The runs the tools start (`fleetrl benchmark`, `fleetrl tune`): their commands and environment, a process group each,
stopping them, and what their exits and logs say."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

from fleetrl import config
from fleetrl.parent_watch import PARENT_PID_ENV

STOP_GRACE_S = 10.0  # how long stopped runs get to checkpoint and exit on their own before they are killed
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024  # a long log's end is all a tail needs


# ---- the command and its environment ------------------------------------------------------------


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """A tool's own flags, and the command it runs: what follows the first ``--``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def resolve_command(base: list[str]) -> list[str]:
    """A leading ``fleetrl`` runs as ``python -m fleetrl`` with this interpreter, so it works from a venv
    whose scripts are not on PATH; any other command runs as given."""
    if base and base[0] == "fleetrl":
        return [sys.executable, "-m", "fleetrl", *base[1:]]
    return list(base)


def train_args(base: list[str]) -> list[str] | None:
    """What follows ``fleetrl train`` (or ``python -m fleetrl train``) in ``base``, the algorithm and its flags; None when
    ``base`` is another command."""
    if base[:2] == ["fleetrl", "train"]:
        return base[2:]
    if base[1:4] == ["-m", "fleetrl", "train"]:
        return base[4:]
    return None


def with_absolute_algo_file(base: list[str]) -> list[str]:
    """``base`` with the user's algorithm file of a ``fleetrl train ./my_algo.py ...`` command made absolute: a run starts in
    its own folder (a Slurm task in the output folder, on another node of a shared file system), not in this one."""
    rest = train_args(base)
    if not rest or not rest[0].endswith(".py") or not Path(rest[0]).expanduser().is_file():
        return list(base)
    at = len(base) - len(rest)
    return [*base[:at], str(Path(rest[0]).expanduser().resolve()), *base[at + 1:]]


def has_flag(command: list[str], flag: str) -> bool:
    return any(token == flag or token.startswith(flag + "=") for token in command)


def run_name(env_id: str, seed: int) -> str:
    """A run's folder and log name: ``{env}__{seed}``, with '/' and ':' made path-safe."""
    return f"{config.path_safe(env_id)}__{seed}"


def child_env(threads: int) -> dict[str, str]:
    """A run's environment: its BLAS/OpenMP pools sized to its share of the cores (N runs that each take every core slow
    each other down several times over), and this process's pid, so that a fleetrl run stops when its tool is gone."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), PARENT_PID_ENV: str(os.getpid())}


# ---- starting and stopping ------------------------------------------------------------------------


def start_run(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start ``command`` with its output in ``log_path`` (which opens with the command, to rerun it by hand), in a session
    of its own: Ctrl-C reaches the tool only, which stops the run's whole group, trainer and env workers together.
    Raises OSError when the command cannot start."""
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        # no preexec_fn: the tools start runs from worker threads, where Python documents it as unsafe
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal the process group ``proc`` leads (every run leads one: :func:`start_run`); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def stop_runs(procs: Iterable[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to each live run's process group (a trainer checkpoints and exits), SIGKILL to the groups still alive after
    ``grace``; a run that did not end cleanly also gets its group killed, in case it left env workers behind."""
    procs = list(procs)
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
    for proc in procs:
        if proc.returncode not in (None, 0):
            signal_group(proc, signal.SIGKILL)


# ---- how a run ended --------------------------------------------------------------------------------


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    # a live progress bar rewrites its line with '\r'; keep the last state of each line
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()[-lines:]]
