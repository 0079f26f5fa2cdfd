"""Slurm's commands from Python: check that Slurm answers, submit a batch script, read a job's (or an array's tasks')
state, wait until it gets somewhere (sbatch, scontrol). For any cluster: the one ``SLURM_CONF`` in ``env`` names, else
Slurm's default configuration."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from fleetrl.errors import FleetError

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
POLL_S = 0.25  # how often wait_for_job asks slurmctld
PING_TIMEOUT_S = 60  # scontrol ping retries an unreachable controller for MessageTimeout (10 s) a try


class SlurmError(FleetError):
    """A Slurm command failed, or a job did not get where it was awaited; the message carries Slurm's words or the
    job's output."""


def command(*argv: str, env: dict[str, str] | None = None, timeout: float = 30, check: bool = True) -> str:
    """Run one of Slurm's commands (``squeue``, ``scontrol``, ``scancel``, ...); its stdout."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout:g} s: Slurm's controller is slow or unreachable.") from None
    except OSError as exc:
        raise SlurmError(f"`{argv[0]}` cannot run here ({exc.strerror or exc}): is Slurm installed on this machine?") from None
    if check and proc.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed (exit code {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def submit(script: str | os.PathLike, *args: str, sbatch: Sequence[str] = (), cwd: str | os.PathLike | None = None,
           env: dict[str, str] | None = None) -> str:
    """``sbatch --parsable [sbatch] script [args]`` (the job gets ``env``, by sbatch's default export); the job id."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", *sbatch, str(script), *args], capture_output=True, text=True, timeout=60,
                              cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"sbatch {script} did not answer within 60 s: Slurm's controller is slow or unreachable.") from None
    if proc.returncode != 0:
        raise SlurmError(f"sbatch {script} was refused (exit code {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"


def check_reachable(env: dict[str, str] | None = None, instead: str = "") -> None:
    """Refuse, in one paragraph, where jobs cannot be submitted: no ``sbatch`` on PATH, or no controller answering
    ``scontrol ping``. ``instead``: what the user can do without Slurm, added to the message."""
    missing = [tool for tool in ("sbatch", "scontrol", "scancel") if shutil.which(tool, path=(env or os.environ).get("PATH")) is None]
    if missing:
        raise SlurmError(f"No Slurm here: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH. Run this on a "
                         f"machine that submits to your cluster (a login node), or install Slurm's client commands "
                         f"(Debian/Ubuntu: apt-get install slurm-wlm).{' ' + instead if instead else ''}")
    conf = (env or os.environ).get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # Slurm's commands would retry it for a minute before they say so
        raise SlurmError(f"SLURM_CONF={conf}, which is not a file: point it at your cluster's slurm.conf, or unset it to use "
                         f"/etc/slurm/slurm.conf.{' ' + instead if instead else ''}")
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_TIMEOUT_S, env=env)
        said = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if line.strip("* "))  # not its banner of stars
    except subprocess.TimeoutExpired:
        said = f"no answer within {PING_TIMEOUT_S:g} s"
    if " is UP" not in said:
        raise SlurmError(f"Slurm's controller does not answer here (`scontrol ping`: {' '.join(said.split())[:300] or 'no output'}). "
                         f"Check that the cluster is up and that this machine's Slurm configuration "
                         f"({f'SLURM_CONF={conf}' if conf else '/etc/slurm/slurm.conf, or SLURM_CONF'}) names its controller."
                         f"{' ' + instead if instead else ''}")


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


def array_tasks(job_id: str, env: dict[str, str] | None = None) -> dict[int, dict[str, str]]:
    """Each task of the job array ``job_id`` that slurmctld still knows, by index: :func:`job`'s fields for it. Pending
    tasks share one record (``ArrayTaskId=2-3``), expanded here. Empty once the array is forgotten (MinJobAge after its
    end), or if there never was one."""
    try:
        text = command("scontrol", "show", "job", "--oneliner", str(job_id), env=env)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return {}
        raise
    tasks = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", line))
        if fields.get("ArrayJobId") == str(job_id) and fields.get("ArrayTaskId"):
            for index in expand_indices(fields["ArrayTaskId"]):
                tasks[index] = fields
    return tasks


def expand_indices(spec: str) -> list[int]:
    """Slurm's array index list, e.g. ``0-3``, ``1,4-5``, ``0-9:3``, ``0-7%2`` (the ``%`` throttle ignored), as indices."""
    indices = []
    for part in spec.split("%")[0].split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        indices += range(int(first), int(last or first) + 1, int(step or 1))
    return indices


def index_list(indices: Sequence[int]) -> str:
    """Indices in Slurm's ``--array`` form: [0, 1, 2, 5] -> ``0-2,5``."""
    parts, ordered = [], sorted(set(indices))
    start = prev = None
    for i in [*ordered, None]:
        if start is not None and (i is None or i != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(parts)


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """``scancel JOB``: Slurm sends SIGTERM to every task's processes, then SIGKILL after KillWait; a finished job is fine."""
    command("scancel", str(job_id), env=env, check=False)
