"""Slurm job arrays: the one writer of the array scripts that `fleetrl benchmark` and `fleetrl tune` leave for sbatch."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from fleetrl.tools.processes import resolve_command

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
    """Write ``OUT/{tool}.slurm``, executable: an array of ``tasks`` tasks of ``cpus`` cores each, with their output in
    OUT/logs, that refuses to run outside an array task, then ``body``. ``about``: more comment lines for the header;
    ``directives``: more ``#SBATCH`` lines (with their comments)."""
    out = out.resolve()  # array tasks may start in another working directory
    path = out / f"{tool}.slurm"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    header = HEADER.format(tool=tool, summary=summary, script=shlex.quote(str(path)), about="".join(f"# {line}\n" for line in about),
                           last=tasks - 1, cpus=cpus, out=out, directives="".join(f"{line}\n" for line in directives))
    path.write_text(header + body)
    path.chmod(0o755)
    return path
