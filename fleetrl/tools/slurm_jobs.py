"""Slurm's commands from Python: submit a batch script, read a job's state, wait until it gets somewhere (sbatch,
scontrol). For any cluster: the one ``SLURM_CONF`` in ``env`` names, else Slurm's default configuration."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from fleetrl.errors import FleetError

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
POLL_S = 0.25  # how often wait_for_job asks slurmctld


class SlurmError(FleetError):
    """A Slurm command failed, or a job did not get where it was awaited; the message carries Slurm's words or the
    job's output."""


def command(*argv: str, env: dict[str, str] | None = None, timeout: float = 30, check: bool = True) -> str:
    """Run one of Slurm's commands (``squeue``, ``scontrol``, ``scancel``, ...); its stdout."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed (exit code {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def submit(script: str | os.PathLike, *args: str, sbatch: Sequence[str] = (), cwd: str | os.PathLike | None = None,
           env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable [sbatch] script [args]`` (the job gets ``env``, by sbatch's default export); the job id."""
    proc = subprocess.run(["sbatch", "--parsable", *sbatch, str(script), *args], capture_output=True, text=True, timeout=30,
                          cwd=cwd, env=env)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch {script} was refused (exit code {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"


def job(job_id: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``scontrol show job`` as a dict: ``JobState``, ``Reason``, ``ExitCode``, ``Restarts``, ``NodeList``, ``StdOut``, ...
    A finished job stays visible for the cluster's MinJobAge (300 s by default); ``sacct`` needs accounting."""
    text = command("scontrol", "show", "job", "--oneliner", str(job_id), env=env)
    return dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", text))


def wait_for_job(job_id: str, states: Sequence[str] = FINISHED, timeout: float = 300,
                 until: Callable[[dict[str, str]], bool] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """Poll the job until its ``JobState`` is one of ``states`` (default: any finished state) and ``until(job)``, if
    given, holds; returns :func:`job`'s fields. After ``timeout`` s: a SlurmError with its state and output."""
    deadline = time.monotonic() + timeout
    while True:
        info = job(job_id, env)
        if info.get("JobState") in states and (until is None or until(info)):
            return info
        if time.monotonic() > deadline:
            raise SlurmError(f"Job {job_id} did not reach {'/'.join(states)} within {timeout:g} s: it is {info.get('JobState')} "
                             f"({info.get('Reason')}). The end of its output:\n{job_output(info)}")
        time.sleep(POLL_S)


def job_output(info: dict[str, str], tail: int = 4000) -> str:
    """The last ``tail`` characters of the job's stdout file (from :func:`job`'s ``StdOut``)."""
    path = info.get("StdOut", "")
    try:
        return Path(path).read_text(errors="replace")[-tail:]
    except OSError:
        return f"(no output file at {path!r})"
