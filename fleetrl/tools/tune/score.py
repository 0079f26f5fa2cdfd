"""A trial's score: each run's mean return over its last episodes, read from its TensorBoard logs as they grow, each
env's normalised by its targets, aggregated over the envs, then averaged over the seeds."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np

from fleetrl.errors import FleetError
from fleetrl.tools.returns import RETURN_TAG
from fleetrl.tools.scores import parse_env_bounds

EPISODE_TAGS = "charts/episodic_"  # episode scalars: logged at the step each episode ended, before the iteration's other scalars


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
