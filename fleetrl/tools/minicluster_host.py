"""What a mini Slurm cluster (fleetrl/tools/minicluster.py) makes on this machine besides its daemons, made safe for root
on a machine other users share: its folder, which only root can write and which is checked before every use; the
registry of running clusters; and its network (a bridge, and per node a network namespace joined to it by a veth link)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import psutil

from fleetrl import files, processes
from fleetrl.errors import FleetError

# root's own: /run and everything above it only root can write (a folder in /tmp, which anyone can create first, would
# let its maker read the munge key and rewrite the files that `down` acts on); tmpfs, gone at reboot with the namespaces
BASE = Path("/run/fleetrl-minicluster")
DEFAULT_DIR = BASE / "default"  # the CLI's cluster, found again by status, exec and down
REGISTRY = BASE  # TAG.json: which tags are taken, by which folder and owner; and the lock that hands tags out
MADE = ("cluster.json", "etc", "state", "log", "spool", "munge", "munge-key")  # all a cluster makes in its folder: all `down` removes
TAGS = range(1, 255)  # a cluster's tag K tells concurrent ones apart: subnet 10.77.K.0/24, controller .1, node i .(10+i)
COMMAND_TIMEOUT_S = 30.0  # `ip` and `slurmd -C` answer in milliseconds: one that hangs is reported, not waited for
# what slurm.conf cannot carry in a path: whitespace ends a value, # starts a comment, % is replaced (%n), quotes and
# backslashes are parsed; a line break would also end the value
NOT_IN_A_PATH = re.compile(r"[\s#%\"'\\]")


class MiniClusterError(FleetError):
    """The cluster cannot start (or is not there); the message names the fix, or carries the daemons' logs."""


# ---- names: each follows from the cluster's tag, so nothing to remove is ever taken from a file ---------------------


def bridge_name(tag: int) -> str:
    return f"fmc{tag}br"


def netns_name(tag: int, node: int) -> str:
    return f"fleetrl-mc{tag}-node{node}"


def veth_name(tag: int, node: int) -> str:
    return f"fmc{tag}node{node}"


# ---- the folder ---------------------------------------------------------------------------------------------------


def check_root_only(path: str | os.PathLike, what: str, sticky: bool = False) -> None:
    """Refuse, in one paragraph, unless only root can change ``path`` and every folder above it (a sticky folder such
    as /tmp may be writable by all: only an entry's owner can rename it), and every symbolic link on the way is root's.
    ``sticky``: ``path`` itself may be such a folder (one to make a folder of root's in)."""
    reason = _not_root_only(Path(os.path.abspath(path)), sticky)
    if reason is not None:
        raise MiniClusterError(
            f"{what} {path} is not root's alone: {reason}. The cluster runs its daemons as root and keeps its munge key "
            f"there, and `down` removes and stops what its files name, so no other user may be able to write it or a folder "
            f"above it. Use a folder only root can write: the default ({DEFAULT_DIR}), or a new one inside a folder of "
            f"root's (e.g. --dir /root/minicluster); and find out who made {path}.")


def _not_root_only(path: Path, sticky: bool) -> str | None:
    for link in (path, *path.parents):  # a link is followed on every later use: another user could point it elsewhere
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(link)
            if stat.S_ISLNK(st.st_mode) and st.st_uid != 0:
                return f"{link} is a symbolic link of {_user(st.st_uid)}"
    real = Path(os.path.realpath(path))
    for part in (*reversed(real.parents), real):  # from / down
        st = os.lstat(part)
        if st.st_uid != 0:
            return f"{part} belongs to {_user(st.st_uid)}"
        if st.st_mode & 0o022 and not ((part != real or sticky) and st.st_mode & stat.S_ISVTX):
            return f"{part} can be written by {'everyone' if st.st_mode & 0o002 else 'its group'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def private_base() -> Path:
    """:data:`BASE`, made if it is missing, and checked: only root can write it."""
    try:
        BASE.mkdir(mode=0o755)
        BASE.chmod(0o755)  # whatever the umask: munge's clients (sbatch as any user) reach its socket through it
    except FileExistsError:
        pass
    except OSError as exc:
        raise MiniClusterError(f"Cannot make {BASE}, where mini clusters keep their files ({exc.strerror or exc}): run as root "
                               f"(sudo) on a machine with a /run folder.") from None
    check_root_only(BASE, "The mini clusters' folder")
    return BASE


def claim_folder(root: str | os.PathLike | None) -> tuple[Path, bool]:
    """The folder for a new cluster's files, and whether it was made for it (then `down` removes the folder too). None:
    a new folder under :data:`BASE`. A given folder must be new or empty, and only root may be able to write it."""
    base = private_base()
    if root is None:
        path = Path(tempfile.mkdtemp(prefix="cluster-", dir=base))
        path.chmod(0o755)  # munged insists that every folder above its socket is searchable by all
        return path, True
    path = Path(os.path.abspath(root))
    flag = f"--dir {shlex.quote(str(path))}"
    if (bad := NOT_IN_A_PATH.search(str(path))) is not None:
        raise MiniClusterError(f"--dir {str(path)!r} holds {bad.group()!r}, which slurm.conf cannot carry in a path (whitespace ends a "
                               f"value, # starts a comment, % is replaced by Slurm). Give a folder whose path has no whitespace, #, %, "
                               f"quotes or backslashes.")
    if not path.parent.is_dir():
        raise MiniClusterError(f"{flag}: the folder it goes in, {path.parent}, does not exist. Make it first "
                               f"(sudo mkdir -p {shlex.quote(str(path.parent))}), or give another --dir.")
    check_root_only(path.parent, "The folder above --dir,", sticky=True)
    try:
        path.mkdir(mode=0o755)
        path.chmod(0o755)  # whatever the umask (see above)
        made = True
    except FileExistsError:
        made = False
    check_root_only(path, "--dir")
    path = Path(os.path.realpath(path))  # slurm.conf and the records name it as it is
    if made:
        return path, True
    if not path.is_dir():
        raise MiniClusterError(f"{flag} is not a folder. Give a new or empty folder for the cluster's files.")
    if any(path.iterdir()):
        running = (f" It holds a cluster: see it with `fleetrl minicluster status {flag}`, stop it with "
                   f"`sudo fleetrl minicluster down {flag}`." if (path / "cluster.json").exists() else "")
        raise MiniClusterError(f"{flag} has files in it already. A cluster's folder must be new or empty: the cluster writes its "
                               f"configuration, munge key, state and logs there, and `down` removes them.{running} Or give "
                               f"another --dir (fleetrl makes it).")
    if stat.S_IMODE(path.stat().st_mode) & 0o111 != 0o111:
        raise MiniClusterError(f"{flag} has mode {stat.S_IMODE(path.stat().st_mode):o}: munged needs every folder above its socket "
                               f"searchable by all. Run `sudo chmod 755 {shlex.quote(str(path))}`, or give a new --dir (fleetrl makes it).")
    return path, False


def remove_folder(root: Path, made: bool) -> None:
    """Remove what a cluster made in ``root`` (:data:`MADE`), then ``root`` itself if the cluster made it and nothing
    else is in it. Refused where another user could have changed the folder."""
    if not os.path.lexists(root):
        return
    check_root_only(root, "The cluster's folder")
    for name in MADE:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # safe from links planted inside (shutil.rmtree.avoids_symlink_attacks)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    if made:
        with contextlib.suppress(OSError):  # not empty: what someone else put there stays, and the folder with it
            root.rmdir()


def read_record(path: Path) -> object:
    """The JSON in ``path``, a file of root's that only root can write (its folder is the caller's to check). Raises
    FileNotFoundError where there is none, ValueError where it is not JSON."""
    try:
        # no link followed, and no wait on a FIFO: only a plain file is read
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise MiniClusterError(f"Cannot read {path} ({exc.strerror or exc}): a record of the mini cluster is a plain file of "
                               f"root's. Find out who put what is there.") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise MiniClusterError(f"{path} is not a plain file that only root can write (owner {_user(st.st_uid)}, mode "
                                   f"{stat.S_IMODE(st.st_mode):o}): another user could have written what it names, so it is "
                                   f"not used. Find out who made it.")
        return json.loads(f.read())


def write_record(path: Path, data: dict) -> None:
    """Write a record whole or not at all (a reader, `down` among them, never sees half of it)."""
    files.write_atomically(path, json.dumps(data, indent=1))
    path.chmod(0o644)  # readable by the users who run jobs (status); writable by root alone, whatever the umask


# ---- the registry: which tags are taken, and by whom ----------------------------------------------------------------


@contextlib.contextmanager
def registry_lock() -> Iterator[None]:
    with files.exclusive_lock(private_base() / "lock"):  # two `up`s at once (two test runs) must not take one tag
        yield


def register(tag: int, root: Path, made: bool, owner: int | None) -> None:
    """Record the tag as taken, by the cluster in ``root`` (``made`` for it), for ``owner`` (None: until `down`). The
    owner's start time tells it from a later process that got its pid."""
    started = processes.start_time(owner) if owner is not None else None
    write_record(private_base() / f"{tag}.json", {"root": str(root), "made_dir": made, "owner_pid": owner,
                                                         "owner_started": started})


def unregister(tag: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (private_base() / f"{tag}.json").unlink()


def registered() -> dict[int, dict]:
    """The registry's entries that read as this fleetrl writes them, by tag: ``root``, ``made_dir``, ``owner_pid``,
    ``owner_started``."""
    found = {}
    for entry in private_base().glob("*.json"):
        try:
            info = read_record(entry)
        except (OSError, ValueError, MiniClusterError):
            continue
        if (entry.stem.isdigit() and int(entry.stem) in TAGS and isinstance(info, dict) and isinstance(info.get("root"), str)
                and os.path.isabs(info["root"]) and isinstance(info.get("owner_pid"), (int, type(None)))
                and isinstance(info.get("made_dir", False), bool)):
            found[int(entry.stem)] = info
    return found


# ---- the network --------------------------------------------------------------------------------------------------


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS``; a failure (with ``check``) or a hang is a MiniClusterError naming what the network needs."""
    needs = "Network namespaces and bridges need root with CAP_NET_ADMIN and CAP_SYS_ADMIN, and a kernel with veth and bridge support."
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MiniClusterError(f"`ip {' '.join(args)}` did not finish within {COMMAND_TIMEOUT_S:g} s. {needs} Check that "
                               f"`ip link show` answers here.") from None
    if check and proc.returncode != 0:
        raise MiniClusterError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()} {needs} In a container, give it those "
                               f"capabilities (docker run --cap-add NET_ADMIN --cap-add SYS_ADMIN), or run the cluster on a VM.")
    return proc


def free_tag() -> int:
    """A tag no cluster holds: none registered, and no address, link or namespace of its names exists. Call it under
    :func:`registry_lock`."""
    taken = {int(p.stem) for p in private_base().glob("*.json") if p.stem.isdigit()}
    in_use = ip("-4", "-o", "addr", "show").stdout + ip("-o", "link", "show").stdout + ip("netns", "list").stdout
    for tag in TAGS:
        if tag not in taken and f"10.77.{tag}." not in in_use and f"fmc{tag}" not in in_use and f"fleetrl-mc{tag}-" not in in_use:
            return tag
    raise MiniClusterError(f"No free mini cluster slot: {len(TAGS)} are in use (see {REGISTRY}). Stop some with "
                           f"`fleetrl minicluster down --dir DIR`.")


def make_network(tag: int, controller_address: str, addresses: list[str]) -> None:
    """The bridge, holding the controller's address, and node i's namespace with ``addresses[i - 1]`` on its eth0."""
    bridge = bridge_name(tag)
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{controller_address}/24", "dev", bridge)
    ip("link", "set", bridge, "up")
    for i, address in enumerate(addresses, start=1):
        netns, veth = netns_name(tag, i), veth_name(tag, i)
        ip("netns", "add", netns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", veth, "master", bridge, "up")
        ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")


def node_namespaces(tag: int) -> list[int]:
    """The node numbers whose namespaces of cluster ``tag`` exist (a cluster that died before it saved its record)."""
    names = [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]
    return sorted(int(m.group(1)) for name in names if (m := re.fullmatch(rf"fleetrl-mc{tag}-node(\d+)", name)))


def remove_network(tag: int, nodes: list[int]) -> None:
    for i in nodes:
        ip("netns", "delete", netns_name(tag, i), check=False)
        ip("link", "delete", veth_name(tag, i), check=False)  # gone with the namespace already, unless that failed
    ip("link", "delete", bridge_name(tag), check=False)


def processes_in_netns(netns: str) -> list[psutil.Process]:
    """Every process in the network namespace ``netns``: a node's slurmd, slurmstepd, its jobs' tasks."""
    out = []
    for pid in ip("netns", "pids", netns, check=False).stdout.split():
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(int(pid)))
    return out
