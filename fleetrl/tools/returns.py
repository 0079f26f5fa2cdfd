"""A run's episodic returns as its TensorBoard logs hold them, and its final return: the mean of the last few."""

from __future__ import annotations

from pathlib import Path

import numpy as np

RETURN_TAG = "charts/episodic_return"
FINAL_POINTS = 10  # the final return is the mean of this many last episodic returns


def final_return(run_dir: Path, last: int = FINAL_POINTS) -> float | None:
    """Mean of the last ``last`` episodic returns the run logged, or None if it logged none."""
    if not run_dir.is_dir():
        return None
    from fleetrl.monitor.tbread import read_scalars  # tensorboard is slow to import; only when needed

    return mean_of_last(read_scalars(run_dir, RETURN_TAG), last)


def mean_of_last(points: list, last: int = FINAL_POINTS) -> float | None:
    """A run's final return from its ``RETURN_TAG`` points (tbread.Point), or None if there are none."""
    return float(np.mean([p.value for p in points[-last:]])) if points else None
