"""Checkpoints: atomic writes, safe loads (no code is ever unpickled), retention and resume lookup.

A checkpoint is a ``torch.save`` of plain containers, tensors and numbers only, so it loads with
``torch.load(weights_only=True)``. Each write goes to a temporary file in the same folder, is
flushed to disk, then renamed over the final name: a crash mid-write leaves the previous
checkpoints untouched.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fleetrl.errors import FleetError

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"ckpt_(\d+)\.pt")


def checkpoint_path(run_dir: str | Path, global_step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"ckpt_{global_step:012d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(state: dict[str, Any], run_dir: str | Path, keep: int) -> Path:
    """Write ``state`` atomically as the checkpoint for its ``global_step``; keep the newest ``keep``."""
    path = checkpoint_path(run_dir, int(state["global_step"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint file or the newest checkpoint of a run folder, refusing any code payload."""
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise FleetError(
            f"Refused to load {path}: it is not a plain fleetrl checkpoint (it carries pickled objects, "
            f"which could run code; the safe loader stopped at: {str(exc).splitlines()[0]}). "
            f"Only load checkpoints written by fleetrl, from a source you trust."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise FleetError(
            f"Could not read the checkpoint {path}: it is corrupt or truncated ({exc}). "
            f"Resume from an earlier checkpoint in {path.parent}."
        ) from None
    if not isinstance(state, dict) or "model" not in state or "args" not in state:
        raise FleetError(f"{path} is not a fleetrl checkpoint (no model or args in it).")
    return state


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the newest checkpoint inside a run folder."""
    path = Path(path)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR}. Pass a checkpoint file, or a run folder that has one.")
        return found[-1]
    if not path.exists():
        raise FleetError(f"The checkpoint {path} does not exist. Pass a checkpoint file (.pt) or a run folder.")
    return path


def rng_state() -> dict[str, Any]:
    """The global RNG states, in weights_only-loadable form."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "python": [int(x) if isinstance(x, int) else list(x) for x in random.getstate()[1]] + [random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy"]["keys"].numpy().astype(np.uint32), state["numpy"]["pos"], 0, 0.0))
    python = state["python"]
    random.setstate((3, tuple(python[:-1]), python[-1]))
