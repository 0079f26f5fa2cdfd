"""`fleetrl minicluster up|status|exec|down`: a throwaway Slurm cluster on this machine, for the tests and for trying
fleetrl's Slurm scripts; each node is a host of its own (network, hostname and /etc/hosts), on a bridge.

    sudo fleetrl minicluster up               # munged, slurmctld, two slurmd; prints the SLURM_CONF to export
    export SLURM_CONF=/run/fleetrl-minicluster/default/etc/slurm.conf
    sbatch --nodes=2 ...; squeue; scontrol show job JOBID
    sudo fleetrl minicluster exec node2 -- hostname -I
    sudo fleetrl minicluster down             # stops everything and removes namespaces, links and files

How: one bridge in this (the controller's) network namespace, holding the controller's address, and per node a
network namespace joined to it by a veth pair. Each ``slurmd`` runs in its node's network namespace plus a UTS and a
mount namespace of its own, with the node's hostname and an ``/etc/hosts`` naming every node, so jobs, ``srun`` and
torchrun on a node see a separate host. Each node gets its own share of the CPUs this process may use (the others are
``CpuSpecList``, held back from its jobs), so Slurm's CPU binding puts node1's tasks and node2's tasks on different cores. Needs root, and
Debian's ``slurm-wlm`` and ``munge`` (Slurm 22.05).

Safe for root on a shared machine: the files live in a folder only root can write, checked before every use, and what
`down` removes or stops follows from the cluster's tag and folder, never from names another user could have written
(fleetrl/tools/minicluster_host.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Iterator, Literal, Sequence

import psutil
import tyro

from fleetrl import processes
from fleetrl.tools import minicluster_host as host
from fleetrl.tools import slurm_jobs
from fleetrl.tools.minicluster_host import DEFAULT_DIR, REGISTRY, MiniClusterError  # noqa: F401 - the module's names for its users

START_TIMEOUT_S = 60.0  # the daemons start in well under 1 s here; a start this slow is reported with the logs
PROBE_MIN_S = 1.0  # the least time one readiness probe (scontrol ping, sinfo) gets, even with less of the start's time left
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
REQUEUE_DELAY_S = 5  # cred_expire: how long a requeued job waits before it may start again (Slurm: 120 s by default, 5 at least)
KILL_WAIT_S = 30  # Slurm's KillWait: from SIGTERM to SIGKILL when a job is cancelled or requeued (Slurm's default)
TOOLS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "scontrol": "slurm-wlm",
         "sinfo": "slurm-wlm", "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux"}
DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass
class Node:
    name: str  # Slurm's NodeName, and the hostname inside the node
    address: str  # on the bridge
    netns: str  # `ip netns` name
    veth: str  # the bridge's end of the node's veth pair
    cpus: str  # the Slurm CPU ids this node's jobs get (the others are CpuSpecList)
    pid: int | None = None  # its slurmd, whose namespaces `exec` joins


@dataclass
class MiniCluster:
    """A running cluster: what it made and where. ``env()`` (``SLURM_CONF``) points Slurm's commands at it."""

    root: str  # the cluster's folder: etc/slurm.conf, the munge key, state, spool and logs
    tag: int
    bridge: str
    controller: str  # the controller's hostname (this machine's) and its address on the bridge
    controller_address: str
    ctld_port: int
    nodes: list[Node]
    pids: dict[str, int] = field(default_factory=dict)  # munged, slurmctld: each recorded as soon as it starts
    owner_pid: int | None = None  # a cluster whose owner is gone is removed by the next `up` (a killed test run)
    started_in_s: float = 0.0
    made_dir: bool = True  # `root` was made for the cluster: `down` removes it too, if nothing else was put in it

    # ---- where things are
    @property
    def conf(self) -> Path:
        return Path(self.root) / "etc" / "slurm.conf"

    @property
    def logs(self) -> Path:
        return Path(self.root) / "log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``SLURM_CONF`` set to this cluster's."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise MiniClusterError(f"This cluster has no node {name!r}; its nodes are {', '.join(n.name for n in self.nodes)}.")

    # ---- running things
    def on_node(self, name: str, argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """The command line that runs ``argv`` on node ``name``, as a job there would: in its slurmd's network, UTS
        (hostname) and mount (``/etc/hosts``) namespaces, in ``cwd`` (default: this process's)."""
        node = self.node(name)
        return ["nsenter", f"--target={node.pid}", "--net", "--uts", "--mount", f"--wd={cwd or os.getcwd()}", "--", *argv]

    def run_on(self, name: str, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on node ``name`` (see :meth:`on_node`) and return its result (text, output captured)."""
        kwargs.setdefault("env", self.env())
        return subprocess.run(self.on_node(name, argv, kwargs.pop("cwd", None)), capture_output=True, text=True, timeout=timeout, **kwargs)

    # ---- Slurm's commands against this cluster (fleetrl/tools/slurm_jobs.py, with SLURM_CONF set)
    def slurm(self, *argv: str, timeout: float = 30, check: bool = True) -> str:
        """Run one of Slurm's commands (``squeue``, ``scontrol``, ...) against this cluster; its stdout."""
        return slurm_jobs.command(*argv, env=self.env(), timeout=timeout, check=check)

    def submit(self, script: str | os.PathLike, *args: str, sbatch: Sequence[str] = (), cwd: str | os.PathLike | None = None,
               env: dict[str, str] | None = None) -> str:
        """``sbatch --parsable [sbatch] script [args]`` with ``env`` (default: this process's); returns the job id."""
        return slurm_jobs.submit(script, *args, sbatch=sbatch, cwd=cwd, env=self.env(env))

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (``JobState``, ``ExitCode``, ``Restarts``, ``NodeList``, ``StdOut``, ...).
        Finished jobs stay visible for 600 s (MinJobAge); accounting is off, so ``sacct`` knows nothing."""
        return slurm_jobs.job(job_id, self.env())

    def wait_for_job(self, job_id: str, states: Sequence[str] = slurm_jobs.FINISHED, timeout: float = 300,
                     until: Callable[[dict[str, str]], bool] | None = None) -> dict[str, str]:
        """Poll the job until its ``JobState`` is one of ``states`` (default: any finished state) and ``until(job)``,
        if given, holds; returns its ``scontrol show job`` fields (:func:`fleetrl.tools.slurm_jobs.wait_for_job`)."""
        return slurm_jobs.wait_for_job(job_id, states, timeout, until, self.env())

    job_output = staticmethod(slurm_jobs.job_output)

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for log in sorted(self.logs.glob("*")):  # *.log: the daemons' logs; *.out: what they printed before opening them
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                out.append(f"--- {log}\n" + "\n".join(tail))
        return "\n".join(out)

    # ---- persistence (the CLI's `up` and `down` are separate processes)
    def save(self) -> None:
        host.write_record(Path(self.root) / "cluster.json", asdict(self))

    @classmethod
    def load(cls, root: str | os.PathLike) -> "MiniCluster":
        """The cluster recorded in ``root``, once its folder and record are checked: only root can have written them, and
        every name in the record is the one its tag gives. FileNotFoundError where there is none; BadRecord where the
        record is not one this fleetrl wrote."""
        root = Path(os.path.abspath(root))
        os.lstat(root)  # FileNotFoundError: no cluster here
        host.check_root_only(root, "The cluster's folder")
        root = Path(os.path.realpath(root))
        try:
            data = host.read_record(root / "cluster.json")
        except ValueError as exc:
            raise BadRecord(root, f"not JSON: {exc}") from None
        return cls.from_record(data, root)

    @classmethod
    def from_record(cls, data: object, root: Path) -> "MiniCluster":
        try:
            cluster = cls(**{**data, "nodes": [Node(**n) for n in data["nodes"]]})
        except (KeyError, TypeError, AttributeError) as exc:  # a field missing or unknown; a list where a record belongs
            raise BadRecord(root, f"{type(exc).__name__}: {exc}") from None
        tag = cluster.tag
        if not (isinstance(tag, int) and tag in host.TAGS):
            raise BadRecord(root, f"tag {tag!r} is not one of {host.TAGS.start}..{host.TAGS.stop - 1}")
        wrong = [f"root is {cluster.root!r}, not {str(root)!r}"] if cluster.root != str(root) else []
        if cluster.bridge != host.bridge_name(tag):
            wrong.append(f"the bridge is {cluster.bridge!r}, not {host.bridge_name(tag)!r}")
        for i, node in enumerate(cluster.nodes, start=1):
            names, want = [node.name, node.netns, node.veth], [f"node{i}", host.netns_name(tag, i), host.veth_name(tag, i)]
            if names != want:
                wrong.append(f"node {i} is named {names}, not {want}")
        pids = [*cluster.pids.values(), *(n.pid for n in cluster.nodes if n.pid is not None)] if isinstance(cluster.pids, dict) else [None]
        if not all(type(pid) is int for pid in pids):
            wrong.append("a pid is not a number")
        if wrong:
            raise BadRecord(root, "; ".join(wrong))
        return cluster


class BadRecord(MiniClusterError):
    """A cluster.json this fleetrl did not write as it is: another version's, or edited."""

    def __init__(self, root: Path, why: str):
        flag = "" if root == DEFAULT_DIR else f" --dir {shlex.quote(str(root))}"
        super().__init__(f"{root / 'cluster.json'} is not a record of a cluster this fleetrl started ({why}): another version of "
                         f"fleetrl wrote it, or it was edited, so nothing it names is used. `sudo fleetrl minicluster down{flag}` "
                         f"still stops the cluster registered for this folder, by the names its tag gives; or stop it with the "
                         f"fleetrl that started it.")


# ---- checks -------------------------------------------------------------------------------------------------------


def check_prerequisites() -> None:
    """Refuse, naming the fix, where the cluster cannot run: not root, or Slurm, munge or iproute2 missing."""
    if not sys.platform.startswith("linux"):
        raise MiniClusterError("The mini Slurm cluster needs Linux (network namespaces); this is " + sys.platform + ".")
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise MiniClusterError(f"The mini Slurm cluster needs the Debian/Ubuntu packages {', '.join(missing)}, which are not installed "
                               f"(no {', '.join(t for t, p in TOOLS.items() if p in missing)} on PATH). Install them with: "
                               f"sudo apt-get install {' '.join(missing)}")
    if os.geteuid() != 0:
        raise MiniClusterError("The mini Slurm cluster must run as root: it creates network namespaces, a bridge and veth links, and "
                               "starts slurmd, which runs jobs as their users. Run it with sudo (e.g. sudo fleetrl minicluster up), "
                               "or in a throwaway VM or container that has CAP_SYS_ADMIN and CAP_NET_ADMIN.")


def _hardware() -> dict[str, int]:
    """This machine as ``slurmd -C`` sees it: CPUs, Boards, SocketsPerBoard, CoresPerSocket, ThreadsPerCore, RealMemory."""
    try:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=host.COMMAND_TIMEOUT_S).stdout
    except subprocess.TimeoutExpired:
        raise MiniClusterError(f"`slurmd -C`, which describes this machine's CPUs and memory for slurm.conf, did not finish within "
                               f"{host.COMMAND_TIMEOUT_S:g} s. Check that it answers here (sudo slurmd -C), and that Slurm is "
                               f"installed whole (sudo apt-get install --reinstall slurm-wlm).") from None
    found = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out)}
    if "CPUs" not in found:
        raise MiniClusterError(f"`slurmd -C` did not describe this machine's CPUs: {out.strip() or '(no output)'}")
    return found


def split_cpus(hw: dict[str, int], nodes: int, allowed: set[int] | None = None) -> list[tuple[str, str]]:
    """For each node, (its CPU ids, the others as its CpuSpecList), in whole cores, taken from the CPUs this process may
    run on (``allowed``, default its affinity mask): in a cpuset without CPU 0 (``docker --cpuset-cpus=1``, a Slurm step)
    a node handed CPU 0 could bind no task to it. With fewer cores than nodes every node gets every allowed CPU (and jobs
    on different nodes share cores)."""
    threads = hw.get("ThreadsPerCore", 1)
    every = set(range(hw["CPUs"]))
    allowed = (every & (os.sched_getaffinity(0) if allowed is None else allowed)) or every
    # Slurm numbers a core's threads one after another; a core counts if its jobs may run on any of its threads
    cores = [ids & allowed for ids in ({*range(c * threads, (c + 1) * threads)} for c in range(hw["CPUs"] // threads)) if ids & allowed]
    if len(cores) < nodes:
        shares = [allowed] * nodes
    else:
        per_node = len(cores) // nodes
        shares = [set().union(*cores[i * per_node:(i + 1) * per_node]) for i in range(nodes)]
    return [(slurm_jobs.index_list(sorted(mine)), slurm_jobs.index_list(sorted(every - mine))) for mine in shares]


# ---- start --------------------------------------------------------------------------------------------------------


def start(root: str | os.PathLike | None = None, nodes: int = 2, owner_pid: int | None = None) -> MiniCluster:
    """Start a cluster of ``nodes`` slurmd nodes (``node1``, ``node2``, ...) and return it once every node is idle.
    ``root``: its folder, new or empty, that only root can write (made if missing); default a new one under
    /run/fleetrl-minicluster. ``owner_pid``: the cluster is removed by a later ``start`` once that process is gone (for
    test runs that are killed outright)."""
    if not 1 <= nodes <= 9:
        raise MiniClusterError(f"--nodes must be 1 to 9 (got {nodes}): node i gets the address .{{10+i}} on the bridge.")
    check_prerequisites()
    began = time.monotonic()
    reap_abandoned()
    controller = socket.gethostname().split(".")[0]
    if controller in {f"node{i}" for i in range(1, nodes + 1)}:
        raise MiniClusterError(f"This machine's hostname is {controller!r}, the name of a mini cluster node. Rename the machine "
                               f"(hostname NAME) or run the cluster elsewhere.")
    hw = _hardware()
    shares = split_cpus(hw, nodes)
    folder, made = host.claim_folder(root)
    try:
        with host.registry_lock():
            tag = host.free_tag()
            # registered before anything exists, owned by this process until the cluster is up: a start killed half-way
            # (SIGKILL) leaves a cluster that the next start finds and removes
            host.register(tag, folder, made, os.getpid())
    except BaseException:
        host.remove_folder(folder, made)
        raise
    cluster = MiniCluster(
        root=str(folder), tag=tag, bridge=host.bridge_name(tag), controller=controller, controller_address=f"10.77.{tag}.1",
        ctld_port=_free_port(), owner_pid=owner_pid, made_dir=made,
        nodes=[Node(f"node{i}", f"10.77.{tag}.{10 + i}", host.netns_name(tag, i), host.veth_name(tag, i), cpus)
               for i, (cpus, _) in enumerate(shares, start=1)])
    # not under the registry lock: the cleanup (stop) takes it, and a cleanup inside it would wait on itself for good
    try:
        cluster.save()
        host.make_network(tag, cluster.controller_address, [n.address for n in cluster.nodes])
        _write_files(cluster, hw, [spec for _, spec in shares])
        _start_daemons(cluster)
    except BaseException:
        stop(cluster)
        raise
    cluster.started_in_s = round(time.monotonic() - began, 2)
    cluster.save()
    host.register(tag, folder, made, owner_pid)
    return cluster


@contextlib.contextmanager
def running(root: str | os.PathLike | None = None, nodes: int = 2, owner_pid: int | None = None) -> Iterator[MiniCluster]:
    """``with running() as cluster:`` a cluster that is stopped and removed when the block ends, however it ends."""
    cluster = start(root, nodes, owner_pid)
    try:
        yield cluster
    finally:
        stop(cluster)


SLURM_CONF = """\
# a throwaway cluster written by fleetrl/tools/minicluster.py; `fleetrl minicluster down` removes it
ClusterName=minicluster
SlurmctldHost={controller}({controller_address})
SlurmctldPort={ctld_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again
AuthInfo=socket={root}/munge/munge.socket,cred_expire={requeue_delay}
StateSaveLocation={root}/state
SlurmctldPidFile={root}/state/slurmctld.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdSpoolDir={root}/spool/%n
SlurmdPidFile={root}/spool/%n/slurmd.pid
SlurmdLogFile={root}/log/slurmd.%n.log
# no cgroup setup needed: processes are tracked by their parentage, tasks bound to their CPUs by affinity
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
# look at pending jobs every second (default: every 60 s, backfill every 30 s), so a requeued job starts again at once
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
KillWait={kill_wait}
# finished jobs stay visible to scontrol (accounting is off, so sacct has nothing)
MinJobAge=600
{node_lines}
PartitionName=main Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


def _write_files(cluster: MiniCluster, hw: dict[str, int], cpu_specs: list[str]) -> None:
    root = Path(cluster.root)
    for sub in ("etc", "state", "log", *(f"spool/{n.name}" for n in cluster.nodes)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for private in ("munge-key", "munge"):
        (root / private).mkdir(mode=0o700 if private == "munge-key" else 0o755, exist_ok=True)
    key = root / "munge-key" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    memory = max(100, hw.get("RealMemory", 1000) // len(cluster.nodes))
    shape = " ".join(f"{k}={hw[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore") if k in hw)
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.address} {shape} RealMemory={memory}" + (f" CpuSpecList={spec}" if spec else "")
        for n, spec in zip(cluster.nodes, cpu_specs))
    cluster.conf.write_text(SLURM_CONF.format(
        controller=cluster.controller, controller_address=cluster.controller_address, ctld_port=cluster.ctld_port, root=root,
        requeue_delay=REQUEUE_DELAY_S, kill_wait=KILL_WAIT_S, node_lines=node_lines,
        node_names=",".join(n.name for n in cluster.nodes)))
    # inside the nodes: names from this file only, and no DNS server, which the nodes' network cannot reach (a lookup
    # would wait out its timeout; torchrun's store looks up every peer)
    hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", f"{cluster.controller_address} {cluster.controller}"]
    for n in cluster.nodes:
        # the v4-mapped form too: torch's store sees its IPv4 peers as ::ffff:a.b.c.d and looks them up by that
        hosts += [f"{n.address} {n.name}", f"::ffff:{n.address} {n.name}"]
    (root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
    (root / "etc" / "resolv.conf").write_text("# mini cluster node: no DNS server; names come from /etc/hosts\n")


_CHILDREN: dict[str, list[subprocess.Popen]] = {}  # cluster folder -> its daemons started by this process, reaped by stop


def _spawn(cluster: MiniCluster, argv: list[str], log: Path) -> subprocess.Popen:
    """A daemon in the foreground, in a session of its own (it outlives the CLI's `up`), its output to ``log``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    _CHILDREN.setdefault(cluster.root, []).append(proc)
    return proc


def _start_daemons(cluster: MiniCluster) -> None:
    """munged, slurmctld, then a slurmd per node. Each is in the cluster's record (cluster.json) as soon as it starts:
    an `up` killed a moment later leaves nothing that `down`, or the next `up`, does not find and stop."""
    root = Path(cluster.root)
    munged = _spawn(cluster, ["munged", "--foreground", f"--key-file={root}/munge-key/munge.key", f"--socket={root}/munge/munge.socket",
                     f"--pid-file={root}/munge/munged.pid", f"--seed-file={root}/munge-key/munged.seed",
                     f"--log-file={root}/log/munged.log"], root / "log" / "munged.out")
    cluster.pids["munged"] = munged.pid
    cluster.save()
    _wait(cluster, lambda _: (root / "munge" / "munge.socket").exists(), "munged to open its socket", {"munged": munged})
    ctld = _spawn(cluster, ["slurmctld", "-D", "-f", str(cluster.conf)], root / "log" / "slurmctld.out")
    cluster.pids["slurmctld"] = ctld.pid
    cluster.save()
    _wait(cluster, lambda left: "UP" in cluster.slurm("scontrol", "ping", timeout=left, check=False), "slurmctld to answer",
          {"munged": munged, "slurmctld": ctld})
    daemons = {"munged": munged, "slurmctld": ctld}
    q = shlex.quote
    for node in cluster.nodes:
        # its own hostname and /etc/hosts. Slave propagation: where this machine's mounts are shared (systemd's default),
        # a filesystem mounted later outside still reaches the node, as a cluster's shared filesystems reach its nodes
        inner = (f"hostname {q(node.name)} && mount --bind {q(f'{root}/etc/hosts')} /etc/hosts && "
                 f"mount --bind {q(f'{root}/etc/resolv.conf')} /etc/resolv.conf && exec slurmd -D -f {q(str(cluster.conf))}")
        proc = _spawn(cluster, ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--uts", "--mount", "--propagation", "slave",
                       "sh", "-c", inner], root / "log" / f"slurmd.{node.name}.out")
        node.pid = proc.pid  # nsenter, unshare and sh each exec the next: this is slurmd's pid
        cluster.save()
        daemons[f"slurmd on {node.name}"] = proc
    _wait(cluster, lambda left: _idle_nodes(cluster, left) == {n.name for n in cluster.nodes}, "every node to register and be idle", daemons)


def _idle_nodes(cluster: MiniCluster, timeout: float) -> set[str]:
    out = cluster.slurm("sinfo", "--noheader", "--Node", "--format=%N %t", timeout=timeout, check=False)
    return {name for name, state in (line.split() for line in out.splitlines() if line.strip()) if state == "idle"}


def _wait(cluster: MiniCluster, ready: Callable[[float], bool], what: str, daemons: dict[str, subprocess.Popen]) -> None:
    """Until ``ready(seconds left)``, for START_TIMEOUT_S in all: a probe is given the time left (PROBE_MIN_S at least), and
    one that does not answer in it (a controller not listening yet, or hung) counts as not ready, so a hang ends the
    wait on time, in one paragraph with the daemons' logs."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if ready(max(PROBE_MIN_S, deadline - time.monotonic())):
                return
        except slurm_jobs.SlurmError:  # no answer within the time given
            pass
        dead = [(name, p.returncode) for name, p in daemons.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0][0]} exited with code {dead[0][1]}" if dead else f"not within {START_TIMEOUT_S:g} s"
            raise MiniClusterError(f"The mini Slurm cluster did not start: waiting for {what}, {why}. The ends of the daemons' logs "
                                   f"(in {cluster.logs}):\n{cluster.log_tails()}")
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ---- abandoned clusters ---------------------------------------------------------------------------------------------


def _owner_alive(info: dict) -> bool:
    owner, started = info.get("owner_pid"), info.get("owner_started")
    if owner is None:
        return True  # the CLI's cluster: it stays until `down`
    return started is not None and processes.pid_alive(owner, started)  # no start time: the owner was gone when it registered


def reap_abandoned() -> list[int]:
    """Stop the clusters whose owner process is gone (a test run killed before its teardown); returns their tags."""
    reaped = []
    with host.registry_lock():
        for tag, info in host.registered().items():
            if _owner_alive(info):
                continue
            cluster = _recorded_or_skeleton(tag, info["root"], info.get("made_dir", False))
            with contextlib.suppress(MiniClusterError):  # a folder another user could change: stopped, its files left
                stop(cluster, locked=True)
            reaped.append(tag)
    return reaped


def _recorded_or_skeleton(tag: int, root: str, made: bool) -> MiniCluster:
    """The cluster of ``tag`` in ``root`` as its record has it; where it died before it saved one, or the record is not
    one this fleetrl wrote, what a cluster of this tag would have made, to remove whatever of it exists."""
    with contextlib.suppress(OSError, MiniClusterError):
        cluster = MiniCluster.load(root)
        if cluster.tag == tag:
            return cluster
    nodes = [Node(f"node{i}", "", host.netns_name(tag, i), host.veth_name(tag, i), "") for i in host.node_namespaces(tag)]
    return MiniCluster(root=os.path.realpath(root), tag=tag, bridge=host.bridge_name(tag), controller="", controller_address="",
                       ctld_port=0, nodes=nodes, made_dir=made)


# ---- stop ---------------------------------------------------------------------------------------------------------


def stop(cluster: MiniCluster, locked: bool = False) -> None:
    """Stop every process of the cluster (the daemons, and every job process on its nodes), then remove its namespaces,
    links, bridge, files and registry entry. Safe to call on a half-started cluster, and twice. ``locked``: the caller
    holds the registry lock."""
    # every process in a node's network namespace: slurmd, slurmstepd, the jobs' tasks, what `exec` started there.
    # SIGKILL at once: nothing on a throwaway node needs a clean exit, and slurmstepd ignores SIGTERM.
    _terminate([p for node in cluster.nodes for p in host.processes_in_netns(node.netns)], first=signal.SIGKILL)
    _terminate(_daemons(cluster))
    host.remove_network(cluster.tag, [int(node.name.removeprefix("node")) for node in cluster.nodes])
    for child in _CHILDREN.pop(cluster.root, []):  # ended above: this collects their exit status
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=STOP_GRACE_S)
    with contextlib.nullcontext() if locked else host.registry_lock():
        host.unregister(cluster.tag)
    host.remove_folder(Path(cluster.root), cluster.made_dir)


def _daemons(cluster: MiniCluster) -> list[psutil.Process]:
    """The cluster's daemons still running: those it recorded, if they still are its own (a pid may have been reused),
    and any root process named munged, slurmctld or slurmd whose command line names the cluster's folder (one an `up`
    killed outright started but did not get to record)."""
    mark = f"{cluster.root}/"
    found = {}
    for proc in psutil.process_iter(["name", "uids", "cmdline"]):
        info = proc.info
        if info["name"] in DAEMONS and info["uids"] is not None and info["uids"].real == 0 and any(mark in a for a in info["cmdline"] or ()):
            found[proc.pid] = proc
    for name, pid in cluster.pids.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.name() == name and proc.uids().real == 0 and any(mark in a for a in proc.cmdline()):
                found[pid] = proc
    return list(found.values())


def _terminate(procs: list[psutil.Process], first: signal.Signals = signal.SIGTERM) -> None:
    for sig in dict.fromkeys((first, signal.SIGKILL)):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while (procs := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not procs:
            return


def _alive(proc: psutil.Process) -> bool:
    """Still running: a zombie has ended (the CLI's daemons are reaped by init, whenever it gets round to it)."""
    try:
        return processes.pid_alive(proc.pid, proc.create_time())
    except psutil.Error:
        return False


# ---- the command line ---------------------------------------------------------------------------------------------


@dataclass
class MiniClusterArgs:
    action: tyro.conf.Positional[Literal["up", "status", "exec", "down"]]
    """up: start a cluster; status: its nodes and jobs; exec NODE -- CMD: run CMD on a node; down: stop and remove it"""
    node: Annotated[tyro.conf.Positional[tuple[str, ...]], tyro.conf.arg(metavar="NODE")] = ()
    """with exec: the node to run on (node1, node2, ...), then -- and the command"""
    dir: str = str(DEFAULT_DIR)
    """the cluster's folder (slurm.conf, munge key, state, logs); status, exec and down find the cluster by it"""
    nodes: int = 2
    """with up: how many slurmd nodes"""


def main(args: MiniClusterArgs, command: list[str]) -> None:
    flag = "" if os.path.abspath(args.dir) == str(DEFAULT_DIR) else f" --dir {shlex.quote(args.dir)}"
    if args.action == "up":
        cluster = start(args.dir, args.nodes)
        print(f"mini Slurm cluster up in {cluster.started_in_s:.1f} s: controller {cluster.controller} at "
              f"{cluster.controller_address}:{cluster.ctld_port}, nodes " +
              ", ".join(f"{n.name} ({n.address}, CPUs {n.cpus})" for n in cluster.nodes) + ".")
        print(f"use it with:  export SLURM_CONF={shlex.quote(str(cluster.conf))}")
        print(f"stop it with: sudo fleetrl minicluster down{flag}")
        return
    try:
        try:
            cluster = MiniCluster.load(args.dir)
        except (OSError, BadRecord):
            if args.action != "down":
                raise
            # the folder or its record gone, or not as this fleetrl wrote it: down stops what the registry holds for it
            cluster = _registered_cluster(args.dir)
    except OSError as exc:
        raise MiniClusterError(f"No mini cluster in {args.dir} ({exc.strerror or exc}). Start one with "
                               f"`sudo fleetrl minicluster up{flag}`, or give the --dir it was started with.") from None
    if args.action == "down":
        check_prerequisites()
        stop(cluster)
        print(f"mini Slurm cluster in {args.dir} stopped; its namespaces, links and the files it made are removed.")
    elif args.action == "status":
        print(f"export SLURM_CONF={shlex.quote(str(cluster.conf))}")
        print(cluster.slurm("sinfo", "--Node", "--long", check=False) + cluster.slurm("squeue", check=False), end="")
    else:  # exec
        if len(args.node) != 1 or not command:
            raise MiniClusterError("Usage: fleetrl minicluster exec NODE -- COMMAND [ARGS...], e.g. fleetrl minicluster exec node2 -- hostname -I")
        argv = cluster.on_node(args.node[0], command)
        sys.exit(subprocess.run(argv, env=cluster.env()).returncode)


def _registered_cluster(folder: str) -> MiniCluster:
    """`down` where the folder or its record is gone, or the record is not one this fleetrl wrote: the cluster the
    registry (root's) holds for the folder, by the names its tag gives; the loading error where the registry holds none."""
    root = os.path.realpath(folder)
    entries = [(tag, info) for tag, info in host.registered().items() if os.path.realpath(info["root"]) == root]
    if not entries:
        MiniCluster.load(folder)  # raises its error again
    tag, info = entries[0]
    return _recorded_or_skeleton(tag, root, info.get("made_dir", False))
