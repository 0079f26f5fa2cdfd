"""`fleetrl tune` on Slurm: a job array whose tasks are tuner workers on one shared study, written for sbatch
(--slurm-template) or submitted and followed until every task has ended (--slurm)."""

from __future__ import annotations

import dataclasses
import ipaddress
import shlex
from pathlib import Path

from fleetrl.errors import FleetError
from fleetrl.tools import slurm_array, slurm_jobs
from fleetrl.tools.slurm import shell_words, write_array_script
from fleetrl.tools.slurm_array import ArrayJob, Task
from fleetrl.tools.text import plural
from fleetrl.tools.tune.args import TuneArgs
from fleetrl.tools.tune.report import Display, status_text
from fleetrl.tools.tune.space import format_value
from fleetrl.tools.tune.storage import StorageSpec
from fleetrl.tools.tune.study import study_counts
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
        if f.name.startswith("slurm") or f.name == "sampler_seed" or value is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory() if f.default_factory is not dataclasses.MISSING else object()
        if value == default:
            continue
        flag = f"--{f.name.replace('_', '-')}"
        flags += [flag, *map(str, value)] if isinstance(value, list) else [flag if value else f"--no-{f.name.replace('_', '-')}"] \
            if isinstance(value, bool) else [flag, format_value(value)]
    return flags


def check_array_storage(spec: StorageSpec, out: Path, flag: str) -> None:
    """Refuse a storage the array's tasks, on other hosts, cannot share (SQLite, or a database server on loopback), and
    a URL with a password, which the script and every task's command line would carry (``flag``: --slurm or
    --slurm-template, for the message)."""
    if spec.kind == "sqlite":
        raise FleetError(f"A Slurm array with an SQLite storage ({spec.shown}): array tasks run on several nodes, and SQLite breaks on a "
                         f"network filesystem. Use a journal file on the shared filesystem (--storage {out.resolve() / 'study.log'}) or PostgreSQL.")
    if spec.kind == "rdb":
        from sqlalchemy.engine import make_url

        url = make_url(spec.url)
        if spec.has_password:  # refused, not stripped: a task without the password would fail on every node later
            raise FleetError(f"--storage {spec.shown} carries a password, and {flag} would write it into {out.resolve() / 'tune.slurm'} "
                             f"and every array task's command line, where others can read it. Leave it out of the URL (--storage "
                             f"{spec.without_password}) and give it as PostgreSQL's client "
                             f"reads it: PGPASSWORD in the environment sbatch runs in (sbatch passes it on to the tasks), or a "
                             f"line HOST:PORT:DATABASE:USER:PASSWORD in ~/.pgpass (chmod 600) on the nodes.")
        host = url.host or "localhost"
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if loopback:
            raise FleetError(f"A Slurm array with the storage {spec.shown}: {host} is loopback, and on each node that is the node itself, "
                             f"not this machine. Give the database server's address on the cluster's network (and let the server listen "
                             f"there: listen_addresses in postgresql.conf, and a host line in pg_hba.conf for the nodes).")


def write_slurm_script(args: TuneArgs, algo: Algo, spec: StorageSpec, study_name: str, out: Path) -> Path:
    """OUT/tune.slurm: --slurm-workers array tasks, each a `fleetrl tune` worker on the study, with its own sampler seed."""
    check_array_storage(spec, out, "--slurm-template" if args.slurm_template else "--slurm")
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
    return write_array_script(out, "tune", args.slurm_workers, args.slurm_cpus_per_task,
                              f"{args.slurm_workers} tuner workers on the study {shlex.quote(study_name)} in {spec.shown}.",
                              WORKER.format(out_q=shlex.quote(str(out)), stagger=SLURM_STAGGER_S, command=" ".join(command)), about)


def write_template(args: TuneArgs, algo: Algo, spec: StorageSpec, study_name: str, out: Path) -> Path:
    """--slurm-template: the script, and how to submit and watch it."""
    path = write_slurm_script(args, algo, spec, study_name, out)
    print(f"wrote {path}: a Slurm job array of {plural(args.slurm_workers, 'tuner worker')}, each with --parallel {args.parallel} "
          f"on {args.slurm_cpus_per_task} CPU cores, sharing the study {study_name!r} in {spec.shown}.")
    print(f"submit it with: sbatch {path}")
    print(f"watch it with: optuna-dashboard {shlex.quote(spec.shown)}")
    return path


class SlurmTasksFailed(FleetError):
    """Some tuner tasks of the array failed; the study holds what they and the others recorded."""

    exit_code = 1

    def __init__(self, job: ArrayJob):
        failed = [t for t in job.tasks if not t.ok]
        super().__init__(f"{len(failed)} of {len(job.tasks)} tuner tasks of the Slurm array {job.job_id} failed "
                         f"({'; '.join(f'task {t.index}: {t.end()}' for t in failed[:3])}{'; ...' if len(failed) > 3 else ''}); "
                         f"their output: {', '.join(str(t.log) for t in failed[:3])}. The study keeps what every task recorded: fix "
                         f"the cause and run the same command to go on with it.")


def check_slurm(spec: StorageSpec, out: Path) -> None:
    """--slurm: refuse before the study is touched where the array's tasks could not share it, or Slurm does not answer."""
    check_array_storage(spec, out, "--slurm")
    slurm_jobs.check_reachable(instead="Without Slurm, leave out --slurm to tune here, or write the script with --slurm-template.")


def run_array(args: TuneArgs, algo: Algo, spec: StorageSpec, study, out: Path, display: Display) -> ArrayJob:
    """--slurm: submit the tuner workers as one job array and follow it until each task has ended, with the study's counts
    in the status line. A failed task is shown with its exit code and the end of its output as it ends. Ctrl-C or
    SIGTERM cancel the array (the job's ``stopped_by``)."""
    script = write_slurm_script(args, algo, spec, study.study_name, out)
    indices = list(range(args.slurm_workers))
    job_id = slurm_array.submit(script, indices, cwd=out.resolve())
    logs = out.resolve() / "logs"
    tasks = [Task(i, f"tuner worker {i}", logs / f"slurm_{job_id}_{i}.out") for i in indices]
    display.event(f"submitted {script} as the Slurm array {job_id}: {plural(len(tasks), 'tuner worker')}, each with --parallel "
                  f"{args.parallel} on {plural(args.slurm_cpus_per_task, 'CPU core')}; their output in {logs}; Ctrl-C cancels it")

    def trials() -> str:
        try:
            return status_text(study_counts(study.get_trials(deepcopy=False)), args.trials)
        except Exception:  # noqa: BLE001 - the status line is a view: a storage hiccup must not stop the following
            return "trials: (the storage did not answer)"

    def ended(task: Task) -> None:
        if not task.ok:
            display.event(task.failure_report(job_id, lines=12))

    job = ArrayJob(job_id, tasks, display, on_end=ended, status=trials)
    job.follow()
    return job
