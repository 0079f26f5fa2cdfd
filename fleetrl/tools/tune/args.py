"""`fleetrl tune`'s command line: its flags (``TuneArgs``, whose field docstrings are `--help`), their ranges, and the
checks of what one flag alone cannot say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetrl import config
from fleetrl.errors import FleetError
from fleetrl.tools.runs import run_name


@dataclass
class TuneArgs:
    env_ids: list[str]
    """env ids every trial trains on; a trial's score aggregates them"""
    search: str
    """the search space: a YAML file mapping flags to distributions, e.g. `learning-rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}` (docs/tuning.md)"""
    target_scores: list[str] = field(default_factory=list)
    """ENV=LO,HI for each env: its return is normalised to (return - LO) / (HI - LO); needed with several envs, optional with one"""
    trials: int = 20
    """trials in the whole study, over all tuner processes (interrupted trials, run again, count once); rerun with a larger number to add trials"""
    parallel: int = 1
    """training processes at once in this tuner; each gets cores / parallel threads (and one of the visible GPUs, in turn)"""
    num_seeds: int = 1
    """seeds each trial trains with (start-seed, start-seed + 1, ...); its score is their mean"""
    start_seed: int = 1
    """the first seed"""
    storage: str | None = None
    """the study's storage: sqlite:///FILE.db (one machine), a journal file FILE.log or journal:///PATH (one machine, or a shared filesystem), postgresql://USER@HOST/DB (several machines) [journal OUT/study.log]"""
    study_name: str | None = None
    """the study; a tuner given the name of an existing study joins it (resumes it) [ALGO-ENV_ID+ENV_ID...]"""
    out: str | None = None
    """output folder: a folder per trial with its runs and logs, trials.csv, the PNGs [runs/tune_{study-name}]"""
    sampler: Literal["tpe", "random", "cmaes"] = "tpe"
    """how trials' parameters are chosen: tpe (multivariate, with the constant liar for parallel trials), random, cmaes"""
    sampler_seed: int | None = None
    """seed of the sampler (give each tuner of one study a different one, or none)"""
    random_trials: int = 10
    """tpe and cmaes: trials sampled at random before the sampler models the results"""
    pruner: Literal["median", "hyperband", "none"] = "median"
    """how weak trials are stopped mid-run: median (below the median of complete trials at the same step), hyperband, none"""
    prune_after_trials: int = 5
    """median: complete trials needed before any trial is pruned"""
    prune_warmup: float = 0.2
    """fraction of --total-timesteps a trial runs before it can be pruned"""
    aggregate: Literal["mean", "median"] = "mean"
    """how the envs' normalised scores combine into a trial's score (before the mean over seeds)"""
    last_episodes: int = 20
    """a run's score: the mean return of its last this many episodes (every `charts/episodic_return` point, no sub-sampling)"""
    report_every: int | None = None
    """environment steps between a trial's reports to the pruner, at the same steps in every trial [--total-timesteps / 10]"""
    trial_timeout: float | None = None
    """seconds a trial may run before it is stopped and recorded as failed [no limit]"""
    stale_after: float = 600.0
    """seconds without a heartbeat after which another tuner's RUNNING trial counts as dead (its tuner was killed): it is failed and queued again"""
    slurm: bool = False
    """tune on Slurm: submit OUT/tune.slurm (a job array of --slurm-workers tuners on this study) and follow it until every
    task has ended, then report as here. The storage must be reachable from the nodes: a journal file on a shared
    filesystem, or PostgreSQL at an address they reach. sbatch's own variables set the rest (SBATCH_PARTITION, ...)"""
    slurm_template: bool = False
    """write OUT/tune.slurm (a Slurm job array of tuner workers on this study) for sbatch, instead of tuning"""
    slurm_workers: int = 4
    """with --slurm or --slurm-template: array tasks, each a tuner with --parallel training processes"""
    slurm_cpus_per_task: int = 4
    """with --slurm or --slurm-template: CPU cores each array task asks for"""


DESCRIPTION = """Search hyperparameters with Optuna: many trials at once, weak ones stopped mid-run, studies shared across machines.

    fleetrl tune --env-ids CartPole-v1 --search space.yaml --trials 50 --parallel 4 -- fleetrl train ppo --total-timesteps 100000

Everything after `--` is the training command; each run gets the trial's flags and `--env-id E --seed S --run-dir OUT/trial_N/E__S`.
The search space is YAML, one flag per line: `learning-rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}`,
`update-epochs: {type: int, low: 2, high: 8}`, `num-steps: {type: categorical, choices: [64, 128, 256]}`. See docs/tuning.md.
"""

RANGES = {
    "trials": config.count("trials in the whole study", low=0, high=1_000_000),
    "parallel": config.count("training processes at once"),
    "num_seeds": config.count("seeds each trial trains with", high=1000),
    "start_seed": config.SEED,
    "sampler_seed": config.count("the sampler's seed", low=0, high=2**32 - 1, optional=True),
    "random_trials": config.count("trials sampled at random first", low=0),
    "prune_after_trials": config.count("complete trials before pruning starts", low=0),
    "prune_warmup": config.fraction("the fraction of a run before it can be pruned"),
    "last_episodes": config.count("episodes a run's score averages"),
    "report_every": config.count("environment steps between reports", optional=True),
    "trial_timeout": config.positive("seconds a trial may run", high=1e9, optional=True),
    "stale_after": config.Range("seconds without a heartbeat before a trial counts as dead", low=3, high=1e9),
    "slurm_workers": config.count("Slurm array tasks", high=10_000),
    "slurm_cpus_per_task": config.count("CPU cores each Slurm array task asks for"),
}


def check_args(args: TuneArgs) -> None:
    if not args.env_ids or not all(e.strip() for e in args.env_ids):
        raise FleetError(f"--env-ids needs one or more env ids, none empty, e.g. --env-ids CartPole-v1 Acrobot-v1; got {args.env_ids!r}.")
    config.check_ranges(args, RANGES)
    for name in ("out", "study_name", "storage"):
        value = getattr(args, name)
        if value is not None and not value.strip():
            raise FleetError(f"--{name.replace('_', '-')} is empty: give a value, or leave it out for the default.")
    if args.slurm and args.slurm_template:
        raise FleetError("Give --slurm (submit the array and follow it) or --slurm-template (only write the script, to submit by hand), not both.")
    names = [run_name(e, 0) for e in dict.fromkeys(args.env_ids)]
    if len(set(names)) < len(names):
        raise FleetError("Two of --env-ids map to the same folder name ('/' and ':' become '-'); tune them in separate studies.")
