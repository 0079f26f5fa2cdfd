"""Files that readers never see half-written (write to a temporary name beside, then rename) and file locks between
processes. No torch here: env workers and the tools import it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator

from fleetrl.errors import FleetError
from fleetrl.processes import pid_alive

_HOST = socket.gethostname()
TEMPORARY = ".tmp-"  # in every temporary name: `.{name}.tmp-{host}-{pid}-t{thread}{suffix}`
# the writer in a temporary name; names from before the thread (host-pid) and the host (pid) were in it parse too
_WRITER = re.compile(r"\.tmp-(?:(?P<host>.*)-)?(?P<pid>\d+)(?:-t\d+.*)?")
LOCK_TIMEOUT_S = 300.0  # the longest exclusive_lock waits: its holders keep it for seconds at most, so a wait this long is a stuck holder
LOCK_POLL_S = (0.001, 0.05)  # exclusive_lock retries after the first, growing to the second: a short hold is taken at once


def temporary_path(path: str | os.PathLike, suffix: str = "") -> Path:
    """A hidden name beside ``path`` (the same filesystem, so the rename is atomic) that no other writer uses: its host
    (a folder shared between machines), process and thread are in it. ``suffix``: for a writer that picks the format
    from the name's ending (ffmpeg)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMPORARY}{_HOST}-{os.getpid()}-t{threading.get_ident()}{suffix}")


def move_into_place(tmp: str | os.PathLike, path: str | os.PathLike, durable: bool = False) -> None:
    """Rename the finished ``tmp`` over ``path``: a reader sees the old file or the new one, whole. ``durable``: the data
    is on disk before the rename, and the rename itself after (fsync of the file, then of the folder), so that a power
    cut cannot leave an empty or missing file."""
    if durable:
        _fsync(tmp, os.O_RDONLY)
    os.replace(tmp, path)
    if durable:
        _fsync(Path(path).parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


@contextlib.contextmanager
def replacing(path: str | os.PathLike, suffix: str = "", durable: bool = False) -> Iterator[Path]:
    """The temporary path to write ``path``'s new content to: renamed over ``path`` when the block ends (see
    :func:`move_into_place`), removed when it raises, so that ``path`` is left as it was."""
    tmp = temporary_path(path, suffix)
    try:
        yield tmp
        move_into_place(tmp, path, durable)
    finally:
        tmp.unlink(missing_ok=True)  # renamed: nothing to remove


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", durable: bool = False, **open_kwargs: Any) -> Iterator[IO]:
    """An open file whose content replaces ``path`` when the block ends (:func:`replacing`). ``durable``: this file's
    own fsync (ENOSPC and EDQUOT can surface there, not at ``write``), then the rename's."""
    with replacing(path, durable=durable) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f
        if durable:
            f.flush()
            os.fsync(f.fileno())


def write_atomically(path: str | os.PathLike, data: str | bytes, durable: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file (:func:`atomic_file`)."""
    with atomic_file(path, "w" if isinstance(data, str) else "wb", durable) as f:
        f.write(data)


def temporaries(folder: str | os.PathLike, prefix: str = "") -> list[Path]:
    """The temporary files in ``folder`` of files named ``prefix*``: writes in progress, or left by a killed writer."""
    return list(Path(folder).glob(f".{prefix}*{TEMPORARY}*"))


def writer_of(tmp: str | os.PathLike) -> tuple[str, int] | None:
    """The host and pid that write the temporary file ``tmp`` (host "" for old names without one), or None if ``tmp`` is
    not a name :func:`temporary_path` gives."""
    name = Path(tmp).name
    found = _WRITER.fullmatch(name, name.rfind(TEMPORARY)) if TEMPORARY in name else None
    if found is None:
        return None
    return found["host"] or "", int(found["pid"])


def remove_stale_temporaries(folder: str | os.PathLike, prefix: str = "") -> None:
    """Remove the temporary files (of files named ``prefix*``) whose writer on this machine has ended; another machine's
    writer (a shared folder) may be alive, so its files stay."""
    for tmp in temporaries(folder, prefix):
        writer = writer_of(tmp)
        if writer is not None and writer[0] in ("", _HOST) and not pid_alive(writer[1]):
            with contextlib.suppress(OSError):  # on shared storage another process may remove it first
                tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing) for the block, against every other process that
    takes it here: one holder at a time, the others wait, each at most ``timeout`` seconds, then a :class:`FleetError`
    names the holder. The kernel releases the lock when the holder dies, however."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)  # as open(path, "a"): the umask applies
    try:
        _take(fd, path, timeout)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _take(fd: int, path: str | os.PathLike, timeout: float) -> None:
    """flock ``fd``, retrying until ``timeout`` (a blocking flock cannot be given a deadline)."""
    deadline, pause = time.monotonic() + timeout, LOCK_POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            holder = lock_holder(fd)
            who = f"process {holder}" if holder is not None else "another process"
            raise FleetError(f"Waited {timeout:g} s for the lock {path}, which {who} held all that time (fleetrl holds it for "
                             f"seconds). If that process is stuck, end it (kill {holder if holder is not None else 'PID'}: the lock goes "
                             f"with it); then run this again.")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, LOCK_POLL_S[1])


def lock_holder(fd: int) -> int | None:
    """The pid that holds a flock on the file open as ``fd`` (from /proc/locks), or None where it cannot be told: no
    /proc, or the holder is in another pid namespace (a container)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's has "->" after "1:"
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit() and fields[4] != "0":
                    return int(fields[4])
    except OSError:
        pass
    return None


def _fsync(path: str | os.PathLike, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
