"""Slurm job arrays: the one writer of the array scripts that `fleetrl benchmark` and `fleetrl tune` leave for sbatch."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from fleetrl.errors import FleetError
from fleetrl.tools.runs import resolve_command

HEADER = """#!/bin/bash
# fleetrl {tool} as a Slurm job array: {summary}
# Submit with: sbatch {script}
{about}#SBATCH --job-name=fleetrl-{tool}
#SBATCH --array=0-{last}
#SBATCH --cpus-per-task={cpus}
#SBATCH --output={out}/logs/slurm_%A_%a.out
#SBATCH --open-mode=append
{directives}set -u
: "${{SLURM_ARRAY_TASK_ID:?not set: submit with sbatch, or set SLURM_ARRAY_TASK_ID=0..{last} to run one array task by hand}}"
"""


def shell_words(base: list[str]) -> list[str]:
    """``base`` as shell words for a compute node. A leading ``fleetrl`` runs as ``-m fleetrl`` with this interpreter:
    the nodes usually share this filesystem, and FLEETRL_PYTHON points elsewhere if not."""
    words = [shlex.quote(token) for token in resolve_command(base)]
    if base and base[0] == "fleetrl":
        words[0] = f'"${{FLEETRL_PYTHON:-{sys.executable}}}"'
    return words


def write_array_script(out: Path, tool: str, tasks: int, cpus: int, summary: str, body: str,
                       about: tuple[str, ...] = (), directives: tuple[str, ...] = ()) -> Path:
    """Write ``OUT/{tool}.slurm``, executable and readable by its owner alone (sbatch reads it as the user who submits
    it): an array of ``tasks`` tasks of ``cpus`` cores each, with their output in OUT/logs, that refuses to run outside
    an array task, then ``body``. ``about``: more comment lines for the header; ``directives``: more ``#SBATCH`` lines
    (with their comments). Refused, before anything is written, where a header line would carry a line break."""
    out = out.resolve()  # array tasks may start in another working directory
    path = out / f"{tool}.slurm"
    for text in (str(path), summary, *about, *directives):
        if len(text.splitlines()) > 1:
            raise FleetError(f"{path.name} cannot be written: a comment or #SBATCH line of it would carry {text!r}, and its line "
                             f"break would end that line and run the rest as a shell command. Take the line break out of the "
                             f"flag that gave it (--out, --study-name, --storage, the env ids).")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    header = HEADER.format(tool=tool, summary=summary, script=shlex.quote(str(path)), about="".join(f"# {line}\n" for line in about),
                           last=tasks - 1, cpus=cpus, out=out, directives="".join(f"{line}\n" for line in directives))
    # 0700 from the moment it exists, and before an earlier call's script of the same name is overwritten: a script can
    # carry what others should not read (a database's address and user, the command's flags)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o700)
        f.write(header + body)
    return path
