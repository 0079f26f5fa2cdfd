"""`fleetrl tune` from its parsed flags to its report: check the input, open the study, run the tuner here or as a
Slurm array (or only write the array's script), report, and end with the right exit code."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from fleetrl.errors import FleetError, require
from fleetrl.tools.text import plural
from fleetrl.tools.tune.args import TuneArgs, check_args
from fleetrl.tools.tune.report import Display, report
from fleetrl.tools.tune.score import parse_targets
from fleetrl.tools.tune.slurm import SlurmTasksFailed, check_slurm, run_array, write_template
from fleetrl.tools.tune.space import load_search_space
from fleetrl.tools.tune.storage import open_storage, parse_storage
from fleetrl.tools.tune.study import counted, make_pruner, make_sampler, open_study, quiet_optuna, study_settings
from fleetrl.tools.tune.train_command import parse_command, resolved_args
from fleetrl.tools.tune.tuner import Tuner

DEFAULT_REPORTS = 10  # without --report-every, a trial reports this many times over its run


class TuneFailed(FleetError):
    """No trial of the study completed."""

    exit_code = 1


class TuneStopped(FleetError):
    """Ctrl-C or SIGTERM: the running trials were stopped and recorded; the same command resumes the study."""


def run_tune(args: TuneArgs, base: list[str]) -> None:
    """Run the study here or on Slurm (or, with --slurm-template, only script it); raises TuneFailed if no trial of it
    completed."""
    check_args(args)
    algo = parse_command(base)
    require("optuna", "tune", "`fleetrl tune`")
    params = load_search_space(args.search, algo)
    targets = parse_targets(args.target_scores, list(dict.fromkeys(args.env_ids)))
    total = max(resolved_args(algo, env_id).total_timesteps for env_id in dict.fromkeys(args.env_ids))
    report_every = args.report_every or max(1, total // DEFAULT_REPORTS)
    if report_every > total:
        raise FleetError(f"--report-every {report_every} is past --total-timesteps {total}: no report would happen. Give at most {total}.")
    study_name = args.study_name or f"{algo.module.__name__.rsplit('.', 1)[-1]}-{'+'.join(dict.fromkeys(args.env_ids))}"
    out = Path(args.out or os.path.join("runs", f"tune_{study_name.replace('/', '-').replace(':', '-')}"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FleetError(f"Cannot create the output folder {out} ({exc.strerror or exc}). Give another --out.") from None
    spec = parse_storage(args.storage or str(out / "study.log"))
    if args.slurm_template:
        write_template(args, algo, spec, study_name, out)
        return
    if args.slurm:
        check_slurm(spec, out)
    elif spec.has_password:  # the Slurm paths refuse it (fleetrl/tools/tune/slurm.py); here it only shows
        print(f"fleetrl tune: warning: --storage carries a password, which any user of this machine can read in this "
              f"tuner's command line (`ps`). Give the URL without it ({spec.without_password}) and the password as "
              f"PGPASSWORD or in ~/.pgpass (mode 0600), which libpq reads.", file=sys.stderr, flush=True)

    import optuna

    quiet_optuna()
    storage = open_storage(spec, args.stale_after)
    study = open_study(args, study_settings(args, algo, params, report_every), storage, spec, study_name,
                       make_sampler(args), make_pruner(args, total, report_every))

    display = Display()
    before = counted(study.get_trials(deepcopy=False))
    job = None
    try:
        if args.slurm:
            display.event(f"fleetrl tune: study {study_name!r} in {spec.shown} has {before} of {args.trials} trials; "
                          f"{plural(args.slurm_workers, 'tuner worker')} on Slurm, each with --parallel {args.parallel}; "
                          f"reports every {report_every:,} steps to the {args.pruner} pruner; output in {out}")
            job = run_array(args, algo, spec, study, out, display)
            stopped = job.stopped_by
        else:
            tuner = Tuner(args, algo, params, targets, study, storage, spec, out, report_every, display)
            gpus = f", spread over {plural(len(tuner.gpus), 'GPU')}" if tuner.gpus else ""
            display.event(f"fleetrl tune: study {study_name!r} in {spec.shown} has {before} of {args.trials} trials; "
                          f"{plural(tuner.trials_at_once, 'trial')} at once here, each {plural(tuner.runs_per_trial, 'run')} "
                          f"({plural(len(tuner.envs), 'env')} x {plural(len(tuner.seeds), 'seed')}) with {plural(tuner.threads, 'thread')}{gpus}; "
                          f"reports every {report_every:,} steps to the {args.pruner} pruner; output in {out}")
            tuner.run()
            stopped = tuner.stopped_by
    finally:
        display.close()
    try:
        report(study, args, algo, params, out, spec, plots=stopped is None)
    except Exception as exc:  # noqa: BLE001 - e.g. the database went away: say so in one paragraph
        raise FleetError(f"Cannot read the study {study_name!r} back from {spec.shown} for the report: {type(exc).__name__}: "
                         f"{(str(exc).strip().splitlines() or [''])[0]} The trials are in the storage; run the same command again "
                         f"(with the storage reachable) to write the report.") from None
    if stopped is not None:
        what = (f"the Slurm array {job.job_id} was cancelled, and its tuners stopped their running trials, which are" if job is not None
                else "the running trials were stopped,")
        error = TuneStopped(f"stopped by {'SIGTERM' if stopped == signal.SIGTERM else 'Ctrl-C'}: {what} recorded as failed and queued to run "
                            f"again. The same command resumes the study {study_name!r}.")
        error.exit_code = 128 + stopped
        raise error
    if job is not None and not all(t.ok for t in job.tasks):
        raise SlurmTasksFailed(job)
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        raise TuneFailed(f"No trial of the study {study_name!r} completed (reports above; trials in {out / 'trials.csv'}). "
                         f"Fix the cause and run the same command: failed trials are kept, and --trials counts them.")
