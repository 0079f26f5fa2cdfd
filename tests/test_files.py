"""fleetrl/files.py, the one home of write-then-rename and of file locks: a write that fails midway (a full disk, a value
that cannot be serialised) leaves the old file whole and no temporary file; stale temporaries of dead writers go; a lock
excludes a second process, goes with its holder, and a wait for one that a stuck process holds ends in one paragraph."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import pytest

from fleetrl import files
from fleetrl.errors import FleetError

from conftest import fleetrl_env, tmpfs

OLD = b"the old content, whole\n"


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: a larger write fails with ENOSPC partway."""
    yield from tmpfs(tmp_path, "disk", "64k")


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if files.TEMPORARY in p.name)


@pytest.mark.parametrize("durable", [False, True])
def test_a_write_that_fills_the_disk_midway_leaves_the_old_file_whole(full_disk, durable):
    path = full_disk / "state.bin"
    path.write_bytes(OLD)
    with pytest.raises(OSError) as failed:
        files.write_atomically(path, os.urandom(256 * 1024), durable=durable)
    assert failed.value.errno == 28, failed.value  # ENOSPC, a real full disk
    assert path.read_bytes() == OLD
    assert leftovers(full_disk) == [], "the temporary file is removed"
    files.write_atomically(path, b"new", durable=durable)  # the space it took is free again
    assert path.read_bytes() == b"new"


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this value cannot be serialised")


def test_a_serialisation_that_raises_midway_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "state.pkl"
    path.write_bytes(OLD)
    written = []
    with pytest.raises(TypeError, match="cannot be serialised"):
        with files.atomic_file(path) as f:
            try:
                pickle.dump([os.urandom(512 * 1024), Unpicklable()], f)  # the bytes are framed out to the file first
            finally:
                f.flush()
                written.append(os.fstat(f.fileno()).st_size)
    assert written[0] > 512 * 1024, "the failure came midway, after the file had data"
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []


def test_a_writer_given_a_path_replaces_the_file_only_when_it_finishes(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(OLD)
    with pytest.raises(RuntimeError):
        with files.replacing(path, suffix=".png") as tmp:
            assert tmp.parent == path.parent and tmp.name.startswith(".plot.png") and tmp.suffix == ".png"
            tmp.write_bytes(b"half a plot")
            raise RuntimeError("the drawing failed")
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []
    with files.replacing(path) as tmp:
        tmp.write_bytes(b"a plot")
    assert path.read_bytes() == b"a plot" and leftovers(tmp_path) == []


def test_stale_temporaries_of_dead_writers_on_this_machine_are_removed_and_no_others(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait_until_zombie(zombie.pid)
    try:
        mine = files.temporary_path(tmp_path / "ckpt_1.pt")  # this process writes it: alive
        host = socket.gethostname()
        names = {
            "dead": f".ckpt_2.pt.tmp-{host}-{ended.pid}-t1",
            "zombie": f".ckpt_3.pt.tmp-{host}-{zombie.pid}-t1",
            "old name, dead": f".ckpt_4.pt.tmp-{host}-{ended.pid}",  # written before the thread was in the name
            "another machine": f".ckpt_5.pt.tmp-elsewhere-{ended.pid}-t1",
            "another file": f".other.json.tmp-{host}-{ended.pid}-t1",
        }
        for name in [mine.name, *names.values()]:
            (tmp_path / name).write_bytes(b"x")
        assert files.writer_of(mine) == (host, os.getpid())
        assert files.writer_of(tmp_path / names["old name, dead"]) == (host, ended.pid)
        files.remove_stale_temporaries(tmp_path, "ckpt_")
        assert leftovers(tmp_path) == sorted([mine.name, names["another machine"], names["another file"]])
    finally:
        zombie.wait()


LOCKER = """
import sys, time
from fleetrl.errors import FleetError
from fleetrl.files import exclusive_lock
print("waiting", flush=True)
if sys.argv[2] == "try first":  # a short try that must find the lock held: the sign that this process reached it
    try:
        with exclusive_lock(sys.argv[1], timeout=0.2):
            print("took it while held", flush=True)
    except FleetError:
        print("found it held", flush=True)
with exclusive_lock(sys.argv[1]):
    print(time.time(), flush=True)
    if sys.argv[2] == "hold":
        time.sleep(600)
"""


def test_a_file_lock_excludes_a_second_process_until_the_first_lets_go(tmp_path):
    lock = tmp_path / "study.lock"
    with files.exclusive_lock(lock):
        other = subprocess.Popen([sys.executable, "-c", LOCKER, str(lock), "try first"], stdout=subprocess.PIPE, text=True,
                                 env=fleetrl_env())
        assert other.stdout.readline().strip() == "waiting"
        # no sleep racing the child to the lock: it says when it tried, and found it held
        assert other.stdout.readline().strip() == "found it held", "a second process took the lock while the first held it"
        released = time.time()
    got = float(other.stdout.readline())
    assert other.wait(timeout=30) == 0
    assert got >= released, "the second process took the lock only after the first let it go"


def test_a_wait_for_a_lock_that_a_stuck_process_holds_ends_in_one_paragraph_naming_it(tmp_path):
    lock = tmp_path / "study.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(lock), "hold"], stdout=subprocess.PIPE, text=True, env=fleetrl_env())
    try:
        assert holder.stdout.readline().strip() == "waiting"
        float(holder.stdout.readline())  # it holds the lock, and never lets go
        began = time.monotonic()
        with pytest.raises(FleetError) as refused:
            with files.exclusive_lock(lock, timeout=0.5):
                pytest.fail("took a lock another process holds")
        assert time.monotonic() - began < 20, "the wait is bounded by its timeout (a generous guard for a loaded machine)"
        said = str(refused.value)
        assert "\n" not in said and f"Waited 0.5 s for the lock {lock}" in said and f"process {holder.pid} held" in said, said
        assert f"kill {holder.pid}" in said, said
    finally:
        holder.kill()
        holder.wait()


def test_a_file_lock_goes_with_its_holder_when_it_is_killed(tmp_path):
    lock = tmp_path / "study.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(lock), "hold"], stdout=subprocess.PIPE, text=True, env=fleetrl_env())
    try:
        assert holder.stdout.readline().strip() == "waiting"
        float(holder.stdout.readline())  # it holds the lock
        holder.kill()
        holder.wait()
        took = threading.Event()

        def take() -> None:
            with files.exclusive_lock(lock):
                took.set()

        threading.Thread(target=take, daemon=True).start()
        assert took.wait(timeout=30), "the kernel released the killed holder's lock"
    finally:
        holder.kill()
        holder.wait()


def _wait_until_zombie(pid: int) -> None:
    import psutil

    deadline = time.monotonic() + 30
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child never ended"
        time.sleep(0.01)
