"""`fleetrl tune`: hyperparameter search on Optuna. Each trial trains with `fleetrl train` in its own process group;
the tuner follows the runs' TensorBoard logs, reports a normalised score at aligned steps and stops weak trials
mid-run. Several tuner processes, on one machine or many, share one study through its storage."""

from __future__ import annotations

import bisect
import contextlib
import csv
import ctypes
import dataclasses
import difflib
import hashlib
import importlib
import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fleetrl import config
from fleetrl.cores import available_cores
from fleetrl.errors import FleetError, require
from fleetrl.tools.benchmark import (
    RETURN_TAG,
    STOP_GRACE_S,
    child_env,
    describe_exit,
    has_flag,
    log_tail,
    plural,
    resolve_command,
)
from fleetrl.tools.scores import parse_env_bounds

POLL_S = 1.0  # how often a trial's processes and TensorBoard logs are checked
DEFAULT_REPORTS = 10  # without --report-every, a trial reports this many times over its run
HEARTBEAT_MAX_S = 60  # a running trial tells the storage it is alive at least this often
PLAIN_STATUS_S = 30.0  # without a terminal, the status line is printed when it changes, and at least this often
SLURM_STAGGER_S = 2  # array tasks start this many seconds apart: workers opening one storage at once contend for it
EPISODE_TAGS = "charts/episodic_"  # episode scalars: logged at the step each episode ended, before the iteration's other scalars
FAILURES_SHOWN = 5  # the failed trials whose log tails the final report shows
RUNNER_FIELDS = ("env_id", "seed", "run_dir", "resume")  # set by the tuner for every run (and --no-progress, unless given)
FIXED_FIELDS = ("total_timesteps",)  # the budget trials are compared at: set in the command, never tuned


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
    slurm_template: bool = False
    """write OUT/tune.slurm (a Slurm job array of tuner workers on this study) instead of tuning here"""
    slurm_workers: int = 4
    """with --slurm-template: array tasks, each a tuner with --parallel training processes"""
    slurm_cpus_per_task: int = 4
    """with --slurm-template: CPU cores each array task asks for"""


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


# ---- the training command ---------------------------------------------------------------------


@dataclass
class Algo:
    """The algorithm behind the training command: its flags (an ``Args`` dataclass) and their ranges."""

    name: str
    module: Any
    base: list[str]  # the training command after `--`, as given
    flags: list[str]  # its flags after ``fleetrl train ALGO``

    @property
    def args_type(self) -> type:
        return self.module.Args

    @property
    def ranges(self) -> dict[str, config.Range]:
        return getattr(self.module, "RANGES", {})


def parse_command(base: list[str]) -> Algo:
    """The algorithm of a ``fleetrl train ALGO ...`` command, refusing the flags the tuner sets itself."""
    from fleetrl.algos import ALGOS

    example = "fleetrl tune --env-ids CartPole-v1 --search space.yaml -- fleetrl train ppo --total-timesteps 100000"
    if not base:
        raise FleetError(f"`fleetrl tune` needs the training command after `--`, e.g. {example}")
    if base[:2] == ["fleetrl", "train"]:
        rest = base[2:]
    elif base[1:4] == ["-m", "fleetrl", "train"]:
        rest = base[4:]
    else:
        raise FleetError(f"The command after `--` must be `fleetrl train ALGO [flags]` (the tuner reads and sets its flags); got {shlex.join(base)!r}. "
                         f"Example: {example}")
    if not rest or rest[0] not in ALGOS:
        raise FleetError(f"The command after `--` needs an algorithm, one of: {', '.join(ALGOS)} (got {rest[0] if rest else 'nothing'}). Example: {example}")
    given = [f"--{name.replace('_', '-')}" for name in RUNNER_FIELDS if command_sets(rest[1:], name)]
    if given:
        raise FleetError(f"Remove {', '.join(given)} from the command after `--`: the tuner sets --env-id, --seed and --run-dir for each run "
                         f"(--env-ids picks the envs, --num-seeds and --start-seed the seeds, --out the folders), and trials always start afresh.")
    return Algo(rest[0], importlib.import_module(f"fleetrl.algos.{rest[0]}"), list(base), rest[1:])


def command_sets(flags: list[str], name: str) -> bool:
    """Whether the flags set the field ``name``, in any spelling tyro takes (dashes or underscores, ``--no-`` for booleans)."""
    spellings = {name, name.replace("_", "-")}
    return any(has_flag(flags, f"--{prefix}{s}") for s in spellings for prefix in ("", "no-", "no_"))


def resolved_args(algo: Algo, env_id: str, extra: list[str] = ()) -> Any:
    """The arguments a run of the command on ``env_id`` trains with: its flags, then the env family's defaults."""
    import tyro

    from fleetrl.envs import env_family

    flags = [*algo.flags, *extra, "--env-id", env_id]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            parsed = tyro.cli(algo.args_type, args=flags, prog=f"fleetrl train {algo.name}")
    except SystemExit:
        # tyro's message, without its box and its help hint, as one line
        lines = [line.strip(" \u2502\u2500\u256d\u256e\u2570\u256f-") for line in said.getvalue().splitlines()]
        lines = [line for i, line in enumerate(lines) if line and not line.startswith("For full helptext")
                 and not any(later != line and later.startswith(line) for later in lines[i + 1:])]  # a title its message repeats
        message = " ".join(dict.fromkeys(lines))
        raise FleetError(f"The command after `--` is not a valid `fleetrl train {algo.name}` command ({message or 'tyro refused it'}): "
                         f"{shlex.join(algo.base)!r}. `fleetrl train {algo.name} --help` lists its flags.") from None
    return config.apply_family_defaults(parsed, getattr(algo.module, "FAMILY_DEFAULTS", {}), env_family(env_id).name) \
        if hasattr(algo.module, "FAMILY_DEFAULTS") else parsed


# ---- the search space -------------------------------------------------------------------------

KINDS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}, "categorical": {"choices"}}


@dataclass(frozen=True)
class Param:
    """One tuned flag: its Optuna distribution, and how its value goes on the command line."""

    name: str  # the flag without its dashes ("learning-rate"): the Optuna parameter name
    field: str  # the Args field ("learning_rate")
    field_type: type  # int, float, bool or str
    kind: str  # float, int or categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.name, list(self.choices))

    def flags(self, value: Any) -> list[str]:
        if self.field_type is bool:
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", format_value(value)]

    def describe(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("field", "field_type") and v is not None and v is not False and v != ()}


def format_value(value: Any) -> str:
    """A value as a flag takes it: floats in full (``repr``), so the printed command trains exactly the trial's value."""
    return repr(value) if isinstance(value, float) else str(value)


def field_types(args_type: type) -> dict[str, tuple[type | None, bool]]:
    """Each field's plain type (int, float, bool, str; None for anything else) and whether it takes None."""
    found = {}
    for name, hint in typing.get_type_hints(args_type).items():
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        plain = [m for m in members if m is not type(None)]
        found[name] = (plain[0] if len(plain) == 1 and plain[0] in (int, float, bool, str) else None, type(None) in members)
    return found


def load_search_space(path: str, algo: Algo) -> list[Param]:
    """Read and check the YAML search space against the algorithm's flags and ranges: every problem is named at once,
    before any trial starts."""
    yaml = require("yaml", "tune", "Reading the --search YAML file")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FleetError(f"Cannot read the search space --search {path} ({exc.strerror or exc}). Give the path of a YAML file "
                         f"(docs/tuning.md shows one).") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError(f"The search space {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(spec, dict) or not spec:
        raise FleetError(f"The search space {path} must map flags to distributions, one per line, e.g. "
                         f"`learning-rate: {{type: float, low: 1.0e-5, high: 1.0e-3, log: true}}`; got {type(spec).__name__ if spec else 'nothing'}.")
    types = field_types(algo.args_type)
    params, problems = [], []
    for key, entry in spec.items():
        param, problem = _param(str(key), entry, types, algo)
        if problem:
            problems.append(f"{key}: {problem}")
        else:
            params.append(param)
    fields = [p.field for p in params]
    problems += [f"{f.replace('_', '-')}: given twice (with dashes and underscores)" for f in sorted({f for f in fields if fields.count(f) > 1})]
    if problems:
        raise FleetError(f"The search space {path} has {plural(len(problems), 'problem')}: " + " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
                         + f" Each entry is FLAG: {{type: float|int|categorical, ...}}; `fleetrl train {algo.name} --help` lists the flags, docs/tuning.md the format.")
    return params


def _param(key: str, entry: Any, types: dict, algo: Algo) -> tuple[Param | None, str | None]:
    name = key.strip().lstrip("-").replace("_", "-")
    field_name = name.replace("-", "_")
    if field_name not in types:
        close = difflib.get_close_matches(field_name, list(types), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(c.replace('_', '-') for c in close)}?" if close else f"see `fleetrl train {algo.name} --help`"
        return None, f"unknown flag --{name} for fleetrl train {algo.name} ({hint})."
    if field_name in (*RUNNER_FIELDS, "progress"):
        return None, f"--{name} is set by the tuner for each run, so it cannot be tuned."
    if field_name in FIXED_FIELDS:
        return None, f"--{name} is the budget every trial is compared at: set it in the command after `--`, not in the search space."
    if command_sets(algo.flags, field_name):
        return None, f"--{name} is also given in the command after `--`; remove it there (the tuner sets it for each trial)."
    ftype, optional = types[field_name]
    if ftype is None:
        return None, f"--{name} is not a number, boolean or string flag, so it cannot be tuned."
    if not isinstance(entry, dict):
        return None, f"expected a mapping like {{type: float, low: 0.1, high: 0.9}}, got {entry!r}."
    kind = entry.get("type")
    if kind not in KINDS:
        return None, f"type must be one of {', '.join(KINDS)}, got {kind!r}."
    unknown = sorted(set(entry) - KINDS[kind] - {"type"})
    if unknown:
        return None, f"{', '.join(map(str, unknown))} {'is' if len(unknown) == 1 else 'are'} not a key of a {kind} distribution (it takes {', '.join(sorted(KINDS[kind]))})."
    rule = algo.ranges.get(field_name)
    if kind == "categorical":
        return _categorical(name, field_name, ftype, optional, entry.get("choices"), rule)
    if ftype in (bool, str):
        return None, f"bad type: --{name} takes {'true or false' if ftype is bool else 'a string'}; use type: categorical with choices."
    if kind == "float" and ftype is int:
        return None, f"bad type: --{name} takes a whole number; use type: int (or categorical)."
    low, high = _number(entry.get("low"), kind), _number(entry.get("high"), kind)
    log, step = entry.get("log", False), entry.get("step")
    if low is None or high is None:
        what = "whole numbers" if kind == "int" else "numbers"
        return None, f"low and high must be {what}, got low {entry.get('low')!r}, high {entry.get('high')!r}."
    if not isinstance(log, bool):
        return None, f"log must be true or false, got {log!r}."
    if low >= high:
        return None, f"low ({low}) must be below high ({high})."
    if log and low <= 0:
        return None, f"a log distribution needs low > 0, got low {low}."
    if step is not None:
        step = _number(step, kind)
        if step is None or step <= 0:
            return None, f"step must be a positive {'whole ' if kind == 'int' else ''}number, got {entry.get('step')!r}."
        if log:
            return None, "step and log cannot be used together."
    for which, value in (("low", low), ("high", high)):
        refusal = rule.refusal(f"--{name}", value) if rule else None
        if refusal:
            return None, f"{which} {value} is refused by the trainer: {refusal}"
    return Param(name, field_name, ftype, kind, low, high, log, step), None


def _categorical(name: str, field_name: str, ftype: type, optional: bool, choices: Any, rule) -> tuple[Param | None, str | None]:
    if not isinstance(choices, list) or not choices:
        return None, f"choices must be a non-empty list, e.g. choices: [64, 128, 256]; got {choices!r}."
    fixed = []
    for choice in choices:
        value = choice
        if choice is None:
            if not optional:
                return None, f"choice null: --{name} does not take None."
        elif ftype is bool:
            if not isinstance(choice, bool):
                return None, f"bad type: --{name} takes true or false, got the choice {choice!r}."
        elif ftype is str:
            if not isinstance(choice, str):
                return None, f"bad type: --{name} takes a string, got the choice {choice!r}."
        else:
            value = _number(choice, "int" if ftype is int else "float")
            if value is None:
                return None, f"bad type: --{name} takes {'a whole number' if ftype is int else 'a number'}, got the choice {choice!r}."
            refusal = rule.refusal(f"--{name}", value) if rule else None
            if refusal:
                return None, f"the choice {choice!r} is refused by the trainer: {refusal}"
        fixed.append(value)
    return Param(name, field_name, ftype, "categorical", choices=tuple(fixed)), None


def _number(value: Any, kind: str) -> float | int | None:
    """A YAML number, or None. PyYAML reads ``1e-5`` (no dot) as a string: such strings are taken as numbers too."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind == "int":
        return int(value) if float(value).is_integer() else None
    return float(value)


# ---- scores -----------------------------------------------------------------------------------


def parse_targets(items: list[str], env_ids: list[str]) -> dict[str, tuple[float, float]]:
    """``ENV=LO,HI`` per env; required for every env when there are several (raw returns of two envs do not add up)."""
    targets = parse_env_bounds(items, env_ids, "--target-scores", "--env-ids")
    missing = [e for e in env_ids if e not in targets]
    if len(env_ids) > 1 and missing:
        raise FleetError(f"With several envs, each needs --target-scores ENV=LO,HI (e.g. random and expert returns) so their scores can be "
                         f"combined; missing: {' '.join(missing)}. Example: --target-scores CartPole-v1=0,500 Acrobot-v1=-500,0")
    return targets


def run_score(steps: list[int], returns: list[float], last: int, step: int | None = None) -> float | None:
    """Mean return of the last ``last`` episodes logged at or before ``step`` (all of them: None), or None if none was."""
    end = len(steps) if step is None else bisect.bisect_right(steps, step)
    return float(np.mean(returns[max(0, end - last):end])) if end else None


def trial_score(run_scores: dict[tuple[str, int], float | None], env_ids: list[str], seeds: list[int],
                targets: dict[str, tuple[float, float]], aggregate: str) -> float | None:
    """Normalise each env's score with its targets, aggregate the envs (mean or median) for each seed, then average the
    seeds; None while any run has no score."""
    per_seed = []
    for seed in seeds:
        scores = []
        for env_id in env_ids:
            score = run_scores.get((env_id, seed))
            if score is None:
                return None
            lo, hi = targets.get(env_id, (0.0, 1.0))
            scores.append((score - lo) / (hi - lo))
        per_seed.append(float(np.median(scores)) if aggregate == "median" else float(np.mean(scores)))
    return float(np.mean(per_seed))


class EpisodeFollower:
    """Follows one run's TensorBoard event files as they grow: each ``update`` reads only the new records, keeping every
    episodic return (no sub-sampling) and the newest step logged."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.steps: list[int] = []
        self.returns: list[float] = []
        self.reached = 0  # the newest step of a scalar other than an episode's: every episode up to it is on disk, since an
        # iteration logs its episodes (at their own, earlier steps) before its other scalars
        self._loaders: dict[str, Any] = {}

    def update(self) -> None:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        if not self.run_dir.is_dir():
            return
        for path in sorted(self.run_dir.glob("events.out.tfevents.*")):
            loader = self._loaders.setdefault(str(path), EventFileLoader(str(path)))
            for event in loader.Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    if value.tag == RETURN_TAG:
                        self.steps.append(event.step)
                        self.returns.append(_scalar(value))
                    elif not value.tag.startswith(EPISODE_TAGS):
                        self.reached = max(self.reached, event.step)

    def score(self, last: int, step: int | None = None) -> float | None:
        return run_score(self.steps, self.returns, last, step)


def _scalar(value) -> float:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(value.tensor).item())


# ---- the storage ------------------------------------------------------------------------------


@dataclass
class StorageSpec:
    kind: str  # journal, sqlite or rdb
    url: str  # the RDB URL (sqlite and rdb), or the journal file's path
    path: Path | None = None  # the file of a journal or SQLite storage

    @property
    def shown(self) -> str:
        """The storage as printed and as optuna-dashboard takes it, with any password hidden."""
        if self.kind == "journal":
            return str(self.path)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)


STORAGE_FORMS = ("sqlite:///FILE.db (one machine), a journal file FILE.log or journal:///PATH (one machine or a shared filesystem), "
                 "or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (several machines)")


def parse_storage(spec: str) -> StorageSpec:
    spec = spec.strip()
    if spec.startswith("journal://"):
        path = spec[len("journal://"):]
        if not path:
            raise FleetError(f"--storage {spec!r} names no file; give journal:///ABSOLUTE/PATH or journal://RELATIVE/PATH.")
        return StorageSpec("journal", path, Path(path))
    if spec.startswith("sqlite:"):
        if not spec.startswith("sqlite:///") or spec[len("sqlite:///"):] in ("", ":memory:"):
            raise FleetError(f"--storage {spec!r} is not an SQLite file: give sqlite:///RELATIVE/FILE.db or sqlite:////ABSOLUTE/FILE.db "
                             f"(an in-memory study would be lost when the tuner ends).")
        return StorageSpec("sqlite", spec, Path(spec[len("sqlite:///"):]))
    scheme = spec.split("://", 1)[0] if "://" in spec else None
    if scheme is not None:
        if scheme.split("+")[0] not in ("postgresql", "postgres", "mysql", "oracle", "mssql"):
            raise FleetError(f"--storage {spec!r}: unknown storage {scheme!r}. Give {STORAGE_FORMS}.")
        if scheme == "postgres":  # SQLAlchemy knows only the long name
            spec = "postgresql" + spec[len("postgres"):]
        return StorageSpec("rdb", _with_driver(spec))
    path = Path(spec)
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return StorageSpec("sqlite", f"sqlite:///{spec}", path)
    if path.suffix in (".log", ".journal", ".jsonl"):
        return StorageSpec("journal", spec, path)
    raise FleetError(f"--storage {spec!r} is neither a URL nor a file ending in .log (journal) or .db (SQLite). Give {STORAGE_FORMS}.")


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; the tune extra installs psycopg (3), so use it when psycopg2 is absent."""
    if not url.startswith("postgresql://"):
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return url
    if importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg" + url[len("postgresql"):]
    raise FleetError("A PostgreSQL storage needs a driver, and neither psycopg nor psycopg2 is installed. "
                     "Install it with: pip install 'fleetrl[tune]'  (or: pip install 'psycopg[binary]')")


def open_storage(spec: StorageSpec, stale_after: float):
    """The Optuna storage. RDB storages (SQLite, PostgreSQL) carry Optuna's heartbeat, so a trial whose tuner was killed
    is failed (and queued again) once ``stale_after`` passes; journal trials get the same from :meth:`Tuner.sweep_stale`."""
    import optuna

    try:
        if spec.kind == "journal":
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            spec.path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(spec.path)))
        if spec.kind == "sqlite":
            spec.path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}} if spec.kind == "sqlite" else {"pool_pre_ping": True}
        for attempt in range(5):  # tuners that create the tables at the same moment can collide; the loser retries
            try:
                # SQLite: tuners on this machine create the tables one at a time (the study's file lock); two at once
                # raced in Optuna's schema setup (UNIQUE constraint failed: alembic_version.version_num)
                with _file_lock(Path(f"{spec.path}.fleetrl-lock") if spec.kind == "sqlite" else None), warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat is "experimental"
                    return optuna.storages.RDBStorage(spec.url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval(stale_after),
                                                      grace_period=int(stale_after), heartbeat_stale_trial_callback=requeue_stale)
            except Exception as exc:  # noqa: BLE001 - sqlalchemy's OperationalError/IntegrityError, or a refused connection
                if attempt == 4 or not any(race in str(exc) for race in ("already exists", "duplicate key", "locked", "UNIQUE constraint")):
                    raise
                time.sleep(0.5 + attempt)
    except FleetError:
        raise
    except Exception as exc:  # noqa: BLE001 - every driver has its own errors; the user needs the first line and a hint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = {"rdb": "Check that the database server is running and reachable from here, and the user, password and database in the URL.",
                "sqlite": "Check that the folder exists and can be written (and is not on a network filesystem: use a journal file there).",
                "journal": "Check that the folder can be written."}[spec.kind]
        raise FleetError(f"Cannot open the study storage {spec.shown}: {type(exc).__name__}: {first} {hint}") from None


@contextlib.contextmanager
def _file_lock(path: Path | None):
    """An exclusive lock on ``path`` for the block (none when ``path`` is None); released if the process dies."""
    if path is None:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def heartbeat_interval(stale_after: float) -> int:
    return int(max(1, min(HEARTBEAT_MAX_S, stale_after / 4)))


def requeue_stale(study, trial) -> None:
    """A trial whose tuner died was failed; run its parameters again (the retry is counted instead of it)."""
    study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "retry_reason": "stale"})


class StudyLock:
    """Serialises 'count the trials, then ask for one' over every tuner of the study, so --trials is exact: a file lock
    beside a journal or SQLite file, an advisory lock on PostgreSQL. Other databases get only this process's lock."""

    def __init__(self, spec: StorageSpec, storage: Any, study_name: str):
        self._thread_lock = threading.Lock()
        self._spec, self._storage = spec, storage
        self._key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)
        self._lock_path = Path(f"{spec.path}.fleetrl-lock") if spec.path is not None else None

    @contextlib.contextmanager
    def held(self):
        with self._thread_lock:
            if self._lock_path is not None:
                with _file_lock(self._lock_path):
                    yield
            elif self._spec.url.startswith("postgresql"):
                from sqlalchemy import text

                with self._storage.engine.connect() as conn:
                    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
                    conn.commit()
                    try:
                        yield
                    finally:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                        conn.commit()
            else:
                yield


# ---- one trial: its runs as process groups ----------------------------------------------------

PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):
    _prctl = None


def _die_with_tuner() -> None:
    """In the child before exec: SIGTERM it if the tuner dies (even by SIGKILL), so no trial outlives its tuner."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class TrialRun:
    """One (env, seed) run of a trial: its folder, log, process group and TensorBoard follower."""

    env_id: str
    seed: int
    run_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    slot: int | None = None
    follower: EpisodeFollower = field(init=False)

    def __post_init__(self):
        self.follower = EpisodeFollower(self.run_dir)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def start(self, command: list[str], env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            log.write(f"$ {shlex.join(command)}\n")  # the exact command, to rerun one run by hand
            log.flush()
            # its own session: Ctrl-C reaches the tuner only, which stops the run's whole group (trainer and env workers)
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True, preexec_fn=_die_with_tuner)


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def stop_runs(runs: list[TrialRun], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to each live run's process group (the trainer checkpoints and exits), SIGKILL to what is left after ``grace``;
    a run that did not end cleanly also gets its group killed, in case it left env workers behind."""
    live = [r for r in runs if r.running]
    for run in live:
        signal_group(run.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for run in live:
        try:
            run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(run.proc, signal.SIGKILL)
            run.proc.wait()
    for run in runs:
        if run.proc is not None and run.proc.returncode != 0:
            signal_group(run.proc, signal.SIGKILL)


@dataclass
class Outcome:
    state: str  # complete, pruned, failed or interrupted
    value: float | None = None
    step: int | None = None  # the step a pruned trial was stopped at
    reason: str = ""
    exit_code: int | None = None
    log: str | None = None


# ---- the tuner --------------------------------------------------------------------------------


def run_name(env_id: str, seed: int) -> str:
    return f"{config.path_safe(env_id)}__{seed}"


def failed_for_good(trials: list) -> list:
    """The FAIL trials, less those queued to run again (interrupted, or their tuner died): their retries stand for them."""
    from optuna.trial import TrialState

    retried = {t.user_attrs.get("retry_of") for t in trials}
    return [t for t in trials if t.state == TrialState.FAIL and t.number not in retried]


def counted(trials: list) -> int:
    """Trials that count toward --trials: complete, pruned, running, and failed for good (not the queued ones)."""
    from optuna.trial import TrialState

    return sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)) + len(failed_for_good(trials))


class Tuner:
    """Worker threads that each ask the study for a trial, run it, and tell the result, until the study has --trials."""

    def __init__(self, args: TuneArgs, algo: Algo, params: list[Param], targets: dict, study, storage, spec: StorageSpec,
                 out: Path, report_every: int, display: "Display"):
        self.args, self.algo, self.params, self.targets = args, algo, params, targets
        self.study, self.storage, self.spec, self.out = study, storage, spec, out
        self.report_every, self.display = report_every, display
        self.seeds = [args.start_seed + i for i in range(args.num_seeds)]
        self.envs = list(dict.fromkeys(args.env_ids))
        self.runs_per_trial = len(self.envs) * len(self.seeds)
        self.wave = min(self.runs_per_trial, args.parallel)  # a trial's runs at once; the rest wait for a free slot
        self.trials_at_once = max(1, args.parallel // self.wave)
        self.threads = max(1, available_cores() // args.parallel)
        self.gpus = visible_gpus() if not command_sets(algo.flags, "cuda") or has_flag(algo.flags, "--cuda") else []
        self.stop = threading.Event()  # Ctrl-C or SIGTERM: stop the running trials, record them, start no more
        self.kill_now = threading.Event()  # a second one: SIGKILL the runs at once
        self.stopped_by: int | None = None
        self.lock = StudyLock(spec, storage, study.study_name)
        self.heartbeat_s = heartbeat_interval(args.stale_after)
        self._live: list[TrialRun] = []
        self._live_lock = threading.Lock()

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Run the workers until the study has --trials (or :meth:`request_stop`); Ctrl-C and SIGTERM are caught here
        (in the main thread) so that no storage call is cut in half."""
        workers = [threading.Thread(target=self.worker, args=(list(range(i * self.wave, (i + 1) * self.wave)),), name=f"tune-{i}", daemon=True)
                   for i in range(self.trials_at_once)]
        in_main = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, self.request_stop) for signum in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        try:
            for worker in workers:
                worker.start()
            said, killed = False, False
            while any(w.is_alive() for w in workers):
                if self.stop.is_set() and not said:
                    said = True
                    self.display.event("stopping: the running trials get SIGTERM, then are recorded as failed and queued to run again "
                                       "(Ctrl-C again kills them at once)")
                if self.kill_now.is_set() and not killed:
                    killed = True
                    with self._live_lock:
                        for run in self._live:
                            if run.proc is not None:
                                signal_group(run.proc, signal.SIGKILL)
                self.show_status()
                for w in workers:
                    w.join(timeout=POLL_S / len(workers))
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.show_status(force=True)

    def show_status(self, force: bool = False) -> None:
        try:
            self.display.status(self.study, self.args.trials, force=force)
        except Exception:  # noqa: BLE001 - the status line is a view: a storage hiccup must not stop the trials
            pass

    def request_stop(self, signum: int = signal.SIGINT, frame: Any = None) -> None:
        """The signal handler: the first stop asks the workers to stop their trials; a second kills the runs at once."""
        if self.stop.is_set():
            self.kill_now.set()
            return
        self.stopped_by = signum
        self.stop.set()

    def worker(self, slots: list[int]) -> None:
        while not self.stop.is_set():
            try:
                asked = self.next_trial()
            except Exception as exc:  # noqa: BLE001 - a storage hiccup ends this worker, not the others, and is said
                self.display.event(f"worker stopped: could not get a trial from the storage: {type(exc).__name__}: {exc}")
                return
            if asked is None:
                return
            trial, values = asked
            try:
                outcome = self.run_trial(trial, values, slots)
            except Exception as exc:  # noqa: BLE001 - the tuner's own fault in one trial: record it, go on
                outcome = Outcome("failed", reason=f"the tuner failed while running it: {type(exc).__name__}: {exc}")
            self.finish(trial, outcome)

    def next_trial(self):
        """Under the study lock: fail dead tuners' trials, then ask for a trial if the study has fewer than --trials."""
        with self.lock.held():
            if self.stop.is_set():
                return None
            self.sweep_stale()
            if counted(self.study.get_trials(deepcopy=False)) >= self.args.trials:
                return None
            trial = self.study.ask()
            self.beat(trial)
        values = {p.name: p.suggest(trial) for p in self.params}
        return trial, values

    # ------------------------------------------------------------------ heartbeats and dead tuners
    def beat(self, trial) -> None:
        """Tell the storage this trial's tuner is alive: Optuna's heartbeat on RDB storages, a user attribute on a journal."""
        if self.spec.kind == "journal":
            trial.set_user_attr("heartbeat", time.time())
        else:
            self.storage.record_heartbeat(trial._trial_id)

    def sweep_stale(self) -> None:
        """Fail the RUNNING trials of tuners that stopped sending heartbeats (killed), and queue their parameters again."""
        import optuna
        from optuna.trial import TrialState

        if self.spec.kind != "journal":
            optuna.storages.fail_stale_trials(self.study)  # the storage's callback queues them again
            return
        now = time.time()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            last = t.user_attrs.get("heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else now)
            if now - last > self.args.stale_after:
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                requeue_stale(self.study, t)
                self.display.event(f"trial {t.number}: no heartbeat for {now - last:.0f}s (its tuner was stopped); failed, and queued to run again")

    # ------------------------------------------------------------------ one trial
    def train_flags(self, values: dict[str, Any]) -> list[str]:
        return [flag for p in self.params for flag in p.flags(values[p.name])]

    def run_command(self, values: dict, run: TrialRun) -> list[str]:
        extras = [] if command_sets(self.algo.flags, "torch_threads") or "torch_threads" in {p.field for p in self.params} \
            else ["--torch-threads", str(self.threads)]
        extras += [] if command_sets(self.algo.flags, "progress") else ["--no-progress"]
        return [*resolve_command(self.algo.base), *self.train_flags(values), *extras,
                "--env-id", run.env_id, "--seed", str(run.seed), "--run-dir", str(run.run_dir)]

    def trial_folder(self, number: int) -> Path:
        folder = self.out / f"trial_{number:04d}"
        if folder.exists():  # left by an earlier study in this --out: never mix two trials' logs
            folder = self.out / f"trial_{number:04d}_{int(time.time())}"
        return folder

    def run_trial(self, trial, values: dict[str, Any], slots: list[int]) -> Outcome:
        folder = self.trial_folder(trial.number).resolve()
        runs = [TrialRun(env_id, seed, folder / run_name(env_id, seed), folder / f"{run_name(env_id, seed)}.log") for env_id in self.envs for seed in self.seeds]
        trial.set_user_attr("run_dirs", [str(r.run_dir) for r in runs])
        trial.set_user_attr("logs", [str(r.log_path) for r in runs])
        trial.set_user_attr("command", shlex.join([*self.algo.base, *self.train_flags(values)]))
        shown = " ".join(f"{k}={format_value(v) if not isinstance(v, float) else f'{v:.4g}'}" for k, v in values.items())
        self.display.event(f"trial {trial.number} started: {shown or '(no parameters)'}")
        with self._live_lock:
            self._live += runs
        try:
            return self._follow(trial, values, runs, list(slots))
        finally:
            stop_runs(runs)
            with self._live_lock:
                self._live = [r for r in self._live if r not in runs]

    def _follow(self, trial, values: dict, runs: list[TrialRun], free: list[int]) -> Outcome:
        pending, started = list(runs), []
        reported, start, last_beat = 0, time.monotonic(), time.monotonic()
        while True:
            for run in started:
                if run.slot is not None and not run.running:
                    free.append(run.slot)
                    run.slot = None
            while pending and free:
                run = pending.pop(0)
                run.slot = free.pop(0)
                env = child_env(self.threads)
                if self.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpus[run.slot % len(self.gpus)]
                run.start(self.run_command(values, run), env)
                started.append(run)
            if self.stop.wait(POLL_S):
                return Outcome("interrupted", reason="interrupted: the tuner was stopped (Ctrl-C or SIGTERM)")
            if time.monotonic() - last_beat >= self.heartbeat_s:
                self.beat(trial)
                last_beat = time.monotonic()
            failed = next((r for r in started if r.returncode not in (None, 0)), None)
            if failed is not None:
                tail = [line for line in log_tail(failed.log_path) if line.strip()]
                return Outcome("failed", reason=f"{failed.env_id} seed {failed.seed}: {describe_exit(failed.returncode)}"
                               + (f": {tail[-1].strip()}" if tail else ""), exit_code=failed.returncode, log=str(failed.log_path))
            for run in started:
                run.follower.update()
            done = not pending and not any(r.running for r in started)
            if done:
                for run in started:  # what the runs wrote between the last read and their exit
                    run.follower.update()
            # report each aligned step that every run of the trial has reached
            live = [r.follower.reached for r in runs if r.proc is None or r.running]
            reach = min(live) if live else max(r.follower.reached for r in runs)
            step = reported + self.report_every
            while step <= reach:
                value = trial_score({(r.env_id, r.seed): r.follower.score(self.args.last_episodes, step) for r in runs},
                                    self.envs, self.seeds, self.targets, self.args.aggregate)
                if value is not None:
                    if not math.isfinite(value):
                        return Outcome("failed", reason=f"the score is {value} at step {step:,}")
                    trial.report(value, step)
                    reported = step
                    if not done and trial.should_prune():
                        return Outcome("pruned", value=value, step=step, reason=f"score {value:.4g} at step {step:,}")
                step += self.report_every
            if done:
                value = trial_score({(r.env_id, r.seed): r.follower.score(self.args.last_episodes) for r in runs},
                                    self.envs, self.seeds, self.targets, self.args.aggregate)
                if value is None:
                    return Outcome("failed", reason="no episode finished in some run: raise --total-timesteps")
                if not math.isfinite(value):
                    return Outcome("failed", reason=f"the score is {value}")
                return Outcome("complete", value=value)
            if self.args.trial_timeout is not None and time.monotonic() - start > self.args.trial_timeout:
                return Outcome("failed", reason=f"timeout: still running after --trial-timeout {self.args.trial_timeout:g}s")

    def finish(self, trial, outcome: Outcome) -> None:
        """Record the outcome in the study (a trial another tuner already failed as stale is left as it is)."""
        from optuna.trial import TrialState

        attrs = {"fail_reason": outcome.reason, "exit_code": outcome.exit_code, "log": outcome.log} if outcome.state in ("failed", "interrupted") \
            else {"pruned_at_step": outcome.step} if outcome.state == "pruned" else {}
        try:
            for key, value in attrs.items():
                if value is not None:
                    trial.set_user_attr(key, value)
            if outcome.state == "complete":
                self.study.tell(trial, outcome.value, skip_if_finished=True)
            else:
                state = TrialState.PRUNED if outcome.state == "pruned" else TrialState.FAIL
                self.study.tell(trial, state=state, skip_if_finished=True)
            if outcome.state == "interrupted":
                self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "retry_reason": "interrupted"})
        except Exception as exc:  # noqa: BLE001 - e.g. failed meanwhile by another tuner's stale sweep
            self.display.event(f"trial {trial.number}: could not record its result ({type(exc).__name__}: {exc})")
            return
        if outcome.state == "complete":
            self.display.event(f"trial {trial.number} complete: score {outcome.value:.4g}")
        elif outcome.state == "pruned":
            self.display.event(f"trial {trial.number} pruned at step {outcome.step:,} ({outcome.reason})")
        else:
            where = f"; log: {outcome.log}" if outcome.log else ""
            self.display.event(f"trial {trial.number} {outcome.reason}; queued to run again" if outcome.state == "interrupted"
                               else f"trial {trial.number} FAILED: {outcome.reason}{where}")


def visible_gpus() -> list[str]:
    """The GPUs runs are spread over, in turn: CUDA_VISIBLE_DEVICES's entries, else every GPU NVML sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [e.strip() for e in visible.split(",") if e.strip() and e.strip() != "-1"]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no GPU: runs use the CPU
        return []


# ---- display ----------------------------------------------------------------------------------


def study_counts(trials: list) -> dict[str, Any]:
    from optuna.trial import TrialState

    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = sum(1 for t in trials if t.state == TrialState.PRUNED)
    failed = len(failed_for_good(trials))
    return {
        "done": len(complete) + pruned + failed,
        "complete": len(complete),
        "pruned": pruned,
        "failed": failed,
        "running": sum(1 for t in trials if t.state == TrialState.RUNNING),
        "queued": sum(1 for t in trials if t.state == TrialState.WAITING),
        "best": max(complete, key=lambda t: t.value, default=None),
    }


def status_text(counts: dict, total: int) -> str:
    best = counts["best"]
    shown = f"best {best.value:.4g} (trial {best.number})" if best is not None else "best -"
    return (f"trials {counts['done']}/{total} done: {counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed; "
            f"{counts['running']} running; {shown}")


class Display:
    """A live status line under the trial events on a terminal (rich); plain lines otherwise."""

    def __init__(self, enabled: bool = True):
        self.interactive = enabled and sys.stdout.isatty()
        self._lock = threading.Lock()
        self._last_text, self._last_print = "", 0.0
        self._live = None
        if self.interactive:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(), refresh_per_second=4, transient=True)
            self._live.start()

    def event(self, message: str) -> None:
        line = f"[{datetime.now():%H:%M:%S}] {message}"
        with self._lock:
            if self._live is not None:
                self._live.console.print(line, highlight=False, markup=False)
            else:
                print(line, flush=True)

    def status(self, study, total: int, force: bool = False) -> None:
        text = status_text(study_counts(study.get_trials(deepcopy=False)), total)
        with self._lock:
            if self._live is not None:
                from rich.text import Text

                self._live.update(Text(text, style="bold"))
            elif force or text != self._last_text or time.monotonic() - self._last_print >= PLAIN_STATUS_S:
                print(text, flush=True)
                self._last_print = time.monotonic()
            self._last_text = text

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if self._last_text:
                print(self._last_text, flush=True)


# ---- results ----------------------------------------------------------------------------------


def write_atomically(path: Path, write) -> None:
    """Write to a temporary file, then rename: tuners of one study finishing together never leave half a file."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_trials_csv(trials: list, params: list[Param], path: Path) -> None:
    header = ["number", "state", "value", "duration_s", *[p.name for p in params], "pruned_at_step", "exit_code", "fail_reason",
              "log", "run_dirs", "retry_of", "datetime_start"]

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for t in trials:
                attrs = t.user_attrs
                duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
                writer.writerow([t.number, t.state.name, "" if t.value is None else t.value, "" if duration is None else round(duration, 1),
                                 *[format_value(t.params[p.name]) if p.name in t.params else "" for p in params],
                                 attrs.get("pruned_at_step", ""), "" if attrs.get("exit_code") is None else attrs["exit_code"],
                                 attrs.get("fail_reason", ""), attrs.get("log", ""), ";".join(attrs.get("run_dirs", [])),
                                 "" if attrs.get("retry_of") is None else attrs["retry_of"],
                                 t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else ""])

    write_atomically(path, write)


def write_plots(study, out: Path) -> list[str]:
    """optimization_history.png and param_importances.png; what was drawn, or why not."""
    from optuna.trial import TrialState

    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a cluster node or in CI
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    notes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plots are "experimental" in Optuna
        for name, needs, draw in (("optimization_history.png", 1, optuna_plots.plot_optimization_history),
                                  ("param_importances.png", 2, _plot_importances)):
            if complete < needs:
                notes.append(f"{name}: not drawn, it needs {plural(needs, 'complete trial')} ({complete} so far)")
                continue
            try:
                ax = draw(study)
                fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                write_atomically(out / name, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png"))
                plt.close(fig)
                notes.append(str(out / name))
            except Exception as exc:  # noqa: BLE001 - a plot is a convenience: say why it is missing, keep the results
                notes.append(f"{name}: not drawn ({type(exc).__name__}: {exc})")
    return notes


def _plot_importances(study):
    from optuna.visualization import matplotlib as optuna_plots

    try:
        return optuna_plots.plot_param_importances(study)
    except ImportError:  # Optuna 4's default evaluator (fANOVA) needs scikit-learn; PED-ANOVA does not
        import optuna

        return optuna_plots.plot_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())


def report(study, tuner_args: TuneArgs, algo: Algo, params: list[Param], out: Path, spec: StorageSpec, plots: bool = True) -> None:
    """The final summary: the best trial, its `fleetrl train` command, trials.csv, the PNGs and the dashboard command."""
    trials = study.get_trials(deepcopy=False)
    counts = study_counts(trials)
    write_trials_csv(trials, params, out / "trials.csv")
    print(f"\nfleetrl tune: study {study.study_name!r}: {plural(len(trials), 'trial')} "
          f"({counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed, {counts['running']} running elsewhere"
          + (f", {counts['queued']} queued: retries of interrupted trials" if counts["queued"] else "") + ")", flush=True)
    best = counts["best"]
    if best is not None:
        print(f"best: trial {best.number}, score {best.value:.6g}" + ("" if tuner_args.target_scores else " (mean return)"))
        width = max((len(p.name) for p in params), default=0)
        for p in params:
            print(f"  {p.name:<{width}}  {format_value(best.params.get(p.name))}")
        flags = [flag for p in params if p.name in best.params for flag in p.flags(best.params[p.name])]
        print("train with them:")
        for env_id in dict.fromkeys(tuner_args.env_ids):
            print(f"  {shlex.join([*algo.base, *flags, '--env-id', env_id])}")
        print(f"its runs: {' '.join(best.user_attrs.get('run_dirs', []))}")
    print(f"trials: {out / 'trials.csv'}")
    if plots:
        for note in write_plots(study, out):
            print(f"plot: {note}")
    print(f"dashboard: optuna-dashboard {shlex.quote(spec.shown)}   (pip install optuna-dashboard)", flush=True)
    failed = [t for t in trials if t.user_attrs.get("fail_reason") and t.user_attrs.get("log")]
    for t in failed[-FAILURES_SHOWN:]:
        print(f"\ntrial {t.number} failed: {t.user_attrs['fail_reason']}\n  log: {t.user_attrs['log']}")
        print("\n".join(f"  | {line}" for line in log_tail(Path(t.user_attrs["log"]), 8)))


# ---- the command ------------------------------------------------------------------------------


class TuneFailed(FleetError):
    """No trial of the study completed."""

    exit_code = 1


class TuneStopped(FleetError):
    """Ctrl-C or SIGTERM: the running trials were stopped and recorded; the same command resumes the study."""


def study_settings(args: TuneArgs, algo: Algo, params: list[Param], report_every: int) -> dict:
    """What defines the study's objective and search: a tuner joining it must bring the same (JSON-shaped, to compare)."""
    settings = {
        "command": algo.base, "env_ids": list(dict.fromkeys(args.env_ids)), "target_scores": sorted(args.target_scores),
        "num_seeds": args.num_seeds, "start_seed": args.start_seed, "aggregate": args.aggregate, "last_episodes": args.last_episodes,
        "report_every": report_every, "search_space": {p.name: p.describe() for p in params},
        "sampler": args.sampler, "random_trials": args.random_trials,
        "pruner": args.pruner, "prune_after_trials": args.prune_after_trials, "prune_warmup": args.prune_warmup,
    }
    return json.loads(json.dumps(settings))


def make_sampler(args: TuneArgs, params: list[Param]):
    import optuna

    if args.sampler == "random":
        return optuna.samplers.RandomSampler(seed=args.sampler_seed)
    if args.sampler == "cmaes":
        if importlib.util.find_spec("cmaes") is None:
            raise FleetError("--sampler cmaes needs the cmaes package. Install it with: pip install 'fleetrl[tune]'  (or: pip install cmaes)")
        return optuna.samplers.CmaEsSampler(n_startup_trials=args.random_trials, seed=args.sampler_seed, warn_independent_sampling=False)
    # multivariate and constant_liar set explicitly: their defaults differ between Optuna 4 and 5
    return optuna.samplers.TPESampler(n_startup_trials=args.random_trials, multivariate=True, constant_liar=True, seed=args.sampler_seed)


def make_pruner(args: TuneArgs, total: int, report_every: int):
    import optuna

    warmup = int(args.prune_warmup * total)
    if args.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=args.prune_after_trials, n_warmup_steps=warmup)
    if args.pruner == "hyperband":
        first = max(report_every, -(-warmup // report_every) * report_every)  # the first rung: a reported step past the warm-up
        return optuna.pruners.HyperbandPruner(min_resource=first, max_resource=max(total, first + 1), reduction_factor=3)
    return optuna.pruners.NopPruner()


def check_args(args: TuneArgs) -> None:
    if not args.env_ids or not all(e.strip() for e in args.env_ids):
        raise FleetError(f"--env-ids needs one or more env ids, none empty, e.g. --env-ids CartPole-v1 Acrobot-v1; got {args.env_ids!r}.")
    config.check_ranges(args, RANGES)
    for name in ("out", "study_name", "storage"):
        value = getattr(args, name)
        if value is not None and not value.strip():
            raise FleetError(f"--{name.replace('_', '-')} is empty: give a value, or leave it out for the default.")
    names = [run_name(e, 0) for e in dict.fromkeys(args.env_ids)]
    if len(set(names)) < len(names):
        raise FleetError("Two of --env-ids map to the same folder name ('/' and ':' become '-'); tune them in separate studies.")


def run_tune(args: TuneArgs, base: list[str]) -> None:
    """Run (or, with --slurm-template, script) the study; raises TuneFailed if no trial of it completed."""
    check_args(args)
    algo = parse_command(base)
    require("optuna", "tune", "`fleetrl tune`")
    params = load_search_space(args.search, algo)
    targets = parse_targets(args.target_scores, list(dict.fromkeys(args.env_ids)))
    total = max(resolved_args(algo, env_id).total_timesteps for env_id in dict.fromkeys(args.env_ids))
    report_every = args.report_every or max(1, total // DEFAULT_REPORTS)
    if report_every > total:
        raise FleetError(f"--report-every {report_every} is past --total-timesteps {total}: no report would happen. Give at most {total}.")
    study_name = args.study_name or f"{algo.name}-{'+'.join(dict.fromkeys(args.env_ids))}"
    out = Path(args.out or os.path.join("runs", f"tune_{study_name.replace('/', '-').replace(':', '-')}"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FleetError(f"Cannot create the output folder {out} ({exc.strerror or exc}). Give another --out.") from None
    spec = parse_storage(args.storage or str(out / "study.log"))
    if args.slurm_template:
        write_slurm_script(args, algo, spec, study_name, out)
        return

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tuner says what happens to each trial itself
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(spec, args.stale_after)
    sampler, pruner = make_sampler(args, params), make_pruner(args, total, report_every)
    lock = StudyLock(spec, storage, study_name)
    with lock.held():  # tuners starting together: one creates the study, the others load it
        try:
            study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler, pruner=pruner, direction="maximize", load_if_exists=True)
        except ValueError as exc:  # e.g. an existing study of the same name that minimises
            raise FleetError(f"Cannot use the study {study_name!r} in {spec.shown}: {exc} Give another --study-name.") from None
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise FleetError(f"The study {study_name!r} in {spec.shown} minimises; `fleetrl tune` maximises the score. Give another --study-name.")
        settings = study_settings(args, algo, params, report_every)
        saved = study.user_attrs.get("fleetrl")
        if saved is None:
            study.set_user_attr("fleetrl", settings)
        elif saved != settings:
            differ = [k for k in settings if saved.get(k) != settings[k]]
            raise FleetError(f"The study {study_name!r} in {spec.shown} was run with other settings ({', '.join(differ)} differ: "
                             + "; ".join(f"{k} was {json.dumps(saved.get(k))}" for k in differ[:3])
                             + "). A study's trials must be comparable: run the same command to resume it, or give a new --study-name.")

    display = Display()
    tuner = Tuner(args, algo, params, targets, study, storage, spec, out, report_every, display)
    before = counted(study.get_trials(deepcopy=False))
    gpus = f", spread over {plural(len(tuner.gpus), 'GPU')}" if tuner.gpus else ""
    display.event(f"fleetrl tune: study {study_name!r} in {spec.shown} has {before} of {args.trials} trials; "
                  f"{plural(tuner.trials_at_once, 'trial')} at once here, each {plural(tuner.runs_per_trial, 'run')} "
                  f"({plural(len(tuner.envs), 'env')} x {plural(len(tuner.seeds), 'seed')}) with {plural(tuner.threads, 'thread')}{gpus}; "
                  f"reports every {report_every:,} steps to the {args.pruner} pruner; output in {out}")
    try:
        tuner.run()
    finally:
        display.close()
    stopped = tuner.stopped_by
    try:
        report(study, args, algo, params, out, spec, plots=stopped is None)
    except Exception as exc:  # noqa: BLE001 - e.g. the database went away: say so in one paragraph
        raise FleetError(f"Cannot read the study {study_name!r} back from {spec.shown} for the report: {type(exc).__name__}: "
                         f"{(str(exc).strip().splitlines() or [''])[0]} The trials are in the storage; run the same command again "
                         f"(with the storage reachable) to write the report.") from None
    if stopped is not None:
        error = TuneStopped(f"stopped by {'SIGTERM' if stopped == signal.SIGTERM else 'Ctrl-C'}: the running trials were stopped, recorded as "
                            f"failed and queued to run again. The same command resumes the study {study_name!r}.")
        error.exit_code = 128 + stopped
        raise error
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        raise TuneFailed(f"No trial of the study {study_name!r} completed (reports above; trials in {out / 'trials.csv'}). "
                         f"Fix the cause and run the same command: failed trials are kept, and --trials counts them.")


# ---- Slurm ------------------------------------------------------------------------------------

SLURM_SCRIPT = """#!/bin/bash
# fleetrl tune as a Slurm job array: {n} tuner workers on the study {study} in {storage}.
# Submit with: sbatch {script}
# Each task is a `fleetrl tune` with --parallel {parallel}; together they run --trials {trials} trials (a global total).
# A task stopped by Slurm fails and queues again its running trials; submitting the array again resumes the study.
# Watch it with: optuna-dashboard {storage_q}
#SBATCH --job-name=fleetrl-tune
#SBATCH --array=0-{last}
#SBATCH --cpus-per-task={cpus}
#SBATCH --output={out}/logs/slurm_%A_%a.out
set -u
: "${{SLURM_ARRAY_TASK_ID:?not set: submit with sbatch, or set SLURM_ARRAY_TASK_ID=0..{last} to run one worker by hand}}"
mkdir -p {out_q}/logs
# workers that open the storage in the same second contend for its lock: start them a little apart
sleep $(( SLURM_ARRAY_TASK_ID * {stagger} ))
exec {command}
"""


def write_slurm_script(args: TuneArgs, algo: Algo, spec: StorageSpec, study_name: str, out: Path) -> Path:
    if spec.kind == "sqlite":
        raise FleetError(f"--slurm-template with an SQLite storage ({spec.shown}): array tasks run on several nodes, and SQLite breaks on a "
                         f"network filesystem. Use a journal file on the shared filesystem (--storage {out.resolve() / 'study.log'}) or PostgreSQL.")
    out = out.resolve()
    storage = str(spec.path.resolve()) if spec.kind == "journal" else spec.url
    chosen = dataclasses.replace(args, out=str(out), search=str(Path(args.search).resolve()), storage=storage, study_name=study_name)
    flags = []
    for f in dataclasses.fields(TuneArgs):
        value = getattr(chosen, f.name)
        if f.name.startswith("slurm_") or f.name == "sampler_seed" or value is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory() if f.default_factory is not dataclasses.MISSING else object()
        if value == default:
            continue
        flag = f"--{f.name.replace('_', '-')}"
        flags += [flag, *map(str, value)] if isinstance(value, list) else [flag if value else f"--no-{f.name.replace('_', '-')}"] \
            if isinstance(value, bool) else [flag, format_value(value)]
    tokens = [shlex.quote(t) for t in ["-m", "fleetrl", "tune", *flags]]
    if args.sampler_seed is not None:  # each worker its own sampler seed, or they would all propose the same trials
        tokens += ["--sampler-seed", f"$(( {args.sampler_seed} + SLURM_ARRAY_TASK_ID ))"]
    command = [f'"${{FLEETRL_PYTHON:-{sys.executable}}}"', *tokens, "--", *(shlex.quote(t) for t in algo.base)]
    path = out / "tune.slurm"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    path.write_text(SLURM_SCRIPT.format(
        n=args.slurm_workers, study=shlex.quote(study_name), storage=spec.shown, storage_q=shlex.quote(spec.shown), script=shlex.quote(str(path)),
        parallel=args.parallel, trials=args.trials, last=args.slurm_workers - 1, cpus=args.slurm_cpus_per_task, out=out,
        out_q=shlex.quote(str(out)), stagger=SLURM_STAGGER_S, command=" ".join(command)))
    path.chmod(0o755)
    print(f"wrote {path}: a Slurm job array of {plural(args.slurm_workers, 'tuner worker')}, each with --parallel {args.parallel} "
          f"on {args.slurm_cpus_per_task} CPU cores, sharing the study {study_name!r} in {spec.shown}.")
    print(f"submit it with: sbatch {path}")
    print(f"watch it with: optuna-dashboard {shlex.quote(spec.shown)}")
    return path
