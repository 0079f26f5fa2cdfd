"""fleetrl's multi-process asynchronous vector backend: sample data in shared memory, wake-ups on pipes.

How it works
------------
* The parent allocates one shared-memory block (a ``RawArray``) holding every per-step array:
  observations, final observations, actions, rewards, terminated/truncated flags, the episode
  statistics and their masks, reset seeds and a status byte per worker. Parent and workers map it as
  numpy views, so no sample data is ever pickled.
* Envs are split into contiguous groups, one group per worker process. To step a group, the parent
  writes the actions into shared memory and one command byte into the worker's pipe. The worker
  steps its envs (same-step autoreset, as in :mod:`fleetrl.envs.vector`), writes the results straight
  into the shared arrays and writes its 2-byte worker index into one result pipe shared by all
  workers. A pipe write/read is a system call, so it also orders the memory accesses around it.
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
  and are closed by ``close()`` or a ``weakref.finalize`` (which also runs at exit). An exception in
  an env, or a worker's death, reaches the caller as :class:`fleetrl.errors.EnvWorkerError` with the
  worker's traceback; the parent waits with ``poll`` on the result pipe *and* on every worker's
  process sentinel, so a death is seen at once, never as a hang.
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
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.errors import EnvWorkerError, FleetError

# One-byte commands on a worker's pipe.
_STEP, _RESET, _CLOSE = b"s", b"r", b"c"
# Status byte a worker leaves in shared memory before it reports on the result pipe.
_OK, _FAILED = 0, 1

_RECORD = 2  # bytes per result record: the worker index as a native uint16
_READ_SIZE = 4096  # a multiple of _RECORD, so a read never splits a record
_LIVENESS_POLL_MS = 1000  # a waiting parent re-checks every worker this often (sentinels catch most deaths at once)
_ORPHAN_POLL_MS = 1000  # an idle worker checks this often that its parent still lives
_CLOSE_GRACE_S = 2.0  # close(): time for workers to exit on their own before SIGTERM, then SIGKILL
_ERROR_MESSAGE_WAIT_S = 5.0  # how long to wait for a failed worker's traceback
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
    # The parent owns shutdown: a Ctrl-C in the terminal reaches the whole process group, and a worker
    # dying mid-step would turn a clean stop into an EnvWorkerError.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_threads()
    # forkserver children inherit the server's sys.path and cwd, not the parent's current ones; custom
    # env modules (``mymod:MyEnv-v0``) must import here exactly as they do in the parent.
    sys.path[:] = list(sys_path) + [p for p in sys.path if p not in sys_path]
    try:
        os.chdir(cwd)
    except OSError:
        pass
    cmd_fd, result_fd = cmd_conn.fileno(), result_conn.fileno()
    record = index.to_bytes(_RECORD, sys.byteorder)
    views = _map_views(buffer, layout)
    status = views["status"]
    original_ppid = os.getppid()

    def report_failure(env_index: int, phase: str) -> None:
        status[index] = _FAILED
        try:
            error_conn.send((env_index, phase, traceback.format_exc()))
        except Exception:  # the parent is gone or closed the pipe; nothing more to tell
            pass

    envs: list[gym.Env] = []
    i = lo
    try:
        env_fns, obs_space, act_space = pickle.loads(payload)
        _limit_threads()
        for i, env_fn in enumerate(env_fns, start=lo):
            env = env_fn()
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
    seeds, seeded = views["seeds"], views["seeded"]
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
                # parent). forkserver workers are re-parented when the server exits with the parent.
                if not poller.poll(_ORPHAN_POLL_MS):
                    if os.getppid() != original_ppid or not _pid_alive(parent_pid):
                        break
                    continue
                try:
                    cmd = os.read(cmd_fd, 1)
                except BlockingIOError:
                    continue
            if cmd == _CLOSE or not cmd:  # b"": the parent closed its end
                break
            if status[index] != _OK:  # a failed worker only waits to be closed
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
    procs: list[mp.process.BaseProcess], cmd_conns: list[Connection], other_conns: list[Connection]
) -> None:
    """Ask every worker to exit, then SIGTERM and SIGKILL the ones that do not; reap them, close the pipes."""
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
    for proc in procs:
        proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in cmd_conns + other_conns:
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

        ctx = mp.get_context(self.start_method)
        self._buffer = ctx.RawArray(ctypes.c_uint8, nbytes)
        self._views = _map_views(self._buffer, layout)
        self._status = self._views["status"]
        self._env_ids_all = np.arange(n, dtype=np.int64)

        result_r, result_w = ctx.Pipe(duplex=False)
        cmd_pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
        err_pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
        self._cmd_fds = [w.fileno() for _, w in cmd_pipes]
        self._err_conns = [r for r, _ in err_pipes]
        self._result_conn = result_r
        self._result_fd = result_r.fileno()
        os.set_blocking(self._result_fd, False)  # try a read first; poll only when nothing is there

        # The env functions travel pickled as bytes, unpickled by the worker once it has the parent's
        # sys.path: unpickling may import the env's module.
        try:
            payloads = [
                pickle.dumps((env_fns[lo:hi], self.single_observation_space, self.single_action_space))
                for lo, hi in self._bounds
            ]
        except Exception as exc:
            raise FleetError(
                f"SharedMemoryVectorEnv sends the env functions to worker processes, so they must be "
                f"picklable (module-level functions or classes such as EnvFactory, not lambdas): {exc}"
            ) from None

        sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        self._procs: list[mp.process.BaseProcess] = []
        saved_env = {var: os.environ.get(var) for var in _THREAD_VARS}
        # A spawned (or freshly started forkserver) child takes os.environ at start: set the thread
        # limits there so numpy/torch see them at import, before the worker function runs.
        os.environ.update({var: "1" for var in _THREAD_VARS})
        started = False
        try:
            for w, (lo, _) in enumerate(self._bounds):
                proc = ctx.Process(
                    target=_worker_main,
                    name=f"fleetrl-env-worker-{w}",
                    args=(w, lo, payloads[w], self._buffer, layout, cmd_pipes[w][0], result_w, err_pipes[w][1],
                          sys_path, os.getcwd(), os.getpid(), self.spin_us * 1e-6),
                    daemon=True,  # belt and braces: multiprocessing terminates daemons at a normal exit
                )
                proc.start()
                self._procs.append(proc)
            started = True
        finally:
            for var, value in saved_env.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            # The parent keeps the write ends of the command pipes and the read ends of the others only.
            self._finalizer = weakref.finalize(
                self, _shutdown_workers, self._procs, [w for _, w in cmd_pipes], self._err_conns + [result_r]
            )
            for conn in [r for r, _ in cmd_pipes] + [w for _, w in err_pipes] + [result_w]:
                conn.close()
            if not started:  # stop the workers that did start
                self._finalizer()
        self._closed = False

        self._poller = select.poll()
        self._poller.register(self._result_fd, select.POLLIN)
        for proc in self._procs:  # a process sentinel becomes readable when the process exits
            self._poller.register(proc.sentinel, select.POLLIN)
        self._in_flight = [True] * num_workers  # each worker reports once its envs are built
        self._ready: deque[int] = deque()
        try:
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
        else:
            self._views["seeds"][:] = seed + self._env_ids_all
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
        """The process id of each worker (for monitoring and tests)."""
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
            raise FleetError("This SharedMemoryVectorEnv is closed (after close() or a worker failure).")

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
        try:
            os.write(self._cmd_fds[worker], cmd)
        except OSError:  # nobody reads the pipe any more: the worker is gone
            self._raise_if_dead(force_worker=worker)
        self._in_flight[worker] = True

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

    def _wait_for_results(self) -> None:
        """Block until at least one worker reports; raise EnvWorkerError on a failure or a death."""
        while True:
            try:
                data = os.read(self._result_fd, _READ_SIZE)
            except BlockingIOError:
                data = None
            if data:
                failed = None
                for w in memoryview(data).cast("H").tolist():
                    self._in_flight[w] = False
                    if self._status[w] != _OK and failed is None:
                        failed = w
                    self._ready.append(w)
                if failed is not None:
                    self._raise_worker_failure(failed)
                return
            if data == b"":  # end of file: every worker closed its end, so they are all gone
                self._raise_if_dead()
                time.sleep(0.01)
                continue
            events = self._poller.poll(_LIVENESS_POLL_MS)
            if not events or any(fd != self._result_fd for fd, _ in events):
                self._raise_if_dead()

    def _raise_if_dead(self, force_worker: int | None = None) -> None:
        for w, proc in enumerate(self._procs):
            if proc.is_alive() and w != force_worker:
                continue
            # A worker that reported a failure and then died: its traceback is the better message.
            # (Its status byte says so; a dead worker's error pipe always polls readable, at EOF.)
            if self._status[w] != _OK:
                self._raise_worker_failure(w)
            lo, hi = self._bounds[w]
            proc.join(0.1)
            code = proc.exitcode
            how = f"exit code {code}"
            if code is not None and code < 0:
                try:
                    how += f" (killed by {signal.Signals(-code).name})"
                except ValueError:
                    pass
            err = EnvWorkerError(
                f"Env worker {w} (pid {proc.pid}, envs {lo}..{hi - 1}, {self._env_names[lo]!r}) died "
                f"unexpectedly with {how}. It was killed, ran out of memory or crashed in native code. "
                f"The vector env is closed.",
                env_index=lo,
                worker_index=w,
            )
            self.close()
            raise err

    def _raise_worker_failure(self, w: int) -> None:
        lo, _ = self._bounds[w]
        env_index, phase, tb = lo, "step", "(the worker sent no traceback)"
        try:
            if self._err_conns[w].poll(_ERROR_MESSAGE_WAIT_S):
                env_index, phase, tb = self._err_conns[w].recv()
        except (EOFError, OSError):
            pass
        err = EnvWorkerError(
            f"Env {env_index} ({self._env_names[env_index]!r}) in env worker {w} (pid {self._procs[w].pid}) "
            f"raised during {phase}. The vector env is closed. The worker's traceback:\n{tb.rstrip()}",
            env_index=env_index,
            worker_index=w,
        )
        self.close()
        raise err

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
