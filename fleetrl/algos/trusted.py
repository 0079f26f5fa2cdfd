"""The record of the algorithm code this user has run: the sha256 of every file trained (`python FILE`, `fleetrl train
FILE`, `fleetrl train mypkg.algo`) or named to `fleetrl eval --algo-file`. `fleetrl eval` imports a checkpoint's file
without `--algo-file` only when its bytes hash to a sha256 on this record (docs/engine.md, "Whose code runs").

Owning a file is not trusting it: a user owns every file unpacked from someone else's tarball. So the record lives in a
file only this user can read and write (``$FLEETRL_HOME``, else ``~/.fleetrl``), and a record that anyone else could have
written is not believed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path

from fleetrl import files
from fleetrl.errors import FleetError

RECORD_NAME = "code-you-ran.sha256"  # lines of `SHA256  PATH`, as sha256sum writes them (the path is for the reader only)


def home() -> Path:
    """The user's own fleetrl folder: ``$FLEETRL_HOME``, else ``~/.fleetrl``."""
    return Path(os.environ.get("FLEETRL_HOME") or Path.home() / ".fleetrl")


def record_path() -> Path:
    return home() / RECORD_NAME


def remember(sha256: str, path: str) -> None:
    """Put a file the user ran on the record. A record that cannot be written (a read-only home) only warns: the run
    goes on, and `fleetrl eval` will ask for ``--algo-file`` later."""
    record = record_path()
    try:
        record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _not_private(record.parent, folder=True)
        if problem:
            raise PermissionError(problem)
        with files.exclusive_lock(record.with_name(RECORD_NAME + ".lock")):  # torchrun's ranks record the same file at once
            fd = os.open(record, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "r+", encoding="utf-8") as file:
                problem = _not_private(record, fd=file.fileno())
                if problem:
                    raise PermissionError(problem)
                if sha256 not in _hashes(file.read()):
                    file.write(f"{sha256}  {path.replace(chr(10), '?')}\n")
    except (OSError, FleetError) as exc:
        print(f"fleetrl: warning: could not add {path} to the record of the code you ran ({record}: {exc}); `fleetrl eval` of "
              f"its checkpoints will ask you to name the file with --algo-file.", file=sys.stderr, flush=True)


def knows(sha256: str) -> tuple[bool, str]:
    """Whether ``sha256`` is on this user's record, and if not, why (for the refusal)."""
    record = record_path()
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False, f"you have no record of code you ran yet ({record})"
    except OSError as exc:
        return False, f"your record of the code you ran ({record}) cannot be read ({exc.strerror or exc})"
    with os.fdopen(fd, encoding="utf-8", errors="replace") as file:
        problem = _not_private(record.parent, folder=True) or _not_private(record, fd=file.fileno())
        if problem:
            return False, f"your record of the code you ran is not believed: {problem}"
        if sha256 in _hashes(file.read()):
            return True, ""
    return False, f"your record of the code you ran ({record}) does not list it"


def _hashes(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def _not_private(path: Path, fd: int | None = None, folder: bool = False) -> str | None:
    """Why ``path`` could hold lines that someone other than this user wrote, or None."""
    with contextlib.suppress(FileNotFoundError):
        info = os.fstat(fd) if fd is not None else os.lstat(path)
        if folder and not stat.S_ISDIR(info.st_mode) or not folder and not stat.S_ISREG(info.st_mode):
            return f"{path} is not a plain {'folder' if folder else 'file'}"
        if info.st_uid != os.geteuid():
            return f"{path} belongs to another user (uid {info.st_uid})"
        open_to_others = (stat.S_IWGRP | stat.S_IWOTH) if folder else 0o077
        if info.st_mode & open_to_others:
            return (f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); make it yours alone: "
                    f"chmod {'700' if folder else '600'} {path}")
    return None
