"""fleetrl's multi-process asynchronous vector backend: sample data in shared memory, wake-ups on pipes.

How it works
------------
* The parent allocates one shared-memory block (a ``RawArray``) holding every per-step array:
  observations, final observations, actions, rewards, terminated/truncated flags, the episode
  statistics and their masks, reset seeds, and a status byte and a progress count per worker. Parent and workers map it as
  numpy views, so no sample data is ever pickled.
* Envs are split into contiguous groups, one group per worker process. To step a group, the parent
  writes the actions into shared memory and one command byte into the worker's pipe. The worker
  steps its envs (same-step autoreset, as in :mod:`fleetrl.envs.vector`), writes the results straight
  into the shared arrays and writes a 4-byte record (its index and generation) into one result pipe
  shared by all workers. A pipe write/read is a system call, so it also orders the memory accesses around it.
* Raw ``os.write``/``os.read`` on the pipes' file descriptors are used instead of
  ``Connection.send``/``recv``: measured here, a round trip costs ~7 us raw against ~25-35 us with
  pickled messages, and a single result pipe lets the parent wait for "any worker" with one read.
* A worker that has just reported spins ~100 us for its next command before it sleeps (only when
  there are no more workers than CPUs, and it backs off when spinning does not pay): on a VM, waking
  a halted vCPU costs more than a cheap env's step.
* Dynamic scheduling follows EnvPool: ``send(actions, env_ids)`` starts a step, ``recv()`` returns the
  first ``async_batch`` envs that are ready, so a slow env does not idle the others. Readiness is
  per worker (a worker finishing its group makes all its envs ready).
* Hygiene: workers ignore SIGINT (the parent owns shutdown), poll their parent's liveness while idle,
  and are closed by ``close()`` or a ``weakref.finalize`` (which also runs at exit). The parent waits
  with ``poll`` on the result pipe *and* on every worker's process sentinel, with a deadline of
  ``env_timeout`` seconds per command, so a death or a hang is seen, never waited out.
* Failures: a worker whose env raises, that dies (SIGKILL, a segfault) or that hangs is restarted:
  what is left of it is killed, a new process takes its slot (same shared memory, same env
  functions, a new generation number that tells its reports from the old one's), and its envs are
  reset with seeds derived from the run's seeds and the restart count. The command that met the
  failure still returns, with the new reset observations: each of those envs' episodes ends there,
  as truncated, with ``final_obs`` the last observation it returned, reward 0 and no episode
  statistics. (An env the worker had finished stepping before the failure keeps that step's reward,
  flags and statistics; its episode is cut after it.) A worker that dies while idle is restarted
  when it is next sent a command, so results waiting for ``recv`` are never overwritten. Each
  restart prints one warning line. Past ``max_restarts`` restarts, or when an env fails to build at
  construction, the caller gets :class:`fleetrl.errors.EnvWorkerError` with the worker's traceback.
  An env that raises a :class:`fleetrl.errors.FleetError` (the output checks do) is not restarted
  either: it says the env is wrong, and the caller gets that error itself, as from the in-process
  backends. Either way the vector env is closed.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import time
import traceback
import weakref
from collections import deque
from multiprocessing.connection import Connection
from typing import Any, Callable, NoReturn, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.envs.wrappers import set_env_index
from fleetrl.errors import EnvWorkerError, FleetError

# One-byte commands on a worker's pipe.
_STEP, _RESET, _CLOSE = b"s", b"r", b"c"
# Status byte a worker leaves in shared memory before it reports on the result pipe.
_OK, _FAILED = 0, 1

# A result record is a native uint32: the worker index in the low 16 bits, the worker's generation
# (mod 2**16, one more per restart) in the high 16, so a replaced worker's late report is dropped.
_RECORD = 4
_READ_SIZE = 4096  # a multiple of _RECORD, so a read never splits a record
_ORPHAN_POLL_MS = 1000  # an idle worker checks this often that its parent still lives
_CLOSE_GRACE_S = 2.0  # close(): time for workers to exit on their own before SIGTERM, then SIGKILL
_ERROR_MESSAGE_WAIT_S = 5.0  # how long to wait for a failed worker's traceback
_KILL_WAIT_S = 5.0  # a restart waits this long for a SIGKILLed worker to go (else close() reaps it)
# A (re)started worker imports its env's modules and builds its envs (ROMs, simulators) before it
# answers; env_timeout measures a step or reset, so the build gets at least this long.
_MIN_BUILD_TIMEOUT_S = 30.0
DEFAULT_MAX_RESTARTS = 10
DEFAULT_ENV_TIMEOUT_S = 60.0
# How long an idle worker spins for its next command before it sleeps. Measured on a 2-vCPU VM
# (benchmarks/async_vector.py and variants): on an idle machine 100 us raised CartPole x8 (2 workers)
# from ~30k to ~38k steps/s and left a 200 us-per-step env unchanged; a spinning parent gained
# nothing, so the parent always sleeps. Spinning with sched_yield, or without the backoff below,
# cost up to 5x on a machine loaded with other processes.
DEFAULT_SPIN_US = 100.0
_PREEMPTED_S = 50e-6  # a spin iteration this long means the worker lost its CPU: stop spinning
_SPIN_MISSES = 2  # spins in a row that end without a command before the worker stops spinning ...
_SPIN_PAUSE = 1000  # ... for this many commands (e.g. while the parent runs a network between steps)
_ALIGN = 64  # byte alignment of each shared array (a cache line)
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# --------------------------------------------------------------------------------------------------
# Shared-memory layout: both sides compute numpy views from the same (name -> offset, shape, dtype).
# --------------------------------------------------------------------------------------------------

Layout = dict[str, tuple[int, tuple[int, ...], str]]
# obs, reward, terminated, truncated, info (+ env_ids for recv)
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
RecvResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]


def _fixed_shape_and_dtype(space: gym.Space, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """The per-env shape and dtype a space's batched array has (Box, Discrete, MultiDiscrete, MultiBinary)."""
    batched = gym.vector.utils.batch_space(space, 1)
    if batched.shape is None or batched.dtype is None:
        raise FleetError(
            f"SharedMemoryVectorEnv needs fixed-shape array {what}s (Box, Discrete, MultiDiscrete or "
            f"MultiBinary); got {space}. Flatten the space (gymnasium.wrappers.FlattenObservation) or use "
            f"the 'sync' backend."
        )
    return tuple(batched.shape[1:]), np.dtype(batched.dtype)


def _make_layout(
    num_envs: int, num_workers: int, obs_space: gym.Space, act_space: gym.Space
) -> tuple[Layout, int]:
    obs_shape, obs_dtype = _fixed_shape_and_dtype(obs_space, "observation")
    act_shape, act_dtype = _fixed_shape_and_dtype(act_space, "action")
    n = num_envs
    fields = [
        ("obs", (n, *obs_shape), obs_dtype),
        ("final_obs", (n, *obs_shape), obs_dtype),
        ("actions", (n, *act_shape), act_dtype),
        ("reward", (n,), np.dtype(np.float64)),
        ("terminated", (n,), np.dtype(np.bool_)),
        ("truncated", (n,), np.dtype(np.bool_)),
        ("final_mask", (n,), np.dtype(np.bool_)),
        ("episode_r", (n,), np.dtype(np.float64)),
        ("episode_l", (n,), np.dtype(np.int64)),
        ("episode_mask", (n,), np.dtype(np.bool_)),
        ("seeds", (n,), np.dtype(np.int64)),
        ("seeded", (n,), np.dtype(np.bool_)),
        ("status", (num_workers,), np.dtype(np.int8)),
        # envs of its group a worker has finished in the current step (the parent zeroes it per command):
        # after a failure, says whose results stand
        ("progress", (num_workers,), np.dtype(np.int64)),
    ]
    layout: Layout = {}
    offset = 0
    for name, shape, dtype in fields:
        layout[name] = (offset, shape, dtype.str)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return layout, max(offset, _ALIGN)


def _map_views(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    base = np.frombuffer(buffer, dtype=np.uint8)
    views = {}
    for name, (offset, shape, dtype) in layout.items():
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        views[name] = base[offset : offset + nbytes].view(dt).reshape(shape)
    return views


# --------------------------------------------------------------------------------------------------
# The worker process.
# --------------------------------------------------------------------------------------------------


def _limit_threads() -> None:
    """One env worker per core: a library thread pool per worker would oversubscribe the CPUs."""
    for var in _THREAD_VARS:
        os.environ[var] = "1"
    if "torch" in sys.modules:  # only if an env (or its module) imported it; never import it here
        sys.modules["torch"].set_num_threads(1)


def _worker_main(
    index: int,
    generation: int,
    lo: int,
    payload: bytes,
    buffer: Any,
    layout: Layout,
    cmd_conn: Connection,
    result_conn: Connection,
    error_conn: Connection,
    sys_path: list[str],
    cwd: str,
    parent_pid: int,
    spin_s: float,
) -> None:
    """Build envs ``lo .. lo+len(env_fns)-1``, then serve step/reset commands until told to close."""
    # The parent owns shutdown: a Ctrl-C in the terminal, or Slurm's SIGTERM before a preemption, reaches the
    # whole process group, and workers dying mid-step would turn the trainer's checkpoint-and-stop into restarts.
    # A worker still exits when its parent dies (see ``parent_pid``).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _limit_threads()
    # forkserver children inherit the server's sys.path and cwd, not the parent's current ones; custom
    # env modules (``mymod:MyEnv-v0``) must import here exactly as they do in the parent.
    sys.path[:] = list(sys_path) + [p for p in sys.path if p not in sys_path]
    try:
        os.chdir(cwd)
    except OSError:
        pass
    cmd_fd, result_fd = cmd_conn.fileno(), result_conn.fileno()
    record = (index | (generation & 0xFFFF) << 16).to_bytes(_RECORD, sys.byteorder)
    views = _map_views(buffer, layout)
    status = views["status"]

    def report_failure(env_index: int, phase: str) -> None:
        status[index] = _FAILED
        # A FleetError (an output check, a space mismatch) says the env is wrong: the parent stops
        # instead of restarting a worker that would fail the same way, and raises the error itself,
        # pickled apart so that an unpicklable one still leaves the traceback.
        exc, fleet_error = sys.exc_info()[1], None
        if isinstance(exc, FleetError):
            try:
                fleet_error = pickle.dumps(exc)
            except Exception:
                fleet_error = b""
        try:
            error_conn.send((env_index, phase, traceback.format_exc(), fleet_error))
        except Exception:  # the parent is gone or closed the pipe; nothing more to tell
            pass

    envs: list[gym.Env] = []
    i = lo
    try:
        env_fns, obs_space, act_space = pickle.loads(payload)
        _limit_threads()
        for i, env_fn in enumerate(env_fns, start=lo):
            env = env_fn()
            set_env_index(env, i)  # the output check's errors say which env of the vector
            envs.append(env)
            if env.observation_space != obs_space or env.action_space != act_space:
                raise FleetError(
                    f"env {i} has observation space {env.observation_space} and action space "
                    f"{env.action_space}, but env 0 has {obs_space} and {act_space}; all envs of a "
                    f"vector must share their spaces."
                )
        _limit_threads()
        status[index] = _OK
    except Exception:
        report_failure(i, "construction")
    os.write(result_fd, record)

    obs_buf, final_buf, act_buf = views["obs"], views["final_obs"], views["actions"]
    reward, terminated, truncated = views["reward"], views["terminated"], views["truncated"]
    final_mask, ep_r, ep_l, ep_mask = views["final_mask"], views["episode_r"], views["episode_l"], views["episode_mask"]
    seeds, seeded, progress = views["seeds"], views["seeded"], views["progress"]
    # act_buf[i] of a 1-D action array is a numpy scalar (a copy), as SyncVectorEnv passes it; an
    # array action must be copied, or an env keeping it would see the parent's next actions.
    scalar_actions = act_buf.ndim == 1

    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    os.set_blocking(cmd_fd, False)  # our end only: the parent writes through another file description
    perf_counter = time.perf_counter
    spin_misses = spin_pause = 0
    try:
        while True:
            # Spin briefly for the next command before sleeping: on a VM an idle vCPU halts, and waking
            # it costs more than a cheap env's step. But a spinner loses the scheduler's wake-up
            # preference, which on a busy machine costs a whole time slice per step: so stop at the
            # first sign of preemption, and after a run of misses sleep at once for a while.
            cmd = None
            if spin_s and not spin_pause:
                now = perf_counter()
                deadline, last = now + spin_s, now
                while now < deadline and now - last < _PREEMPTED_S:
                    try:
                        cmd = os.read(cmd_fd, 1)
                        break
                    except BlockingIOError:
                        last, now = now, perf_counter()
                spin_misses = 0 if cmd is not None else spin_misses + 1
                if spin_misses >= _SPIN_MISSES:
                    spin_pause, spin_misses = _SPIN_PAUSE, 0
            elif spin_pause:
                spin_pause -= 1
            if cmd is None:
                # Idle: block on the command pipe, but wake now and then to notice an orphaning (a killed
                # trainer). Not the parent process: that is the forkserver, which SIGTERM to the process group
                # ends while the trainer lives on to checkpoint.
                if not poller.poll(_ORPHAN_POLL_MS):
                    if not _pid_alive(parent_pid):
                        break
                    continue
                try:
                    cmd = os.read(cmd_fd, 1)
                except BlockingIOError:
                    continue
            if cmd == _CLOSE or not cmd:  # b"": the parent closed its end
                break
            if status[index] != _OK:  # a failed worker only waits to be replaced or closed
                os.write(result_fd, record)
                continue
            try:
                if cmd == _STEP:
                    phase = "step"
                    for i, env in enumerate(envs, start=lo):
                        action = act_buf[i] if scalar_actions else act_buf[i].copy()
                        obs, rew, term, trunc, info = env.step(action)
                        if term or trunc:  # same-step autoreset: keep the last obs, start the next episode
                            final_buf[i] = obs
                            final_mask[i] = True
                            episode = info.get("episode")
                            if episode is not None:
                                ep_r[i], ep_l[i], ep_mask[i] = episode["r"], episode["l"], True
                            else:
                                ep_mask[i] = False
                            phase = "reset"
                            obs, _ = env.reset()
                            phase = "step"
                        else:
                            final_mask[i] = False
                            ep_mask[i] = False
                        obs_buf[i] = obs  # the one copy of the observation, straight into shared memory
                        reward[i], terminated[i], truncated[i] = rew, term, trunc
                        progress[index] = i - lo + 1
                elif cmd == _RESET:
                    phase = "reset"
                    for i, env in enumerate(envs, start=lo):
                        obs, _ = env.reset(seed=int(seeds[i]) if seeded[i] else None)
                        obs_buf[i] = obs
                        reward[i], terminated[i], truncated[i] = 0.0, False, False
                        final_mask[i], ep_mask[i] = False, False
            except Exception:
                report_failure(i, phase)
            os.write(result_fd, record)
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------------------
# Shutdown, shared by close() and the finalizer (so it must not reference the vector env itself).
# --------------------------------------------------------------------------------------------------


def _shutdown_workers(
    procs: list[mp.process.BaseProcess],
    cmd_conns: list[Connection],
    err_conns: list[Connection],
    other_conns: list[Connection],
    retired: list[mp.process.BaseProcess],
) -> None:
    """Ask every worker to exit, then SIGTERM and SIGKILL the ones that do not; reap them, close the pipes.

    The lists are the vector env's own, which a restart updates in place, so this always sees the
    current workers; ``retired``: replaced workers that a SIGKILL had not ended yet.
    """
    for proc, conn in zip(procs, cmd_conns):
        if proc.is_alive():
            try:
                os.write(conn.fileno(), _CLOSE)
            except OSError:  # already closed, or the worker died and nobody reads the pipe
                pass
    deadline = time.monotonic() + _CLOSE_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs + retired:
        proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in cmd_conns + err_conns + other_conns:
        try:
            conn.close()
        except OSError:
            pass


# --------------------------------------------------------------------------------------------------
# The vector env.
# --------------------------------------------------------------------------------------------------


def default_start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``.

    Both are safe when the parent already runs torch threads; ``fork`` starts faster, but forking a
    multi-threaded process can deadlock the child. Pass ``start_method="fork"`` to choose it anyway.
    """
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class SharedMemoryVectorEnv:
    """``num_envs`` envs stepped by ``num_workers`` processes over shared memory, with EnvPool-style async.

    Synchronous use is the interface of :mod:`fleetrl.envs.vector` (``reset``/``step``, same-step
    autoreset, ``final_obs`` and ``episode`` infos). Asynchronous use::

        envs = SharedMemoryVectorEnv(fns, num_workers=4, async_batch=4)
        obs, _ = envs.reset(seed=1)
        envs.send(policy(obs), np.arange(envs.num_envs))
        while training:
            obs, reward, terminated, truncated, info, env_ids = envs.recv()  # the first 4 envs ready
            envs.send(policy(obs), env_ids)

    Arrays returned by ``recv`` are indexed by position in ``env_ids``. With ``copy=False`` the
    observations are views of shared memory where possible, valid until those envs are sent again.
    ``spin_us``: how long an idle worker busy-waits for its next command before it sleeps (default:
    ``DEFAULT_SPIN_US`` when there are no more workers than CPUs, else 0).

    ``max_restarts``: how many times, in all, workers whose env raised, that died or that hung may be
    restarted before the next failure raises :class:`EnvWorkerError` (``worker_restarts`` counts
    them). ``env_timeout``: seconds a worker may take for one step or reset of its envs before it
    counts as hung (None or 0: wait forever); building them may take longer (at least 30 s).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        num_workers: int | None = None,
        async_batch: int | None = None,
        start_method: str | None = None,
        *,
        copy: bool = True,
        spin_us: float | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        env_timeout: float | None = DEFAULT_ENV_TIMEOUT_S,
    ):
        self._closed = True  # until the workers are up, close() has nothing to do
        env_fns = list(env_fns)
        if not env_fns:
            raise FleetError("SharedMemoryVectorEnv needs at least one env function.")
        self.num_envs = n = len(env_fns)
        num_workers = min(n, os.cpu_count() or 1) if num_workers is None else int(num_workers)
        if not 1 <= num_workers <= n:
            raise FleetError(f"num_workers={num_workers} must be between 1 and the number of envs ({n}).")
        self.num_workers = num_workers
        self.async_batch = n if async_batch is None else int(async_batch)
        self._check_async_batch()
        self.start_method = start_method or default_start_method()
        if self.start_method not in mp.get_all_start_methods():
            raise FleetError(
                f"start_method={self.start_method!r} is not available here; choose one of: "
                f"{', '.join(mp.get_all_start_methods())}."
            )
        self.copy = copy
        # Spinning pays when each worker can keep a core; with more workers than cores it steals
        # the cores that the stepping workers need (measured: benchmarks/async_vector.py).
        if spin_us is None:
            spin_us = DEFAULT_SPIN_US if num_workers <= (os.cpu_count() or 1) else 0.0
        self.spin_us = float(spin_us)
        if max_restarts < 0:
            raise FleetError(f"max_restarts={max_restarts} must be 0 (never restart a worker) or more.")
        self.max_restarts = int(max_restarts)
        self.worker_restarts = 0  # workers restarted so far, all of them together
        if env_timeout is not None and env_timeout < 0:
            raise FleetError(f"env_timeout={env_timeout} must be a number of seconds, or 0 or None to wait forever.")
        self.env_timeout = float(env_timeout) if env_timeout else None
        self._build_timeout = max(self.env_timeout, _MIN_BUILD_TIMEOUT_S) if self.env_timeout else None
        self._env_names = [str(getattr(fn, "env_id", None) or repr(fn)) for fn in env_fns]

        # Spaces come from one env built here, as gymnasium's AsyncVectorEnv does: the shared block
        # must be sized before the workers start.
        probe = env_fns[0]()
        try:
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
        finally:
            probe.close()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        layout, nbytes = _make_layout(n, num_workers, self.single_observation_space, self.single_action_space)

        # Contiguous groups, sizes differing by at most one (the first groups take the extra envs).
        sizes = [n // num_workers + (1 if w < n % num_workers else 0) for w in range(num_workers)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self._bounds = [(int(starts[w]), int(starts[w + 1])) for w in range(num_workers)]
        self._group_size = sizes
        self._env_worker = np.repeat(np.arange(num_workers), sizes)

        self._ctx = ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload(["fleetrl.envs.forkserver_init"])  # the server outlives a SIGTERM to the group
        self._layout = layout
        self._buffer = ctx.RawArray(ctypes.c_uint8, nbytes)
        self._views = _map_views(self._buffer, layout)
        self._status = self._views["status"]
        self._progress = self._views["progress"]
        self._env_ids_all = np.arange(n, dtype=np.int64)
        self._seed_base: np.ndarray | None = None  # each env's seed at the last reset(seed), for restarts

        # The env functions travel pickled as bytes, unpickled by the worker once it has the parent's
        # sys.path: unpickling may import the env's module. Kept, to start a replacement worker.
        try:
            self._payloads = [
                pickle.dumps((env_fns[lo:hi], self.single_observation_space, self.single_action_space))
                for lo, hi in self._bounds
            ]
        except Exception as exc:
            raise FleetError(
                f"SharedMemoryVectorEnv sends the env functions to worker processes, so they must be "
                f"picklable (module-level functions or classes such as EnvFactory, not lambdas): {exc}"
            ) from None
        self._sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        self._cwd = os.getcwd()

        # One result pipe for all workers. The parent keeps its write end too, for workers it starts
        # later (restarts); deaths are seen on the process sentinels, not as end-of-file here.
        self._result_conn, self._result_w = ctx.Pipe(duplex=False)
        self._result_fd = self._result_conn.fileno()
        os.set_blocking(self._result_fd, False)  # try a read first; poll only when nothing is there
        self._poller = select.poll()
        self._poller.register(self._result_fd, select.POLLIN)

        # Per-worker state, indexed by worker; a restart replaces entries in place (the finalizer holds
        # these very lists).
        self._procs: list[mp.process.BaseProcess] = []
        self._cmd_conns: list[Connection] = []  # the parent's write end of each command pipe
        self._err_conns: list[Connection] = []  # the parent's read end of each traceback pipe
        self._cmd_fds: list[int] = []
        self._retired: list[mp.process.BaseProcess] = []
        self._sentinel_of: dict[int, int] = {}  # process sentinel fd -> worker
        self._generation = [0] * num_workers
        self._restarts_of = [0] * num_workers  # per worker: it derives the restarted envs' seeds
        # None: serving. "start": building its envs at construction (a failure raises). "build" and
        # "reset": a restarted worker building, then resetting its envs (a failure restarts it again).
        self._phase: list[str | None] = ["start"] * num_workers
        self._cmd_of: list[bytes | None] = [None] * num_workers  # the command in flight (or met a failure)
        self._deadline = [float("inf")] * num_workers  # time.monotonic() by which the worker must report
        self._died_idle: list[tuple[str, str] | None] = [None] * num_workers  # restart at the next command
        self._kept: list[tuple[np.ndarray, ...] | None] = [None] * num_workers  # see _keep_finished_step
        self._in_flight = [True] * num_workers  # each worker reports once its envs are built
        self._ready: deque[int] = deque()
        self._finalizer = weakref.finalize(
            self, _shutdown_workers, self._procs, self._cmd_conns, self._err_conns,
            [self._result_conn, self._result_w], self._retired,
        )
        self._closed = False
        try:
            for w in range(num_workers):
                self._start_worker(w)
                if self._build_timeout:
                    self._deadline[w] = time.monotonic() + self._build_timeout
            self._collect(n)
        except BaseException:  # a failed build raised EnvWorkerError (and closed); Ctrl-C must close too
            self.close()
            raise

    # ---- the synchronous interface ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (env ``i`` seeded with ``seed + i``); steps still in flight are discarded."""
        self.async_reset(seed)
        workers = self._collect(self.num_envs)
        obs, *_ = self._gather(workers)
        return obs, {}

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every env once and wait for all of them (``async_batch`` does not apply)."""
        self._check_open()
        if any(self._in_flight) or self._ready:
            raise FleetError(
                "step() steps every env, but some envs still have a send() whose results recv() has not "
                "returned; finish the send/recv cycle (or call reset()) before step()."
            )
        self._write_actions(actions, slice(None), self.num_envs)
        for w in range(self.num_workers):
            self._command(w, _STEP)
        obs, reward, terminated, truncated, info, _ = self._gather(self._collect(self.num_envs))
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Stop every worker (politely, then SIGTERM, then SIGKILL) and release the pipes."""
        self._closed = True
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> "SharedMemoryVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the asynchronous interface (EnvPool's send/recv) ----------------------------------------

    def async_reset(self, seed: int | None = None) -> None:
        """Start a reset of every env; ``recv`` then returns reset observations (reward 0, no flags)."""
        self._check_open()
        self._drain()
        if seed is None:
            self._views["seeded"][:] = False
            self._seed_base = None
        else:
            self._seed_base = seed + self._env_ids_all
            self._views["seeds"][:] = self._seed_base
            self._views["seeded"][:] = True
        for w in range(self.num_workers):
            self._command(w, _RESET)

    def send(self, actions: np.ndarray, env_ids: np.ndarray | Sequence[int] | None = None) -> None:
        """Start a step of ``env_ids`` (all envs if None) with ``actions[k]`` for env ``env_ids[k]``.

        ``env_ids`` must cover whole worker groups (as ``recv`` returns them) of envs not in flight.
        """
        self._check_open()
        if env_ids is None:
            ids: np.ndarray | slice = slice(None)
            workers = list(range(self.num_workers))
            count = self.num_envs
        else:
            ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
            workers = self._workers_of(ids)
            count = ids.size
        for w in workers:
            if self._in_flight[w] or w in self._ready:
                lo, hi = self._bounds[w]
                raise FleetError(
                    f"send() got envs {lo}..{hi - 1} (worker {w}), which are still in flight; recv() their "
                    f"results before sending them new actions."
                )
        self._write_actions(actions, ids, count)
        for w in workers:
            self._command(w, _STEP)

    def recv(self, env_ids: np.ndarray | Sequence[int] | None = None) -> RecvResult:
        """The first ``async_batch`` envs to finish: ``obs, reward, terminated, truncated, info, env_ids``.

        ``env_ids``: wait for exactly these envs instead (whole worker groups that were sent), as the
        zero-lag sampler does with its two halves; results of other envs that finish meanwhile wait.
        """
        self._check_open()
        if env_ids is not None:
            workers = self._workers_of(np.asarray(env_ids, dtype=np.int64).reshape(-1))
            for w in workers:
                if not (self._in_flight[w] or w in self._ready):
                    lo, hi = self._bounds[w]
                    raise FleetError(f"recv() waits for envs {lo}..{hi - 1}, which were not sent; send() them first.")
            return self._gather(self._collect_workers(workers))
        pending = sum(self._group_size[w] for w in range(self.num_workers) if self._in_flight[w])
        pending += sum(self._group_size[w] for w in self._ready)
        if pending < self.async_batch:
            raise FleetError(
                f"recv() waits for async_batch={self.async_batch} envs, but only {pending} are in flight; "
                f"send() actions to more envs first."
            )
        return self._gather(self._collect(self.async_batch))

    steps_in_background = True  # send() returns at once; the workers step while the caller computes

    def split(self, count: int) -> list[np.ndarray]:
        """Up to ``count`` groups of env ids, each of whole worker groups, to send and receive apart."""
        groups = np.array_split(np.arange(self.num_workers), min(count, self.num_workers))
        return [np.concatenate([self._env_ids_all[slice(*self._bounds[w])] for w in workers]) for workers in groups]

    @property
    def worker_pids(self) -> list[int | None]:
        """The process id of each worker (for monitoring and tests); a restarted worker has a new one."""
        return [p.pid for p in self._procs]

    def __repr__(self) -> str:
        return (
            f"SharedMemoryVectorEnv(num_envs={self.num_envs}, num_workers={self.num_workers}, "
            f"async_batch={self.async_batch}, start_method={self.start_method!r})"
        )

    # ---- internals -------------------------------------------------------------------------------

    def _check_async_batch(self) -> None:
        n, w, b = self.num_envs, self.num_workers, self.async_batch
        if not 1 <= b <= n:
            raise FleetError(f"async_batch={b} must be between 1 and num_envs={n}.")
        if b == n:
            return
        if n % w:
            raise FleetError(
                f"async_batch={b} < num_envs={n} needs equal worker groups, but {n} envs do not split evenly "
                f"over num_workers={w}; choose num_workers dividing {n}."
            )
        per_worker = n // w
        if b % per_worker:
            choices = ", ".join(str(k) for k in range(per_worker, n + 1, per_worker))
            raise FleetError(
                f"async_batch={b} must be a multiple of the {per_worker} envs each worker steps "
                f"(num_envs={n} / num_workers={w}), since a worker's envs become ready together; "
                f"use one of {choices}, or change num_workers."
            )

    def _check_open(self) -> None:
        if self._closed:
            raise FleetError("This SharedMemoryVectorEnv is closed (after close() or an EnvWorkerError).")

    def _workers_of(self, ids: np.ndarray) -> list[int]:
        """The workers that ``ids`` names, checking it covers each of their groups exactly once."""
        n = self.num_envs
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise FleetError(f"env_ids must lie in 0..{n - 1}; got {ids.tolist()}.")
        seen = np.zeros(n, dtype=bool)
        seen[ids] = True
        counts = np.bincount(self._env_worker[ids], minlength=self.num_workers)
        workers = np.flatnonzero(counts).tolist()
        if int(seen.sum()) != ids.size or any(counts[w] != self._group_size[w] for w in workers):
            groups = ", ".join(f"{lo}..{hi - 1}" for lo, hi in self._bounds)
            raise FleetError(
                f"send() env_ids must be whole worker groups without repeats (the groups are {groups}); "
                f"got {ids.tolist()}. Pass back the env_ids that recv() returned."
            )
        return workers

    def _write_actions(self, actions: Any, ids: np.ndarray | slice, count: int) -> None:
        actions = np.asarray(actions)
        buf = self._views["actions"]
        if actions.shape != (count, *buf.shape[1:]):
            raise FleetError(
                f"Expected actions of shape {(count, *buf.shape[1:])} (one per env sent), got {actions.shape}."
            )
        buf[ids] = actions

    def _command(self, worker: int, cmd: bytes) -> None:
        self._in_flight[worker] = True
        self._cmd_of[worker] = cmd
        self._progress[worker] = 0
        if self.env_timeout:
            self._deadline[worker] = time.monotonic() + self.env_timeout
        if self._died_idle[worker] is not None:  # it died since its last report: restart it for this command
            self._restart(worker, *self._died_idle[worker])
            return
        try:
            os.write(self._cmd_fds[worker], cmd)
        except OSError:  # nobody reads the pipe: the worker died, and its sentinel will say so
            pass

    def _drain(self) -> None:
        """Wait out every command in flight and drop unreturned results (before a reset)."""
        while any(self._in_flight):
            self._wait_for_results()
        self._ready.clear()

    def _collect(self, num_envs: int) -> list[int]:
        """Take ready workers, in the order they finished, until they hold ``num_envs`` envs."""
        workers: list[int] = []
        count = 0
        while count < num_envs:
            if not self._ready:
                self._wait_for_results()
            w = self._ready.popleft()
            workers.append(w)
            count += self._group_size[w]
        workers.sort()  # deterministic order within a batch: env_ids ascending
        return workers

    def _collect_workers(self, workers: list[int]) -> list[int]:
        """Wait until all of ``workers`` are ready and take them; other ready workers stay queued."""
        while not set(workers).issubset(self._ready):
            self._wait_for_results()
        for w in workers:
            self._ready.remove(w)
        return sorted(workers)

    # ---- waiting, and what a failure leads to ------------------------------------------------------

    def _wait_for_results(self) -> None:
        """Block until one more worker is ready, restarting those that fail, die or pass their deadline."""
        before = len(self._ready)
        while len(self._ready) == before:
            events = [] if self._read_results() else self._poller.poll(self._poll_timeout_ms())
            dead = [(w, fd) for fd, _ in events if (w := self._sentinel_of.get(fd)) is not None]
            if dead:
                self._read_results()  # a worker may report and then die: take its report first
            for w, fd in dead:
                if self._procs[w].sentinel == fd:  # not replaced meanwhile
                    self._worker_died(w)
            if self.env_timeout or self._build_timeout:
                now = time.monotonic()
                for w, deadline in enumerate(self._deadline):
                    if deadline <= now:
                        self._worker_hung(w)

    def _read_results(self) -> bool:
        """Take the reports waiting on the result pipe; False when there were none."""
        try:
            data = os.read(self._result_fd, _READ_SIZE)
        except BlockingIOError:
            return False
        for record in memoryview(data).cast("I").tolist():
            w = record & 0xFFFF
            if (record >> 16) == (self._generation[w] & 0xFFFF):  # else from a worker since replaced
                self._on_report(w)
        return bool(data)  # (never end-of-file: the parent holds a write end)

    def _poll_timeout_ms(self) -> int | None:
        deadline = min(self._deadline)
        if deadline == float("inf"):
            return None  # sentinels report deaths; nothing else to watch for
        return max(0, int((deadline - time.monotonic()) * 1000) + 1)

    def _on_report(self, w: int) -> None:
        """Worker ``w`` finished its command (or its build): queue it as ready, or go on with its restart."""
        if self._status[w] != _OK:
            self._worker_failed(w)
            return
        if self._phase[w] == "build":  # a restarted worker has built its envs: reset them
            self._reset_restarted(w)
            return
        if self._phase[w] == "reset" and self._cmd_of[w] == _STEP:
            self._cut_episodes(w)
        self._phase[w] = None
        self._in_flight[w] = False
        self._deadline[w] = float("inf")
        self._ready.append(w)

    def _worker_failed(self, w: int) -> None:
        """Worker ``w`` reported that an env raised: restart it, or stop if restarting cannot help."""
        lo, _ = self._bounds[w]
        env_index, phase, tb, fleet_error = lo, "step", "(the worker sent no traceback)", None
        try:
            if self._err_conns[w].poll(_ERROR_MESSAGE_WAIT_S):
                env_index, phase, tb, fleet_error = self._err_conns[w].recv()
        except (EOFError, OSError):
            pass
        tb = tb.rstrip()
        if fleet_error:  # the env's own FleetError: raised as it is, as the in-process backends raise it
            try:
                err = pickle.loads(fleet_error)
            except Exception:
                err = None
            if isinstance(err, FleetError):
                if getattr(err, "env_index", 0) is None:
                    err.env_index = env_index
                self.close()
                raise err
        what = (f"Env {env_index} ({self._env_names[env_index]!r}) in env worker {w} (pid {self._procs[w].pid}) "
                f"raised during {phase}")
        if fleet_error is not None or self._phase[w] == "start":
            self._fail(f"{what}. The vector env is closed. The worker's traceback:\n{tb}", env_index, w)
        last_line = tb.splitlines()[-1] if tb else "?"
        self._restart(w, f"env {env_index} raised during {phase}: {last_line}", what, tb, env_index)

    def _worker_died(self, w: int) -> None:
        """Worker ``w``'s process ended: restart it now if it owes a report, else at its next command."""
        if self._status[w] != _OK:  # it reported a failure, then died: its traceback is the better message
            self._worker_failed(w)
            return
        proc = self._procs[w]
        proc.join(0.1)
        code = proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {-code}, {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        lo, hi = self._bounds[w]
        what = (f"Env worker {w} (pid {proc.pid}, envs {lo}..{hi - 1}, {self._env_names[lo]!r}) died unexpectedly "
                f"({how}). It was killed, ran out of memory or crashed in native code")
        if self._phase[w] == "start":
            self._fail(f"{what}. The vector env is closed.", lo, w)
        if not self._in_flight[w]:
            # Its envs' last results may still wait for recv(), in shared memory; a restart now would
            # overwrite them. Stop watching it, and restart it when it is sent its next command.
            self._unwatch(w)
            self._died_idle[w] = (f"worker process died ({how})", what)
            return
        self._restart(w, f"worker process died ({how})", what)

    def _worker_hung(self, w: int) -> None:
        timeout = self._build_timeout if self._phase[w] in ("start", "build") else self.env_timeout
        lo, hi = self._bounds[w]
        building = self._phase[w] in ("start", "build")
        what = (f"Env worker {w} (pid {self._procs[w].pid}, envs {lo}..{hi - 1}, {self._env_names[lo]!r}) gave no "
                f"answer within {timeout:g} s " + ("(the time allowed to build envs), so an env hangs in construction"
                                                   if building else "(env_timeout), so an env hangs in step or reset"))
        if self._phase[w] == "start":
            self._fail(f"{what}. The vector env is closed.", lo, w)
        self._restart(w, f"no answer within {timeout:g} s", what)

    def _restart(self, w: int, cause: str, what: str, tb: str | None = None, env_index: int | None = None) -> None:
        """Replace worker ``w`` by a new process; it builds and resets its envs, then its command returns.

        ``cause``: one line for the warning; ``what``: the sentence that opens the error should the
        limit be reached; ``tb``: the worker's traceback, if it sent one.
        """
        lo, hi = self._bounds[w]
        env_index = lo if env_index is None else env_index
        if self.worker_restarts >= self.max_restarts:
            self._fail(
                f"{what}. Env workers of this vector env were restarted {self.worker_restarts} times already, "
                f"and max_restarts={self.max_restarts} allows no more: fix the env, or, if it only fails "
                f"now and then, allow more restarts with --max-env-restarts. The vector env is closed."
                + (f" The worker's traceback:\n{tb}" if tb else ""),
                env_index, w,
            )
        if self._phase[w] is None and self._cmd_of[w] == _STEP:  # (a failing restart keeps the first failure's)
            self._keep_finished_step(w)
        self.worker_restarts += 1
        self._restarts_of[w] += 1
        print(f"fleetrl: warning: restarting env worker {w} (envs {lo}..{hi - 1}, {self._env_names[lo]!r}; "
              f"restart {self.worker_restarts} of at most {self.max_restarts}): {cause}", file=sys.stderr, flush=True)
        self._stop_worker(w, polite=tb is not None)
        self._generation[w] += 1
        self._died_idle[w] = None
        self._start_worker(w)
        self._phase[w] = "build"
        self._in_flight[w] = True
        if self._build_timeout:
            self._deadline[w] = time.monotonic() + self._build_timeout

    def _reset_restarted(self, w: int) -> None:
        """Reset a restarted worker's envs, seeded from the run's seeds and this worker's restart count."""
        lo, hi = self._bounds[w]
        seeds, seeded = self._views["seeds"], self._views["seeded"]
        if self._seed_base is None:
            seeded[lo:hi] = False
        else:  # distinct from every seed+i of the run and from earlier restarts, yet reproducible
            seeds[lo:hi] = [int(np.random.SeedSequence(int(s), spawn_key=(self._restarts_of[w],)).generate_state(1)[0])
                            for s in self._seed_base[lo:hi]]
            seeded[lo:hi] = True
        self._phase[w] = "reset"
        if self.env_timeout:
            self._deadline[w] = time.monotonic() + self.env_timeout
        try:
            os.write(self._cmd_fds[w], _RESET)
        except OSError:  # it died already; its sentinel will say so
            pass

    def _keep_finished_step(self, w: int) -> None:
        """Before the restart's reset overwrites them, keep what worker ``w``'s envs returned from the failed step.

        Envs that finished the step keep its result; the others (the one that failed, those after it,
        all of them if the worker died or hung) never returned from it. Every env's episode then ends
        on the last observation it returned: the terminal one if it ended in this step, else its obs.
        """
        lo, hi = self._bounds[w]
        v = self._views
        finished = np.arange(hi - lo) < int(v["progress"][w])
        ended = finished & v["final_mask"][lo:hi]
        self._kept[w] = (finished, ended, v["reward"][lo:hi].copy(), v["terminated"][lo:hi].copy(),
                         v["truncated"][lo:hi].copy(), v["episode_mask"][lo:hi].copy())
        v["final_obs"][lo:hi][~ended] = v["obs"][lo:hi][~ended]

    def _cut_episodes(self, w: int) -> None:
        """After a restart's reset: the failed step returns, each env's episode ended there (as truncated
        unless it ended in the step anyway), reward 0 and no episode statistics for those that did not
        finish it, and the reset observations."""
        finished, ended, reward, terminated, truncated, has_stats = self._kept[w]
        sl = slice(*self._bounds[w])
        v = self._views
        v["reward"][sl] = np.where(finished, reward, 0.0)
        v["terminated"][sl] = terminated & ended
        v["truncated"][sl] = np.where(ended, truncated, True)
        v["final_mask"][sl] = True
        v["episode_mask"][sl] = has_stats & ended

    def _fail(self, message: str, env_index: int, w: int) -> NoReturn:
        err = EnvWorkerError(message, env_index=env_index, worker_index=w)
        self.close()
        raise err

    # ---- worker processes --------------------------------------------------------------------------

    def _start_worker(self, w: int) -> None:
        """Start a process for worker slot ``w`` on new pipes; it reports once its envs are built."""
        ctx = self._ctx
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        self._status[w] = _OK
        saved_env = {var: os.environ.get(var) for var in _THREAD_VARS}
        # A spawned (or freshly started forkserver) child takes os.environ at start: set the thread
        # limits there so numpy/torch see them at import, before the worker function runs.
        os.environ.update({var: "1" for var in _THREAD_VARS})
        try:
            proc = ctx.Process(
                target=_worker_main,
                name=f"fleetrl-env-worker-{w}",
                args=(w, self._generation[w], self._bounds[w][0], self._payloads[w], self._buffer, self._layout,
                      cmd_r, self._result_w, err_w, self._sys_path, self._cwd, os.getpid(), self.spin_us * 1e-6),
                daemon=True,  # belt and braces: multiprocessing terminates daemons at a normal exit
            )
            proc.start()
        except BaseException:
            for conn in (cmd_r, cmd_w, err_r, err_w):
                conn.close()
            raise
        finally:
            for var, value in saved_env.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
        # The parent keeps the write end of the command pipe and the read end of the traceback pipe only.
        cmd_r.close()
        err_w.close()
        if w < len(self._procs):
            self._procs[w], self._cmd_conns[w], self._err_conns[w], self._cmd_fds[w] = proc, cmd_w, err_r, cmd_w.fileno()
        else:
            self._procs.append(proc)
            self._cmd_conns.append(cmd_w)
            self._err_conns.append(err_r)
            self._cmd_fds.append(cmd_w.fileno())
        self._poller.register(proc.sentinel, select.POLLIN)  # readable once the process exits
        self._sentinel_of[proc.sentinel] = w

    def _unwatch(self, w: int) -> None:
        sentinel = self._procs[w].sentinel
        if self._sentinel_of.pop(sentinel, None) is not None:
            self._poller.unregister(sentinel)

    def _stop_worker(self, w: int, polite: bool) -> None:
        """End worker ``w``'s process: a live one whose env raised may close its envs first; else SIGKILL."""
        proc = self._procs[w]
        self._unwatch(w)
        if polite and proc.is_alive():
            try:
                os.write(self._cmd_fds[w], _CLOSE)
            except OSError:
                pass
            proc.join(_CLOSE_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(_KILL_WAIT_S)
        if proc.is_alive():  # stuck in the kernel: close() reaps it
            self._retired.append(proc)
        self._cmd_conns[w].close()
        self._err_conns[w].close()

    def _gather(self, workers: list[int]) -> RecvResult:
        """Copy the results of ``workers``' envs out of shared memory, indexed by position in env_ids."""
        v = self._views
        lo, hi = self._bounds[workers[0]][0], self._bounds[workers[-1]][1]
        if hi - lo == sum(self._group_size[w] for w in workers):  # contiguous: slices (views)
            sel: slice | np.ndarray = slice(lo, hi)
            env_ids = self._env_ids_all[lo:hi].copy()
            obs = v["obs"][sel].copy() if self.copy else v["obs"][sel]
            take = lambda a: a[sel].copy()  # noqa: E731
        else:  # fancy indexing copies once already
            sel = env_ids = np.concatenate([self._env_ids_all[slice(*self._bounds[w])] for w in workers])
            obs = v["obs"][sel]
            take = lambda a: a[sel]  # noqa: E731
        reward, terminated, truncated = take(v["reward"]), take(v["terminated"]), take(v["truncated"])
        info: dict[str, Any] = {}
        done = take(v["final_mask"])
        if done.any():
            final_obs = take(v["final_obs"])
            final_obs[~done] = 0  # stale rows from earlier episodes; only masked rows are valid
            info["final_obs"], info["_final_obs"] = final_obs, done
            has_stats = take(v["episode_mask"])
            if has_stats.any():
                info["episode"] = {
                    "r": np.where(has_stats, take(v["episode_r"]), 0.0),
                    "l": np.where(has_stats, take(v["episode_l"]), 0),
                }
                info["_episode"] = has_stats
        return obs, reward, terminated, truncated, info, env_ids
