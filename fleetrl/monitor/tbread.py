"""Read scalars back from a run's TensorBoard event files (for tests, the benchmark runner and plots)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Point(NamedTuple):
    step: int
    value: float
    wall_time: float


def read_scalars(run_dir: str | Path, tag: str) -> list[Point]:
    """Every point of ``tag`` in the run folder, as TensorBoard shows it.

    The folder is read as one stream, so a resumed run's ``purge_step`` drops what the
    interrupted run wrote after its last checkpoint, exactly as TensorBoard does.
    """
    acc = _accumulator(run_dir, scalars=0)
    if tag not in acc.Tags().get("scalars", []):
        return []
    return [Point(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]


def _accumulator(run_dir: str | Path, scalars: int):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": scalars, "tensors": 0, "images": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalar_tags(run_dir: str | Path) -> set[str]:
    return set(_accumulator(run_dir, scalars=1).Tags().get("scalars", []))
