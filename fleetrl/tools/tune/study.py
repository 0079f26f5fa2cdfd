"""The study: created or joined under the study lock with its sampler and pruner, refused when it was run with other
settings, and its trials counted the way --trials counts them."""

from __future__ import annotations

import importlib.util
import json
import warnings
from typing import Any

from fleetrl.errors import FleetError
from fleetrl.tools.tune.args import TuneArgs
from fleetrl.tools.tune.space import Param
from fleetrl.tools.tune.storage import StorageSpec, StudyLock
from fleetrl.tools.tune.train_command import Algo


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


def make_sampler(args: TuneArgs):
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


def open_study(args: TuneArgs, settings: dict, storage: Any, spec: StorageSpec, study_name: str, sampler: Any, pruner: Any):
    """Create the study, or join it; tuners starting together take the study lock, so one creates it and the others load
    it. A study that minimises, or that was run with other ``settings``, is refused."""
    import optuna

    with StudyLock(spec, storage, study_name).held():
        try:
            study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler, pruner=pruner, direction="maximize", load_if_exists=True)
        except ValueError as exc:  # e.g. an existing study of the same name that minimises
            raise FleetError(f"Cannot use the study {study_name!r} in {spec.shown}: {exc} Give another --study-name.") from None
        if study.direction != optuna.study.StudyDirection.MAXIMIZE:
            raise FleetError(f"The study {study_name!r} in {spec.shown} minimises; `fleetrl tune` maximises the score. Give another --study-name.")
        saved = study.user_attrs.get("fleetrl")
        if saved is None:
            study.set_user_attr("fleetrl", settings)
        elif saved != settings:
            differ = [k for k in settings if saved.get(k) != settings[k]]
            raise FleetError(f"The study {study_name!r} in {spec.shown} was run with other settings ({', '.join(differ)} differ: "
                             + "; ".join(f"{k} was {json.dumps(saved.get(k))}" for k in differ[:3])
                             + "). A study's trials must be comparable: run the same command to resume it, or give a new --study-name.")
    return study


def quiet_optuna() -> None:
    """The tuner says what happens to each trial itself; Optuna's own lines and its "experimental" warnings would bury it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# ---- counting trials ----------------------------------------------------------------------------


def failed_for_good(trials: list) -> list:
    """The FAIL trials, less those queued to run again (interrupted, or their tuner died): their retries stand for them."""
    from optuna.trial import TrialState

    retried = {t.user_attrs.get("retry_of") for t in trials}
    return [t for t in trials if t.state == TrialState.FAIL and t.number not in retried]


def counted(trials: list) -> int:
    """Trials that count toward --trials: complete, pruned, running, and failed for good (not the queued ones)."""
    from optuna.trial import TrialState

    return sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)) + len(failed_for_good(trials))


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
