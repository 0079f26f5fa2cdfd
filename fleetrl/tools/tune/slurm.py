"""`fleetrl tune --slurm-template`: a Slurm job array whose tasks are tuner workers on one shared study."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from fleetrl.errors import FleetError
from fleetrl.tools.slurm import shell_words, write_array_script
from fleetrl.tools.text import plural
from fleetrl.tools.tune.args import TuneArgs
from fleetrl.tools.tune.space import format_value
from fleetrl.tools.tune.storage import StorageSpec
from fleetrl.tools.tune.train_command import Algo

SLURM_STAGGER_S = 2  # array tasks start this many seconds apart: workers opening one storage at once contend for it

WORKER = """mkdir -p {out_q}/logs
# workers that open the storage in the same second contend for its lock: start them a little apart
sleep $(( SLURM_ARRAY_TASK_ID * {stagger} ))
exec {command}
"""


def tuner_flags(args: TuneArgs) -> list[str]:
    """The flags of ``args`` that differ from their defaults, as `fleetrl tune` takes them; the Slurm ones left out, and
    --sampler-seed, which each worker gets its own of."""
    flags = []
    for f in dataclasses.fields(TuneArgs):
        value = getattr(args, f.name)
        if f.name.startswith("slurm_") or f.name == "sampler_seed" or value is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory() if f.default_factory is not dataclasses.MISSING else object()
        if value == default:
            continue
        flag = f"--{f.name.replace('_', '-')}"
        flags += [flag, *map(str, value)] if isinstance(value, list) else [flag if value else f"--no-{f.name.replace('_', '-')}"] \
            if isinstance(value, bool) else [flag, format_value(value)]
    return flags


def write_slurm_script(args: TuneArgs, algo: Algo, spec: StorageSpec, study_name: str, out: Path) -> Path:
    if spec.kind == "sqlite":
        raise FleetError(f"--slurm-template with an SQLite storage ({spec.shown}): array tasks run on several nodes, and SQLite breaks on a "
                         f"network filesystem. Use a journal file on the shared filesystem (--storage {out.resolve() / 'study.log'}) or PostgreSQL.")
    out = out.resolve()  # array tasks start elsewhere: every path the workers get is absolute
    storage = str(spec.path.resolve()) if spec.kind == "journal" else spec.url
    chosen = dataclasses.replace(args, out=str(out), search=str(Path(args.search).resolve()), storage=storage, study_name=study_name)
    words = shell_words(["fleetrl", "tune", *tuner_flags(chosen)])
    if args.sampler_seed is not None:  # each worker its own sampler seed, or they would all propose the same trials
        words += ["--sampler-seed", f"$(( {args.sampler_seed} + SLURM_ARRAY_TASK_ID ))"]
    command = [*words, "--", *(shlex.quote(t) for t in algo.base)]
    about = (f"Each task is a `fleetrl tune` with --parallel {args.parallel}; together they run --trials {args.trials} trials (a global total).",
             "A task stopped by Slurm fails and queues again its running trials; submitting the array again resumes the study.",
             f"Watch it with: optuna-dashboard {shlex.quote(spec.shown)}")
    path = write_array_script(out, "tune", args.slurm_workers, args.slurm_cpus_per_task,
                              f"{args.slurm_workers} tuner workers on the study {shlex.quote(study_name)} in {spec.shown}.",
                              WORKER.format(out_q=shlex.quote(str(out)), stagger=SLURM_STAGGER_S, command=" ".join(command)), about)
    print(f"wrote {path}: a Slurm job array of {plural(args.slurm_workers, 'tuner worker')}, each with --parallel {args.parallel} "
          f"on {args.slurm_cpus_per_task} CPU cores, sharing the study {study_name!r} in {spec.shown}.")
    print(f"submit it with: sbatch {path}")
    print(f"watch it with: optuna-dashboard {shlex.quote(spec.shown)}")
    return path
