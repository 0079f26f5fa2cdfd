"""Checkpoints: atomic, checksummed writes; safe loads (no code is ever unpickled); retention and resume
that follow the run's real history.

A checkpoint is two files in ``{run_dir}/checkpoints``:
* ``ckpt_{step}.pt``: a ``torch.save`` of plain containers, tensors and numbers only, so it loads with
  ``torch.load(weights_only=True)``;
* ``ckpt_{step}.json``: its manifest (sha256, size, step, and a write sequence number), written last.
  A ``.pt`` whose bytes do not match its manifest is torn or corrupt and is skipped with a warning. A ``.pt``
  without a manifest (written before manifests existed, or by a run killed between the two renames) is complete,
  since it was renamed into place whole, but unverified: it is used, with a warning, and counts as older than
  every checkpoint that has a manifest. A manifest passed where a checkpoint is asked for names its ``.pt``.

Each file goes to a temporary name in the same folder, is fsynced, renamed over the final name, and the
folder is fsynced, so a crash or a full disk at any moment leaves the earlier checkpoints as they were.

"Newest" means written last (the manifest's sequence number), not the highest step: resuming an older
checkpoint starts a new branch of the run's history, and retention and ``--resume auto`` follow that
branch instead of the abandoned one.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fleetrl.errors import FleetError

CHECKPOINT_DIR = "checkpoints"
FORMAT = 2  # 2: a manifest with a checksum and a write sequence beside every checkpoint
_NAME = re.compile(r"ckpt_(\d+)\.pt")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


class CheckpointWriteError(FleetError):
    """A checkpoint could not be written (disk full, read-only, quota); the earlier ones are intact."""


@dataclass(frozen=True)
class Entry:
    """A checkpoint of a run: its file and what its manifest says (sequence 0: no manifest, unverified)."""

    path: Path
    step: int
    sequence: int


def checkpoint_path(run_dir: str | Path, global_step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"ckpt_{global_step:012d}.pt"


def manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _entries(run_dir: str | Path) -> list[Entry]:
    """The checkpoints of a run, in the order they were written (oldest first): those without a manifest first, by step."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        name = _NAME.fullmatch(p.name)
        if not name:
            continue
        if not manifest_path(p).exists():  # unverified, but whole: it was renamed into place
            found.append(Entry(p, int(name.group(1)), 0))
            continue
        try:
            m = json.loads(manifest_path(p).read_text())
            found.append(Entry(p, int(m["global_step"]), int(m["sequence"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an unreadable manifest: the loader would refuse it, so it is not offered
    return sorted(found, key=lambda e: (e.sequence, e.step))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's committed checkpoints, in the order they were written (the newest last)."""
    return [e.path for e in _entries(run_dir)]


def save_checkpoint(state: dict[str, Any], run_dir: str | Path, keep: int) -> Path:
    """Write ``state`` as the checkpoint for its ``global_step``, then keep the ``keep`` newest written.

    Raises :class:`CheckpointWriteError` if anything fails; the earlier checkpoints are untouched then.
    """
    path = checkpoint_path(run_dir, int(state["global_step"]))
    entries = _entries(run_dir)
    buffer = io.BytesIO()
    torch.save(state, buffer)  # serialise in memory first: a failure below is only ever an I/O failure
    data = buffer.getbuffer()
    manifest = {"format": FORMAT, "global_step": int(state["global_step"]), "sequence": max((e.sequence for e in entries), default=0) + 1,
                "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "algo": state.get("algo")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path.parent)
        _write_atomically(path, data)
        _write_atomically(manifest_path(path), json.dumps(manifest, indent=1).encode())  # the commit marker, last
    except (OSError, RuntimeError) as exc:
        for file in (manifest_path(path), path):  # a file without its manifest would be taken for an older, unverified one
            with contextlib.suppress(OSError):
                file.unlink(missing_ok=True)
        raise CheckpointWriteError(f"Could not write the checkpoint {path}: {exc}.") from None
    committed = _entries(run_dir)
    for old in committed[:-keep] if keep > 0 else []:
        for file in (manifest_path(old.path), old.path):  # the manifest first: a half-removed one is not listed
            file.unlink(missing_ok=True)
    return path


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # ENOSPC and EDQUOT can surface here, not at write()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _remove_stale_temporaries(folder: Path) -> None:
    """Temporary files that a killed writer left behind."""
    for p in folder.glob(".ckpt_*.tmp-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            p.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, algo: str | None = None) -> dict[str, Any]:
    """Load a checkpoint file, or the newest checkpoint of a run folder that verifies, refusing any code payload.

    For a run folder, a torn or corrupt newest checkpoint is skipped with a warning, and the one written
    before it is tried. ``algo``: refuse a checkpoint written by another algorithm.
    """
    return load_checkpoint_and_path(path, algo)[0]


def load_checkpoint_and_path(path: str | Path, algo: str | None = None) -> tuple[dict[str, Any], Path]:
    """:func:`load_checkpoint`, and the file it loaded."""
    path = _named_by_manifest(Path(path))
    if path.is_dir():
        entries = _entries(path)
        if not entries:
            raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR}. Pass a checkpoint file, or a run folder that has one.")
        for entry in reversed(entries):
            try:
                return _check_algo(_load_verified(entry.path), entry.path, algo), entry.path
            except _Unusable as exc:
                print(f"fleetrl: warning: skipping the checkpoint {entry.path}: {exc}", file=sys.stderr, flush=True)
        raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR} verifies (each was skipped above). "
                         f"Start the run afresh in a new --run-dir.")
    if not path.exists():
        raise FleetError(f"The checkpoint {path} does not exist. Pass a checkpoint file (.pt) or a run folder.")
    try:
        return _check_algo(_load_verified(path), path, algo), path
    except _Unusable as exc:
        raise FleetError(f"Could not use the checkpoint {path}: {exc} Pass an earlier checkpoint of its run ({path.parent}).") from None


def _named_by_manifest(path: Path) -> Path:
    """A checkpoint's manifest (``ckpt_*.json``) stands for its checkpoint file."""
    if path.suffix == ".json" and _NAME.fullmatch(path.with_suffix(".pt").name) and path.with_suffix(".pt").exists():
        return path.with_suffix(".pt")
    return path


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given (or named by its manifest), or the newest checkpoint inside a run folder."""
    path = _named_by_manifest(Path(path))
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR}. Pass a checkpoint file, or a run folder that has one.")
        return found[-1]
    if not path.exists():
        raise FleetError(f"The checkpoint {path} does not exist. Pass a checkpoint file (.pt) or a run folder.")
    return path


class _Unusable(Exception):
    """Why a checkpoint file cannot be used (torn, corrupt, not a checkpoint)."""


def _load_verified(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unusable(f"it cannot be read ({exc}).") from None
    manifest = manifest_path(path)
    if manifest.exists():  # a file passed by hand may come without its manifest: then it is only parsed
        try:
            m = json.loads(manifest.read_text())
            expected_size, expected_sha = int(m["size"]), str(m["sha256"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _Unusable(f"its manifest {manifest.name} is unreadable ({exc}).") from None
        if len(data) != expected_size:
            raise _Unusable(f"it is torn: {len(data):,} bytes where its manifest says {expected_size:,}.")
        if hashlib.sha256(data).hexdigest() != expected_sha:
            raise _Unusable("it is corrupt: its sha256 does not match its manifest.")
    elif _NAME.fullmatch(path.name) and (path.parent.name == CHECKPOINT_DIR):
        print(f"fleetrl: warning: {path} has no manifest ({manifest.name}), so its checksum cannot be verified.", file=sys.stderr, flush=True)
    how = "Pass a checkpoint file (a run's checkpoints/ckpt_*.pt) or a run folder that has one."
    if not data:
        raise FleetError(f"{path} is empty, not a fleetrl checkpoint. {how}")
    if not data.startswith(ZIP_MAGIC):
        raise FleetError(f"{path} is not a fleetrl checkpoint (it is not a file written by torch.save). {how}")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise FleetError(
            f"Refused to load {path}: it is not a plain fleetrl checkpoint (it carries pickled objects, "
            f"which could run code; the safe loader stopped at: {_first_line(exc)}). "
            f"Only load checkpoints written by fleetrl, from a source you trust."
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever a damaged archive makes torch raise, the answer is the same
        raise _Unusable(f"it is corrupt or truncated, or not a checkpoint ({type(exc).__name__}: {_first_line(exc)}).") from None
    if not isinstance(state, dict) or "args" not in state or "global_step" not in state:
        raise _Unusable("it is not a fleetrl checkpoint (no args or global step in it).")
    return state


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _check_algo(state: dict[str, Any], path: Path, algo: str | None) -> dict[str, Any]:
    saved = state.get("algo")
    if algo is not None and saved is not None and saved != algo:
        raise FleetError(f"The checkpoint {path} was written by {saved}, not {algo}. "
                         f"Resume it with `fleetrl train {saved}`, or start {algo} in a new --run-dir.")
    return state


def check_compatible(state: dict[str, Any], path: str, obs_shape: tuple[int, ...], action_shape: tuple[int, ...], env_id: str) -> None:
    """Refuse a checkpoint whose env had other observation or action shapes than the env built now."""
    saved_obs, saved_act = state.get("obs_shape"), state.get("action_shape")
    if saved_obs is None or saved_act is None:
        return  # written before the shapes were saved: the model load below still checks its tensors
    if tuple(saved_obs) != tuple(obs_shape) or tuple(saved_act) != tuple(action_shape):
        saved_env = state.get("args", {}).get("env_id", "?")
        raise FleetError(
            f"The checkpoint {path} was trained on {saved_env} with observations of shape {tuple(saved_obs)} and actions "
            f"{tuple(saved_act)}, but {env_id} has observations {tuple(obs_shape)} and actions {tuple(action_shape)}. "
            f"Use the checkpoint with the env it was trained on (leave --env-id out to take the saved one)."
        )


def rng_state() -> dict[str, Any]:
    """This process's global RNG states (torch, CUDA, numpy with its cached Gaussian, Python), in weights_only-loadable form."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "python": [int(x) if isinstance(x, int) else list(x) for x in random.getstate()[1]] + [random.getstate()[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n.get("has_gauss", 0), n.get("cached_gaussian", 0.0)))
    python = state["python"]
    random.setstate((3, tuple(python[:-1]), python[-1]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
