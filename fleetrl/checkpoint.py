"""Checkpoints: atomic, checksummed writes; safe loads (no code is ever unpickled); retention and resume
that follow the run's real history.

A checkpoint is these files in ``{run_dir}/checkpoints``:
* ``ckpt_{step}.pt``: a ``torch.save`` of plain containers, tensors and numbers only, so it loads with
  ``torch.load(weights_only=True)``;
* ``ckpt_{step}.rank{r}.pt`` (only with large per-rank state, such as ``--save-buffer``'s replay shards): rank
  ``r``'s own file, streamed by that rank from its own memory (never gathered, never held twice);
* ``ckpt_{step}.json``: its manifest (sha256 and size of the ``.pt`` and of every shard, step, and a write sequence
  number), written last, once every file is in place: the commit marker.
  A checkpoint whose files do not match its manifest (torn, corrupt, a shard missing) is skipped with a warning. A
  ``.pt`` without a manifest (written before manifests existed, or by a run killed between the renames) is complete,
  since it was renamed into place whole, but unverified: it is used, with a warning, and counts as older than
  every checkpoint that has a manifest. A manifest passed where a checkpoint is asked for names its ``.pt``.

Each file is streamed to a temporary name in the same folder (hashed as it is written), fsynced, renamed over the
final name, and the folder is fsynced, so a crash or a full disk at any moment leaves the earlier checkpoints as
they were.

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from fleetrl import files
from fleetrl.errors import FleetError

CHECKPOINT_DIR = "checkpoints"
FORMAT = 3  # 2: a manifest with a checksum and a write sequence beside every checkpoint; 3: and per-rank shard files
_NAME = re.compile(r"ckpt_(\d+)\.pt")
_SHARD_NAME = re.compile(r"(ckpt_\d+)\.rank(\d+)\.pt")
READ_CHUNK = 1 << 20  # bytes hashed at a time when a shard is verified
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


def shard_path(run_dir: str | Path, global_step: int, rank: int) -> Path:
    """Rank ``rank``'s own file of the checkpoint at ``global_step``."""
    main = checkpoint_path(run_dir, global_step)
    return main.with_name(f"{main.stem}.rank{rank}.pt")


def manifest_path(path: Path) -> Path:
    return path.with_suffix(".json")


def run_folder_of(path: Path) -> Path | None:
    """The run folder a checkpoint file lies in (``RUN`` for ``RUN/checkpoints/ckpt_*.pt``); None for a file kept
    elsewhere. Never the run folder saved in the checkpoint, which could point anywhere."""
    return path.parent.parent if path.parent.name == CHECKPOINT_DIR else None


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


def write_shard(state: dict[str, Any], run_dir: str | Path, global_step: int, rank: int) -> dict[str, Any]:
    """Write rank ``rank``'s own part of the checkpoint at ``global_step`` (its replay shard) to its own file, streamed
    from the tensors' memory; return the file's manifest entry. Rank 0's :func:`save_checkpoint` commits it.

    Raises :class:`CheckpointWriteError` if it fails, having removed its file; the earlier checkpoints are untouched.
    """
    path = shard_path(run_dir, global_step, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.remove_stale_temporaries(path.parent, "ckpt_")  # each rank its own machine's: another machine's writer may be alive
        size, sha256 = _write_atomically(path, lambda f: torch.save(state, f))
    except (OSError, RuntimeError) as exc:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise CheckpointWriteError(f"Could not write the checkpoint shard {path}: {exc}.") from None
    return {"rank": rank, "name": path.name, "size": size, "sha256": sha256, "holds": sorted(state)}


def save_checkpoint(state: dict[str, Any], run_dir: str | Path, keep: int, shards: Sequence[dict[str, Any]] = ()) -> Path:
    """Write ``state`` as the checkpoint for its ``global_step``, commit it with the ``shards`` its ranks wrote
    (:func:`write_shard`'s entries), then keep the ``keep`` newest written.

    Raises :class:`CheckpointWriteError` if anything fails; this checkpoint's files (its shards too) are removed then,
    and the earlier checkpoints are untouched.
    """
    path = checkpoint_path(run_dir, int(state["global_step"]))
    entries = _entries(run_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.remove_stale_temporaries(path.parent, "ckpt_")
        size, sha256 = _write_atomically(path, lambda f: torch.save(state, f))
        manifest = {"format": FORMAT, "global_step": int(state["global_step"]), "sequence": max((e.sequence for e in entries), default=0) + 1,
                    "size": size, "sha256": sha256, "algo": state.get("algo"), "shards": list(shards)}
        _write_atomically(manifest_path(path), lambda f: f.write(json.dumps(manifest, indent=1).encode()))  # the commit marker, last
    except (OSError, RuntimeError) as exc:
        for file in (manifest_path(path), path):  # a file without its manifest would be taken for an older, unverified one
            with contextlib.suppress(OSError):
                file.unlink(missing_ok=True)
        remove_stale_shards(run_dir, [p.name for p in list_checkpoints(run_dir)])
        raise CheckpointWriteError(f"Could not write the checkpoint {path}: {exc}.") from None
    committed = _entries(run_dir)
    for old in committed[:-keep] if keep > 0 else []:
        for file in (manifest_path(old.path), old.path):  # the manifest first: a half-removed one is not listed
            file.unlink(missing_ok=True)
    remove_stale_shards(run_dir, [p.name for p in list_checkpoints(run_dir)])
    return path


def remove_stale_shards(run_dir: str | Path, kept: Collection[str]) -> None:
    """Remove the shard files whose checkpoint is not in ``kept`` (names of checkpoint files): those of checkpoints that
    retention removed or whose write failed, and those a killed run left. Under torchrun every rank calls it with rank
    0's list, so that shards on storage that is not shared (each node's own disk) go too."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        name = _SHARD_NAME.fullmatch(p.name)
        if name and f"{name.group(1)}.pt" not in kept:
            with contextlib.suppress(OSError):  # on shared storage another rank may remove it first
                p.unlink(missing_ok=True)


class _HashingWriter:
    """A write-only file that hashes and counts what goes through it: a checkpoint is hashed as it is written, never
    held whole in memory. It keeps the ``OSError`` of a failed write, which torch reports as its own RuntimeError."""

    def __init__(self, f: BinaryIO):
        self.f, self.size, self.sha256, self.error = f, 0, hashlib.sha256(), None

    def write(self, data: Any) -> int:
        try:
            written = self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self.f.flush()


def _write_atomically(path: Path, write: Callable[[BinaryIO], Any]) -> tuple[int, str]:
    """Stream ``write(file)`` into a temporary file beside ``path``, renamed over it with the file and the rename fsync'd
    (:func:`fleetrl.files.atomic_file`); return the size and sha256 of what was written."""
    with files.atomic_file(path, durable=True) as f:
        out = _HashingWriter(f)
        try:
            write(out)
        except RuntimeError:
            if out.error is None:
                raise
            raise out.error from None  # the OSError says why (ENOSPC), torch's RuntimeError does not
    return out.size, out.sha256.hexdigest()


def temporary_bytes(run_dir: str | Path) -> int:
    """The bytes in the run's checkpoint files being written (their temporary files, every rank's where the folder is
    shared): what grows while a checkpoint is in progress (fleetrl/parent_watch.py lets it finish)."""
    total = 0
    for p in files.temporaries(Path(run_dir) / CHECKPOINT_DIR, "ckpt_"):
        with contextlib.suppress(OSError):  # renamed into place meanwhile
            total += p.stat().st_size
    return total


def load_checkpoint(path: str | Path, algo: str | None = None) -> dict[str, Any]:
    """Load a checkpoint file, or the newest checkpoint of a run folder that verifies, refusing any code payload.

    For a run folder, a torn or corrupt newest checkpoint (a shard of it included) is skipped with a warning, and the
    one written before it is tried. ``algo``: refuse a checkpoint written by another algorithm.
    """
    return load_checkpoint_and_path(path, algo)[0]


def load_checkpoint_and_path(path: str | Path, algo: str | None = None) -> tuple[dict[str, Any], Path]:
    """:func:`load_checkpoint`, and the file it loaded."""
    state, path, _ = choose_checkpoint(path, algo)
    return state, path


ShardCheck = Callable[[Path, dict[str, Any], list[dict[str, Any]]], "str | None"]


def every_shard_verifies(path: Path, state: dict[str, Any], shards: list[dict[str, Any]]) -> str | None:
    """Why the shards of the checkpoint ``path`` make it unusable (one missing, torn or corrupt), or None."""
    problems = [f"its shard {s['name']} {problem}" for s in shards if (problem := verify_shard(path.parent, s))]
    return "; ".join(problems) + "." if problems else None


def choose_checkpoint(source: str | Path, algo: str | None = None,
                      check_shards: ShardCheck = every_shard_verifies) -> tuple[dict[str, Any], Path, list[dict[str, Any]]]:
    """The checkpoint ``source`` names, its file and its manifest's shard entries. ``source``: a checkpoint file (or its
    manifest), or a run folder: its newest checkpoint whose files verify, skipping the others with a warning.

    ``check_shards(path, state, shards)`` says why a checkpoint's shards make it unusable, or None: by default every
    shard must verify; a resume under torchrun has each rank verify its own (fleetrl/run.py).
    """
    path = _named_by_manifest(Path(source))
    if path.is_dir():
        entries = _entries(path)
        if not entries:
            raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR}. Pass a checkpoint file, or a run folder that has one.")
        for entry in reversed(entries):
            try:
                state, shards = _load_usable(entry.path, algo, check_shards)
                return state, entry.path, shards
            except _Unusable as exc:
                print(f"fleetrl: warning: skipping the checkpoint {entry.path}: {exc}", file=sys.stderr, flush=True)
        raise FleetError(f"No checkpoint in {path / CHECKPOINT_DIR} verifies (each was skipped above). "
                         f"Start the run afresh in a new --run-dir.")
    if not path.exists():
        raise FleetError(f"The checkpoint {path} does not exist. Pass a checkpoint file (.pt) or a run folder.")
    try:
        state, shards = _load_usable(path, algo, check_shards)
        return state, path, shards
    except _Unusable as exc:
        raise FleetError(f"Could not use the checkpoint {path}: {exc} Pass an earlier checkpoint of its run ({path.parent}).") from None


def _load_usable(path: Path, algo: str | None, check_shards: ShardCheck) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    state, shards = _load_verified(path)
    _check_algo(state, path, algo)
    problem = check_shards(path, state, shards) if shards else None
    if problem:
        raise _Unusable(problem)
    return state, shards


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


def _load_verified(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The state in the checkpoint file ``path`` (checked against its manifest, if it has one) and its manifest's shards."""
    shards: list[dict[str, Any]] = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unusable(f"it cannot be read ({exc}).") from None
    manifest = manifest_path(path)
    if manifest.exists():  # a file passed by hand may come without its manifest: then it is only parsed
        try:
            m = json.loads(manifest.read_text())
            expected_size, expected_sha = int(m["size"]), str(m["sha256"])
            shards = [_shard_entry(s) for s in m.get("shards", [])]
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
    return state, shards


def _shard_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A manifest's shard entry, checked: a plain shard file name (no path), a rank, a size and a checksum."""
    if not _SHARD_NAME.fullmatch(str(entry["name"])):
        raise ValueError(f"{entry['name']!r} is not a shard file name")
    return {**entry, "rank": int(entry["rank"]), "size": int(entry["size"]), "sha256": str(entry["sha256"])}


def verify_shard(folder: Path, entry: dict[str, Any]) -> str | None:
    """Why the shard a manifest's ``entry`` names, in ``folder``, cannot be used (missing, torn, corrupt), or None.
    It is hashed a chunk at a time, never read whole."""
    path = folder / entry["name"]
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != entry["size"]:
                return f"is torn: {size:,} bytes where the manifest says {entry['size']:,}"
            chunk = memoryview(bytearray(READ_CHUNK))
            while read := f.readinto(chunk):
                digest.update(chunk[:read])
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if digest.hexdigest() != entry["sha256"]:
        return "is corrupt: its sha256 does not match the manifest"
    return None


def load_shard(path: Path) -> dict[str, Any]:
    """A shard's state (verified when the run chose its checkpoint), its tensors mapped from the file rather than read:
    ``load_state_dict`` then copies them into their object, so a shard is never in memory twice."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch raises for a file changed since it verified, the answer is the same
        raise FleetError(f"Could not read the checkpoint shard {path} ({type(exc).__name__}: {_first_line(exc)}); it verified when "
                         f"the run started, so it changed since. Resume from an earlier checkpoint of its run ({path.parent}).") from None


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
