"""Statistics that hold up, on rliable: IQM, median, mean and optimality gap with 95% stratified bootstrap confidence
intervals, the probability of improvement, performance profiles and IQM curves; seeded, so every interval repeats."""

from __future__ import annotations

import contextlib
import csv
import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fleetrl import config
from fleetrl.errors import require
from fleetrl.tools.scores import Scale, env_scales

METRICS = ("IQM", "median", "mean", "optimality gap")
CONFIDENCE = 0.95
MIN_RUNS = 2  # one run has no spread: its "interval" would be a point, which says nothing
ALL_ENVS = "all envs"
TITLE = "IQM, median, mean, optimality gap: 95% stratified bootstrap confidence intervals over runs"
INTERVAL_HEADER = ["env", "score", "runs", *(f"{name} [95% CI]" for name in METRICS)]


@dataclass
class StatsArgs:
    normalize: Literal["auto", "human", "minmax", "none"] = "auto"
    """how returns become scores: auto (--score-bounds where given, else human-normalised for the 57 Atari games, else the return), human (Atari human-normalised, every env), minmax (--score-bounds for every env), none (the return)"""
    score_bounds: list[str] = field(default_factory=list)
    """ENV=LO,HI: ENV's score is (return - LO) / (HI - LO), e.g. CartPole-v1=0,500 Acrobot-v1=-500,0"""
    bootstrap_reps: int = 2000
    """bootstrap resamples behind each confidence interval"""
    bootstrap_seed: int = 0
    """seed of the bootstrap: the same scores and seed give the same intervals"""


RANGES = {"bootstrap_reps": config.count("bootstrap resamples per interval", low=100, high=1_000_000), "bootstrap_seed": config.SEED}


def check_args(args: StatsArgs, env_ids: list[str], env_source: str) -> dict[str, Scale]:
    """Refuse bad statistics flags before anything runs; each env's :class:`Scale`."""
    config.check_ranges(args, RANGES)
    return env_scales(args.normalize, args.score_bounds, env_ids, env_source)


def available() -> bool:
    """Whether rliable (the 'stats' extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("rliable") is not None


@functools.cache  # the bootstrap calls the metrics thousands of times
def require_rliable():
    """rliable's library and metrics modules, or a clear error naming the extra that installs them."""
    library = require("rliable.library", "stats", "Confidence intervals")
    return library, require("rliable.metrics", "stats", "Confidence intervals")


@contextlib.contextmanager
def seeded_numpy(seed: int):
    """rliable draws its bootstrap indices from numpy's global RNG (``np.random.choice`` in
    ``StratifiedBootstrap.update_indices``; arch's own generator is not used for them): seed it for repeatable
    intervals, and hand the caller's RNG state back untouched."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its confidence interval."""

    point: float
    low: float
    high: float

    def cell(self, decimals: int | None = None) -> str:
        """``point [low, high]``, all three with ``decimals``, or with the decimals the largest of them needs."""
        size = max(abs(self.point), abs(self.low), abs(self.high))
        decimals = decimals if decimals is not None else 1 if size >= 100 else 2 if size >= 1 else 3
        return f"{self.point:.{decimals}f} [{self.low:.{decimals}f}, {self.high:.{decimals}f}]"


def metric_values(scores: np.ndarray, normalised: bool) -> np.ndarray:
    """IQM, median, mean and (normalised scores only: raw returns have no target) the optimality gap of a runs x envs
    array, as rliable defines them, but one env's median is its median run: rliable's median is over envs (of each
    env's mean), which for a single env is its mean again."""
    _, metrics = require_rliable()
    median = np.median(scores) if scores.shape[1] == 1 else metrics.aggregate_median(scores)
    values = [metrics.aggregate_iqm(scores), median, metrics.aggregate_mean(scores)]
    return np.array(values + ([metrics.aggregate_optimality_gap(scores)] if normalised else []), dtype=np.float64)


def interval_estimates(scores: np.ndarray, normalised: bool, reps: int, seed: int) -> dict[str, Estimate]:
    """The metrics of a runs x envs array of scores, each with its 95% stratified bootstrap interval (the runs of each
    env resampled, the envs kept): {metric name: Estimate}, without the optimality gap for raw returns."""
    library, _ = require_rliable()
    scores = np.asarray(scores, dtype=np.float64)
    with seeded_numpy(seed):
        points, intervals = library.get_interval_estimates(
            {"x": scores}, lambda s: metric_values(s, normalised), reps=reps, confidence_interval_size=CONFIDENCE
        )
    point, (low, high) = points["x"], intervals["x"]
    return {name: Estimate(float(point[i]), float(low[i]), float(high[i])) for i, name in enumerate(METRICS[: len(point)])}


def probability_of_improvement(x: np.ndarray, y: np.ndarray, reps: int, seed: int) -> Estimate:
    """P(X > Y): the probability that a run of X scores above a run of Y of the same env (Mann-Whitney U over
    n_x n_y, ties counting half), averaged over the envs, with its interval. ``x`` and ``y`` are runs x envs with the
    envs in the same order; their run counts may differ (each is resampled on its own)."""
    library, metrics = require_rliable()
    with seeded_numpy(seed):
        points, intervals = library.get_interval_estimates(
            {"x,y": (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))}, metrics.probability_of_improvement,
            reps=reps, confidence_interval_size=CONFIDENCE,
        )  # fmt: skip
    low, high = np.ravel(intervals["x,y"])
    return Estimate(float(points["x,y"]), float(low), float(high))


def performance_profile(scores: np.ndarray, taus: np.ndarray, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fraction of runs (over all envs) that score above each tau, and its interval (2 x taus)."""
    library, _ = require_rliable()
    with seeded_numpy(seed):
        profiles, intervals = library.create_performance_profile({"x": np.asarray(scores, dtype=np.float64)}, taus, reps=reps,
                                                                 confidence_interval_size=CONFIDENCE)
    return profiles["x"], intervals["x"]


def iqm_curve(curves: np.ndarray, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The IQM over runs and envs at each point of a runs x envs x points array, and its interval (2 x points)."""
    library, _ = require_rliable()
    from scipy.stats import trim_mean

    def iqm_per_point(scores: np.ndarray) -> np.ndarray:
        # rliable's aggregate_iqm (trim_mean over runs and envs, 25% cut at each end) of every point in one call
        return trim_mean(scores.reshape(-1, scores.shape[-1]), 0.25, axis=0)

    with seeded_numpy(seed):
        points, intervals = library.get_interval_estimates({"x": np.asarray(curves, dtype=np.float64)}, iqm_per_point, reps=reps,
                                                           confidence_interval_size=CONFIDENCE)
    return points["x"], intervals["x"]


# ---- scores of one configuration, and its table rows --------------------------------------------


def stack_runs(by_env: dict[str, np.ndarray]) -> tuple[np.ndarray, int | None]:
    """A runs x envs array of per-env run scores (each in run order): the stratified bootstrap needs as many runs of
    every env, so envs with more keep their first ones. Returns the array and, if some were left out, the count kept."""
    kept = min(len(scores) for scores in by_env.values())
    array = np.stack([np.asarray(scores[:kept], dtype=np.float64) for scores in by_env.values()], axis=1)
    return array, (kept if any(len(scores) > kept for scores in by_env.values()) else None)


@dataclass
class IntervalRow:
    """One line of an interval table: an env, or all envs together."""

    env: str
    score: str  # how returns became scores: "return", "human-normalised (...)", "min-max (...)", "normalised"
    runs: int
    estimates: dict[str, Estimate] | None  # None: fewer than MIN_RUNS runs
    note: str = ""

    def cells(self) -> list[str]:
        runs = f"{self.runs}" + (f" ({self.note})" if self.note else "")
        shown = [self.estimates[name].cell() if self.estimates and name in self.estimates else "-" for name in METRICS]
        return [self.env, self.score, runs, *shown]

    def record(self) -> dict:
        """The row for a CSV: each metric as value, low and high."""
        row: dict = {"env_id": self.env, "score": self.score, "runs": self.runs}
        for name in METRICS:
            estimate = (self.estimates or {}).get(name)
            key = name.replace(" ", "_").lower()
            for part in ("point", "low", "high"):
                row[key if part == "point" else f"{key}_{part}"] = None if estimate is None else getattr(estimate, part)
        return row


def can_aggregate(scales: dict[str, Scale]) -> bool:
    """Scores of several envs add up only once each is normalised."""
    return len(scales) > 1 and all(scale.normalised for scale in scales.values())


def interval_rows(returns_by_env: dict[str, list[float]], scales: dict[str, Scale], args: StatsArgs) -> list[IntervalRow]:
    """A row per env and, when every env is normalised and there are several, one over all envs. ``returns_by_env``
    holds each env's final returns in run (seed) order."""
    rows = []
    scores = {env: scales[env].apply(returns) for env, returns in returns_by_env.items()}
    for env, env_scores in scores.items():
        enough = len(env_scores) >= MIN_RUNS
        estimates = interval_estimates(env_scores[:, None], scales[env].normalised, args.bootstrap_reps, args.bootstrap_seed) if enough else None
        rows.append(IntervalRow(env, scales[env].describe(), len(env_scores), estimates, "" if enough else f"intervals need {MIN_RUNS}+"))
    if can_aggregate(scales) and all(len(s) >= MIN_RUNS for s in scores.values()):
        array, kept = stack_runs(scores)
        estimates = interval_estimates(array, True, args.bootstrap_reps, args.bootstrap_seed)
        per_env = f"x {array.shape[1]} envs" + (f", the first {kept} of each" if kept else "")
        rows.append(IntervalRow(ALL_ENVS, "normalised", array.shape[0], estimates, per_env))
    return rows


def aggregate_note(scales: dict[str, Scale]) -> str | None:
    """Why there is no row over all envs, when there are several envs; None when there is one or it is there."""
    raw = [env for env, scale in scales.items() if not scale.normalised]
    if len(scales) < 2 or not raw:
        return None
    return (f"No row over all envs: the returns of {' '.join(raw)} are not normalised, and returns of different envs do not "
            f"add up. Give them --score-bounds ENV=LO,HI (e.g. {raw[0]}=LO,HI, LO a random policy's return, HI the best) to get one.")


def explain(args: StatsArgs) -> str:
    """What the interval table shows, in a sentence, with what it takes to get the same numbers again."""
    return (f"A run's score is its final return (scaled as the score column says); IQM: the mean of the middle 50% of the "
            f"runs; median: over runs (over all envs: of the envs' means); optimality gap: how far the runs fall short of a "
            f"normalised score of 1. Intervals: 95% stratified bootstrap, {args.bootstrap_reps} resamples, "
            f"--bootstrap-seed {args.bootstrap_seed} (the same runs and seed give the same numbers).")


def write_csv(path, rows: list[IntervalRow]) -> None:
    """One line per row of the table, each metric as value, low and high (empty where there is none)."""
    if not rows:
        return
    records = [row.record() for row in rows]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in record.items()} for record in records)
