"""Read scalars back from a run's TensorBoard event files (for tests, the benchmark runner and plots)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from fleetrl.errors import FleetError


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
    return _reload(acc, run_dir)


def _reload(acc, run_dir: str | Path):
    """``acc.Reload()``, with a folder that is gone (deleted or moved while a tool reads it) one paragraph, not
    tensorboard's traceback."""
    from tensorboard.backend.event_processing.directory_watcher import DirectoryDeletedError

    try:
        acc.Reload()
    except DirectoryDeletedError:
        raise FleetError(f"The run folder {run_dir} is gone: it was deleted or moved while fleetrl read its TensorBoard "
                         "logs (or it never existed). Check the path, or rerun the command once the run folder is back in "
                         "place (a run that is still writing it is fine).") from None
    return acc


def scalar_tags(run_dir: str | Path) -> set[str]:
    return set(_accumulator(run_dir, scalars=1).Tags().get("scalars", []))


def read_text(run_dir: str | Path) -> dict[str, str]:
    """The run's text notes (``Logger.text``: the env backend, the thread plan, the stepping plan, ...), by name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = _reload(EventAccumulator(str(run_dir), size_guidance={"tensors": 0}), run_dir)
    notes = {}
    for tag in acc.Tags().get("tensors", []):
        events = acc.Tensors(tag)
        if events:
            value = tensor_util.make_ndarray(events[-1].tensor_proto)
            notes[tag.removesuffix("/text_summary")] = value.item().decode() if value.size == 1 else str(value)
    return notes
