"""Shared test helpers: run the real CLI in a subprocess, and find the test env module."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))
# The suite keeps both cores busy (two xdist workers and their runs), and OpenMP's spinning intra-op threads beside
# other jobs stall each other: a 700-step SAC run with 2 torch threads took 53.7 s beside two busy loops, 10.4 s with
# passive waiting and 8.8 s with 1 thread (docs/benchmarks.md, "The test suite"). Read when torch loads, so set here,
# before any import of it, for this process and every run it starts; results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# the session's own cache of measured settings (fleetrl/accel.py), shared by its runs, apart from the user's
if "FLEETRL_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["FLEETRL_CACHE_DIR"] = tempfile.mkdtemp(prefix="fleetrl-test-cache-")
# and the session's own record of the code it ran (fleetrl/algos/trusted.py): the suite never writes the user's ~/.fleetrl
if "FLEETRL_HOME" not in os.environ:
    import tempfile

    os.environ["FLEETRL_HOME"] = tempfile.mkdtemp(prefix="fleetrl-test-home-")


def fleetrl_env(threads: int | None = 1) -> dict[str, str]:
    """Environment for a fleetrl subprocess: the tests folder importable (custom envs), fixed threads (None: as a user
    runs it, the thread plan decides)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if threads is None:
        env.pop("OMP_NUM_THREADS", None)
    else:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONFAULTHANDLER"] = "1"  # a worker that aborts (SIGABRT, SIGSEGV) prints its Python stacks into the test output
    return env


def run_fleetrl(*args: str, cwd: str | Path | None = None, timeout: float = 600, threads: int | None = 1) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetrl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=fleetrl_env(threads)
    )


def start_fleetrl(*args: str, cwd: str | Path | None = None, threads: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetrl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=fleetrl_env(threads)
    )


import contextlib  # noqa: E402  (helpers appended below; the file grows at its end only)
import signal  # noqa: E402
import threading  # noqa: E402


def start_fleetrl_group(*args: str, cwd: str | Path | None = None, threads: int = 1, stdout=subprocess.PIPE) -> subprocess.Popen:
    """``start_fleetrl`` in a process group of its own, so that :func:`killed_on_exit` ends it with all its workers.
    ``stdout``: where its output (stderr merged) goes, a pipe unless given a file."""
    return subprocess.Popen(
        [sys.executable, "-m", "fleetrl", *args], stdout=stdout, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env=fleetrl_env(threads), start_new_session=True,
    )


@contextlib.contextmanager
def killed_on_exit(*procs: subprocess.Popen):
    """Kill each process's group (or the process, when it leads none) as the block ends: a failed assertion
    leaves nothing running into the next test, not even a worker its exited leader left behind."""
    leaders = set()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:
                leaders.add(proc.pid)
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if proc.pid in leaders:
                    os.killpg(proc.pid, signal.SIGKILL)
                elif proc.poll() is None:
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def readline_within(proc: subprocess.Popen, timeout: float) -> str:
    """The next line of the child's stdout, or an AssertionError after ``timeout`` s: a child that never
    prints must not hang the test."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)  # a reader left blocked ends when the test kills the child (killed_on_exit)
    if not line:
        raise AssertionError(f"no output line from pid {proc.pid} within {timeout} s")
    return line[0]


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: str | Path, min_step: int, timeout: float = 180) -> None:
    """Block until ``run_dir`` holds a checkpoint at global step ``min_step`` or later, committed (its manifest
    written: a file without one ranks as older than every committed checkpoint); fail with the run's output if it
    exits first, or after ``timeout`` s."""
    import time

    from fleetrl import checkpoint

    def committed(path: Path) -> bool:
        return int(path.stem.split("_")[1]) >= min_step and checkpoint.manifest_path(path).exists()

    deadline = time.time() + timeout
    while not [c for c in checkpoint.list_checkpoints(run_dir) if committed(c)]:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-3000:] if proc.poll() is not None else "timed out"
        time.sleep(0.1)


import re  # noqa: E402

import fleetrl  # noqa: E402

PACKAGE_DIR = Path(fleetrl.__file__).resolve().parent
FRAME = re.compile(r'File "([^"]+)", line \d+')


def fleetrl_frames(output: str, subpackage: str = "") -> list[str]:
    """The traceback frames in ``output`` that run fleetrl's own code (optionally only ``fleetrl/<subpackage>``),
    found by where the imported package lies, never by a folder name: a clone in a folder named ``fleetrl`` puts
    ``/fleetrl/`` into every frame of its ``.venv`` too."""
    root = PACKAGE_DIR / subpackage if subpackage else PACKAGE_DIR
    return [path for path in FRAME.findall(output) if Path(path).resolve().is_relative_to(root)]


def python_in_a_clone_named_fleetrl(tmp_path: Path) -> str:
    """This interpreter, reached through ``<tmp>/fleetrl/.venv`` (a link to its prefix), as in a fresh
    ``git clone <repo> fleetrl && make``: every frame of torch, torchrun or pytest then lies under a ``/fleetrl/``."""
    venv = tmp_path / "fleetrl" / ".venv"
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not venv.exists():
        venv.symlink_to(sys.prefix, target_is_directory=True)
    return str(venv / Path(sys.executable).relative_to(sys.prefix))


def assert_same_learner(a: dict, b: dict, networks: tuple[str, ...] = ("model",), optimizers: tuple[str, ...] = ("optimizer",)) -> None:
    """Two checkpoints hold the same learner, bit for bit: step, the tensors of each of ``networks`` and the state of
    each of ``optimizers`` (Adam's moments and steps)."""
    import torch

    assert a["global_step"] == b["global_step"]
    for net in networks:
        for key in a[net]:
            assert torch.equal(a[net][key], b[net][key]), f"{net} tensor {key} differs"
    for optimizer in optimizers:
        assert len(a[optimizer]["state"]) == len(b[optimizer]["state"]) > 0, optimizer
        for (ka, va), (kb, vb) in zip(a[optimizer]["state"].items(), b[optimizer]["state"].items()):
            for name in va:
                assert torch.equal(torch.as_tensor(va[name]), torch.as_tensor(vb[name])), f"{optimizer} state {ka}.{name} differs"


from typing import NoReturn  # noqa: E402

import pytest  # noqa: E402


def skip_unless_ci(reason: str, ci_provides: bool = True) -> NoReturn:
    """Skip the test (or the module, at its top) naming ``reason``; under ``CI=true`` fail instead wherever CI provides
    what is missing. CI (.ci/run) is a root Debian machine with every extra installed (atari, mujoco, envpool, video,
    tune, track, stats), Slurm, PostgreSQL and the Qt 5 runtime where apt is, so a skip there would hide that it stopped
    running the test. ``ci_provides=False``: what is missing is not CI's to provide (a GPU, apt), so it skips there too."""
    if ci_provides and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, where this test must run, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def tmpfs(tmp_path, name: str, size: str):
    """A real tmpfs of ``size`` (root only), unmounted after: writes fail with ENOSPC once it is full. CI runs as root,
    so there a mount that fails is a failure, never a skip."""
    mount = tmp_path / name
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)]).returncode != 0:
        skip_unless_ci("mounting a small tmpfs needs root (CI runs as root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def require_module(name: str, extra: str | None = None):
    """``name`` imported, or :func:`skip_unless_ci` saying what to install (an ``extra`` of fleetrl)."""
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - not installed, or installed and failing to import here (envpool)
        fix = f"pip install 'fleetrl[{extra}]'" if extra else f"install {name.split('.')[0]}"
        skip_unless_ci(f"{name} does not import here ({type(exc).__name__}: {exc}); {fix}")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs(module, extra): the test needs this module (from fleetrl's extra); it skips "
                                       "without it, and fails under CI=true, which installs every extra")


def pytest_runtest_setup(item) -> None:
    for mark in item.iter_markers("needs"):  # a module's pytestmark, a test's mark or a pytest.param's marks
        require_module(*mark.args, **mark.kwargs)


def require_slurm() -> None:
    """Skip the test where a mini Slurm cluster cannot run (not root, Slurm or munge not installed), naming why; under
    CI=true fail instead: CI installs them (.ci/run), so a skip there would hide a broken setup."""
    from fleetrl.tools import minicluster

    try:
        minicluster.check_prerequisites()
    except minicluster.MiniClusterError as exc:
        skip_unless_ci(f"no Slurm cluster here: {exc}")


@pytest.fixture(scope="session")
def slurm_cluster():
    """A throwaway 2-node Slurm cluster (fleetrl/tools/minicluster.py), shared by the tests that ask for it and removed
    at the end of the session, however it ends. ``cluster.env()`` sets SLURM_CONF for Slurm's commands;
    ``cluster.submit``, ``cluster.wait_for_job`` and ``cluster.job`` submit and follow jobs; ``cluster.on_node`` and
    ``cluster.run_on`` run a command on a node; ``node.address`` is each node's address on the bridge.

    Where it cannot run (not root, Slurm not installed) the tests skip with the reason, except under CI=true, where
    that is a failure: CI installs Slurm (.ci/run)."""
    from fleetrl.tools import minicluster

    require_slurm()
    with minicluster.running(owner_pid=os.getpid()) as cluster:  # a killed test run's cluster is removed by the next start
        yield cluster


@dataclass(frozen=True)
class FinishedRun:
    run_dir: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def tiny_cartpole_run(tmp_path_factory) -> FinishedRun:
    """`fleetrl train ppo` with the defaults (CartPole-v1, 4 envs x 128 steps) but a budget of two iterations, run once
    per test worker through the CLI's entry point and shared by the tests that only read a finished run (its checkpoint,
    manifest, flags, output): copy ``run_dir`` before changing anything in it."""
    import torch

    run_dir = tmp_path_factory.mktemp("tiny-cartpole") / "run"
    threads = torch.get_num_threads()  # the run sets torch's thread count for its process: this worker's, here
    try:
        proc = run_fleetrl_in_process("train", "ppo", "--total-timesteps", "1024", "--no-progress", "--run-dir", str(run_dir))
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return FinishedRun(run_dir, proc.stdout, proc.stderr)


def run_fleetrl_in_process(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """The CLI's entry point (``fleetrl.cli.main``) in this process, its output and exit status as ``run_fleetrl``
    gives them: for a test of how bad input is refused, without a process start and torch's import (about 2 s each).
    An exception that escapes is written as Python writes it, a traceback with status 1, so a test still sees one.
    Each command keeps at least one test through the real process (``run_fleetrl``)."""
    import io
    import traceback

    from fleetrl.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    # a run sets torch's thread count for its process (its thread plan): the test's process gets its own back after
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd or os.getcwd()):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 (a KeyboardInterrupt too: the process would print it and exit)
            traceback.print_exc()
            code = 1
        finally:
            if threads is not None:
                torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["fleetrl", *args], code, out.getvalue(), err.getvalue())


def assert_train_refused(algo: str, flags: list[str], needles: list[str], run_dir: Path) -> None:
    """``fleetrl train ALGO FLAGS --run-dir RUN_DIR`` (in this process) is refused in one clear paragraph naming each of
    ``needles``, before anything starts: a non-zero exit, no traceback, no checkpoint."""
    proc = run_fleetrl_in_process("train", algo, *flags, "--run-dir", str(run_dir))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (run_dir / "checkpoints").exists()


class FakeClock:
    """A ``perf_counter`` that moves only when a test says so, for the phase timer (fleetrl/monitor/timing.py): the
    accounting is then checked exactly, with no sleeps and no tolerance for a loaded machine."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def phase_clock(monkeypatch) -> FakeClock:
    """The phase timer's clock, faked (create the PhaseTimer after asking for this)."""
    from fleetrl.monitor import timing

    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    return clock


# Hypothesis (tests/test_cli_fuzz.py): the "ci" profile by default (few examples, derandomised: every run tries the same
# ones, no deadline); FLEETRL_HYPOTHESIS=full for a nightly run (many more, drawn afresh each time, so new cases turn up;
# a failure prints the blob that replays it). Tests size their examples with hypothesis_examples(ci, full).
HYPOTHESIS_PROFILES = ("ci", "full")
HYPOTHESIS_PROFILE = os.environ.get("FLEETRL_HYPOTHESIS", "ci")
if HYPOTHESIS_PROFILE not in HYPOTHESIS_PROFILES:
    raise pytest.UsageError(f"FLEETRL_HYPOTHESIS={HYPOTHESIS_PROFILE!r}: give one of {', '.join(HYPOTHESIS_PROFILES)} (unset: ci).")
try:
    from hypothesis import HealthCheck, settings as _hypothesis_settings
except ImportError:  # the dev extra is not installed: the fuzz tests are not collected either
    pass
else:
    _hypothesis_settings.register_profile(
        "ci", deadline=None, derandomize=True, database=None, print_blob=True,
        # function-scoped fixtures only install sentinels, the same for every example; in-process calls vary in time
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    _hypothesis_settings.register_profile("full", _hypothesis_settings.get_profile("ci"), derandomize=False)
    _hypothesis_settings.load_profile(HYPOTHESIS_PROFILE)


def hypothesis_examples(ci: int, full: int) -> int:
    """The examples a property test runs under the loaded profile."""
    return full if HYPOTHESIS_PROFILE == "full" else ci


def find_postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), or None where the server is not installed."""
    import shutil
    from glob import glob

    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found and shutil.which("dpkg"):
        listed = subprocess.run(["dpkg", "-L", "postgresql-15"], capture_output=True, text=True).stdout.split()
        found = [p for p in listed if p.endswith("bin/initdb")]
    return Path(found[-1]).parent if found else None


PG_PREFIX = "fleetrl-pg-"


def stop_orphaned_postgres_servers(bindir: Path) -> None:
    """Stop and remove the servers of :func:`postgres_server` whose process is gone: a test session killed by SIGKILL
    (a timeout) never ran its ``finally``, and its server would run on. A folder that names no owner yet is another
    process's, just made, unless it is a minute old."""
    import shutil
    import tempfile
    import time

    import psutil

    for root in Path(tempfile.gettempdir()).glob(PG_PREFIX + "*"):
        owner = root / "owner"
        try:
            if owner.exists():
                pid = int(owner.read_text())
                if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    continue
            elif time.time() - root.stat().st_mtime < 60:
                continue
        except (OSError, ValueError, psutil.Error):
            continue
        if (root / "data" / "postmaster.pid").exists():
            folder = root.stat()  # the server runs as the folder's owner (nobody, where the tests run as root)
            as_user = {"user": folder.st_uid, "group": folder.st_gid, "extra_groups": []} if os.geteuid() == 0 else {}
            subprocess.run([bindir / "pg_ctl", "-D", root / "data", "-m", "immediate", "-w", "stop"], capture_output=True,
                           cwd=root, **as_user)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(address: str = "127.0.0.1", clients: str | None = None):
    """A throwaway PostgreSQL server listening on ``address`` only, as an unprivileged user (the server refuses root);
    yields its URL, which carries no password. Every route in (its socket, loopback, and ``clients``: a CIDR such as
    10.77.1.0/24) asks for the superuser's password (scram-sha-256), a random one for each server: trusting them would
    let any local user run commands as the server's OS user. The password is in a 0600 passfile that ``PGPASSFILE``
    names while the block runs, so libpq finds it for this process and the ones it starts (and sbatch passes that
    variable on to a job): it is never in a URL, an argv or a job script. Stopped when the block ends, however it ends,
    and its processes checked gone. Skips where the server is not installed, except under CI=true."""
    import pwd
    import secrets
    import shutil
    import socket
    import tempfile

    import psutil

    bindir = find_postgres_bin()
    if bindir is None:
        why = "PostgreSQL server binaries (initdb, pg_ctl) not found; apt-get install postgresql-15 to run this test"
        if os.environ.get("CI") == "true":  # .ci/run installs the server: a skip there would hide that CI stopped running the test
            pytest.fail(f"{why}. CI=true, where this test must run.")
        pytest.skip(why)
    stop_orphaned_postgres_servers(bindir)
    root = Path(tempfile.mkdtemp(prefix=PG_PREFIX))
    (root / "owner").write_text(str(os.getpid()))  # the process whose block stops it; see stop_orphaned_postgres_servers
    as_user = {}
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    with socket.socket() as s:
        s.bind((address, 0))
        port = s.getsockname()[1]
    data, log = root / "data", root / "server.log"
    password = secrets.token_urlsafe(24)  # letters, digits, - and _: nothing a passfile line must escape
    server: list[psutil.Process] = []

    def pg(*args) -> None:
        done = subprocess.run([bindir / args[0], *args[1:]], capture_output=True, text=True, cwd=root, **as_user)
        assert done.returncode == 0, f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}"

    # the client's passfile, apart from the server's folder (the client may be another user than the server's)
    fd, passfile = tempfile.mkstemp(prefix="fleetrl-pgpass-")  # 0600: libpq ignores a passfile others can read
    with os.fdopen(fd, "w") as f:
        f.write(f"*:{port}:*:postgres:{password}\n")
    given_passfile = os.environ.get("PGPASSFILE")
    try:
        pwfile = root / "pwfile"  # initdb sets the superuser's password from it: read by the server's user, then removed
        pwfile.write_text(password + "\n")
        pwfile.chmod(0o600)
        if as_user:
            os.chown(pwfile, as_user["user"], as_user["group"])
        pg("initdb", "-D", data, "-U", "postgres", "--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8")
        pwfile.unlink()
        if clients is not None:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {clients} scram-sha-256\n")
        pg("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o", f"-p {port} -h {address} -k {root} -F", "start")
        postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
        server += [postmaster, *postmaster.children(recursive=True)]
        os.environ["PGPASSFILE"] = passfile
        yield f"postgresql://postgres@{address}:{port}/postgres"
    finally:
        if given_passfile is None:
            os.environ.pop("PGPASSFILE", None)
        else:
            os.environ["PGPASSFILE"] = given_passfile
        os.unlink(passfile)
        subprocess.run([bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"], capture_output=True, cwd=root, **as_user)
        _, left = psutil.wait_procs(server, timeout=30)
        for proc in left:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"the test's PostgreSQL server outlived pg_ctl stop: {left}"


@pytest.fixture(scope="session")
def postgres_url():
    """One throwaway PostgreSQL server on a free loopback port (:func:`postgres_server`) for the tests of this session (a
    start, initdb and pg_ctl, costs seconds): each test that uses it names its own study, so they do not meet there.
    ``PGPASSFILE`` names its passfile for the rest of the session."""
    with postgres_server() as url:
        yield url


def dqn_updates_made(total_timesteps: int, learning_starts: int = 1000, train_frequency: int = 10) -> int:
    """CleanRL's dqn.py count, for one env: an update at every ``global_step`` in ``range(total_timesteps)`` that is past
    ``learning_starts`` and a multiple of ``train_frequency``."""
    return sum(1 for step in range(total_timesteps) if step > learning_starts and step % train_frequency == 0)


# ---- the suite's own profile: FLEETRL_TEST_PROFILE=FILE appends a JSON line per test (benchmarks/suite_profile.py) ----
_PROFILE = os.environ.get("FLEETRL_TEST_PROFILE")
if _PROFILE:
    import json  # noqa: E402
    import resource  # noqa: E402
    import time  # noqa: E402

    import pytest  # noqa: E402

    _starts = {"n": 0}
    _popen_init = subprocess.Popen.__init__

    def _counted_popen_init(self, *args, **kwargs):  # every process a test starts through subprocess (fleetrl, torchrun, ...)
        _starts["n"] += 1
        _popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = _counted_popen_init

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """Wall time (setup, call and teardown: fixtures count), this process's CPU, and the CPU of the processes it started
        and waited for, per test."""
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        starts, began = _starts["n"], time.perf_counter()
        yield
        own2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        record = {"test": item.nodeid, "wall_s": round(time.perf_counter() - began, 3),
                  "own_cpu_s": round(own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime, 3),
                  "children_cpu_s": round(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime, 3),
                  "processes_started": _starts["n"] - starts, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
        with open(_PROFILE, "a") as log:
            log.write(json.dumps(record) + "\n")


# ---- a user's code and short trains in the test's own process (issue 46: a process start that imports torch costs ~2.5 s) ----
@contextlib.contextmanager
def user_code_forgotten(*folders: str | Path):
    """Restore what an in-process train or eval changes in this process as the block ends: torch's thread count (a run
    sets it), ``sys.path`` (a user's file puts its folder first) and ``sys.argv``, and the modules imported from under
    ``folders`` (a user's ``my_ppo``, ``mypkg.algo``): a later test's file of the same name must be imported afresh, not
    refused as another file's name (fleetrl/algos/source.py)."""
    import torch

    modules, path, argv, threads = set(sys.modules), list(sys.path), list(sys.argv), torch.get_num_threads()
    roots = [Path(folder).resolve() for folder in folders]
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        sys.path[:] = path
        sys.argv[:] = argv
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules.get(name), "__file__", None)
            if file and any(Path(file).resolve().is_relative_to(root) for root in roots):
                sys.modules.pop(name, None)


def run_fleetrl_here(*args: str, cwd: str | Path | None = None, user_code: str | Path | None = None) -> subprocess.CompletedProcess:
    """:func:`run_fleetrl_in_process` for a command that trains or loads code: torch's threads restored after, and the
    modules of a user's code under ``user_code`` (default: ``cwd``) forgotten (:func:`user_code_forgotten`)."""
    folders = [f for f in (user_code or cwd,) if f is not None]
    with user_code_forgotten(*folders):
        return run_fleetrl_in_process(*args, cwd=cwd)


def run_python_file_here(file: str, *args: str, cwd: str | Path) -> subprocess.CompletedProcess:
    """``python FILE ARGS`` run in ``cwd`` in this process (runpy, as ``__main__``, its folder first on the path, argv[0]
    as given), its output and exit status as :func:`run_fleetrl` gives them; then forgotten as :func:`run_fleetrl_here`
    does. A test that needs the interpreter's own start (signals, exit codes of the process) runs it for real."""
    import io
    import runpy
    import traceback

    out, err, code = io.StringIO(), io.StringIO(), 0
    with user_code_forgotten(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd):
        sys.argv[:] = [file, *args]
        sys.path.insert(0, str(Path(file).resolve().parent))
        try:
            runpy.run_path(file, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: a traceback and status 1
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["python", file, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def child_env(monkeypatch) -> None:
    """This process's environment as :func:`run_fleetrl` gives its process (the tests folder importable, one thread), for a
    command run here whose runs are processes of their own (`fleetrl benchmark`, `fleetrl tune`): they inherit it."""
    for name, value in fleetrl_env().items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
