"""fleetrl's multi-process asynchronous vector backend: sample data in shared memory, wake-ups on pipes.

How it works
------------
* The trainer allocates one shared-memory block (a ``RawArray``, :mod:`~fleetrl.envs.shm.layout`) holding every
  per-step array: observations, final observations, actions, rewards, terminated/truncated flags, the episode
  statistics and their masks, reset seeds, and a status byte per worker. Trainer and workers map it as numpy views,
  so no sample data is ever pickled.
* Envs are split into contiguous groups, one group per worker process (:mod:`~fleetrl.envs.shm.worker`). To step a
  group, the trainer writes the actions into shared memory and one command byte into the worker's pipe. The worker
  steps its envs (same-step autoreset, as in :mod:`fleetrl.envs.vector`), writes the results straight into the shared
  arrays and writes a 4-byte record (its index and generation) into one result pipe shared by all workers. A pipe
  write/read is a system call, so it also orders the memory accesses around it.
* **Stepping threads** (``threads``): a worker steps its envs one after another, or in that many slices at once,
  one thread each. Envs that wait (sleep, sockets, another process) release the GIL while they wait, so their waits
  overlap: 64 envs that each wait 5 ms take about 5 ms a step, not 64 x 5. Envs that compute gain nothing from
  threads (the GIL), and an env that is not safe to step from several threads takes ``threads=1``: processes only.
  ``fleetrl.envs.stepping`` sizes workers and threads from a measured step (docs/backends.md).
* Raw ``os.write``/``os.read`` on the pipes' file descriptors are used instead of ``Connection.send``/``recv``:
  measured here, a round trip costs ~7 us raw against ~25-35 us with pickled messages, and a single result pipe lets
  the trainer wait for "any worker" with one read.
* A worker that has just reported spins ~100 us for its next command before it sleeps (only when there are no more
  workers than CPUs, and it backs off when spinning does not pay): on a VM, waking a halted vCPU costs more than a
  cheap env's step.
* Dynamic scheduling follows EnvPool: ``send(actions, env_ids)`` starts a step, ``recv()`` returns the first
  ``async_batch`` envs that are ready, so a slow env does not idle the others. Readiness is per worker (a worker
  finishing its group makes all its envs ready).
* Hygiene: workers ignore SIGINT (the trainer owns shutdown), poll their parent's liveness while idle, and are closed
  by ``close()`` or a ``weakref.finalize`` (which also runs at exit). The trainer waits with ``poll`` on the result
  pipe *and* on every worker's process sentinel, with a deadline of ``env_timeout`` seconds per command, so a death or
  a hang is seen, never waited out.
* Failures: a worker whose env raises, that dies or that hangs is restarted by the
  :mod:`~fleetrl.envs.shm.supervisor`, which says what the step that met the failure returns.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import pickle
from typing import Any, Callable, Sequence

import cloudpickle
import gymnasium as gym
import numpy as np

from fleetrl import processes
from fleetrl.cores import available_cores
from fleetrl.envs.shm.layout import make_layout, map_views
from fleetrl.envs.shm.supervisor import Supervisor, Worker
from fleetrl.envs.registry import read_built
from fleetrl.envs.shm.worker import RESET, STEP
from fleetrl.envs.vector import check_async_batch
from fleetrl.errors import FleetError

DEFAULT_MAX_RESTARTS = 10
DEFAULT_ENV_TIMEOUT_S = 60.0
# How long an idle worker spins for its next command before it sleeps. Measured on a 2-vCPU VM
# (benchmarks/speed.py envs busy and variants): on an idle machine 100 us raised CartPole x8 (2 workers)
# from ~30k to ~38k steps/s and left a 200 us-per-step env unchanged; a spinning parent gained
# nothing, so the parent always sleeps. Spinning with sched_yield, or without the worker's backoff,
# cost up to 5x on a machine loaded with other processes.
DEFAULT_SPIN_US = 100.0

# obs, reward, terminated, truncated, info (+ env_ids for recv)
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
RecvResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]


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
    ``threads``: stepping threads in each worker (1: its envs step one after another; more: that many
    slices of them step at once, for envs that wait). ``spin_us``: how long an idle worker busy-waits
    for its next command before it sleeps (default: ``DEFAULT_SPIN_US`` when there are no more
    workers than cores, else 0).

    ``max_restarts``: how many times, in all, workers whose env raised, that died or that hung may be
    restarted before the next failure raises :class:`EnvWorkerError` (``worker_restarts`` counts
    them). ``env_timeout``: seconds a worker may take for one step or reset of its envs before it
    counts as hung (None or 0: wait forever); building them may take longer (at least 30 s).
    """

    steps_in_background = True  # send() returns at once; the workers step while the caller computes

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        num_workers: int | None = None,
        async_batch: int | None = None,
        start_method: str | None = None,
        *,
        threads: int = 1,
        copy: bool = True,
        spin_us: float | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        env_timeout: float | None = DEFAULT_ENV_TIMEOUT_S,
    ):
        self._supervisor: Supervisor | None = None  # until the workers are up, close() has nothing to do
        env_fns = list(env_fns)
        if not env_fns:
            raise FleetError("SharedMemoryVectorEnv needs at least one env function.")
        self.num_envs = n = len(env_fns)
        cores = available_cores()
        num_workers = min(n, cores) if num_workers is None else int(num_workers)
        if not 1 <= num_workers <= n:
            raise FleetError(f"num_workers={num_workers} must be between 1 and the number of envs ({n}).")
        self.num_workers = num_workers
        if int(threads) < 1:
            raise FleetError(f"threads={threads} must be at least 1 (1: each worker steps its envs one after another).")
        self.async_batch = n if async_batch is None else int(async_batch)
        check_async_batch(n, self.async_batch, "async", num_workers)
        self.start_method = start_method or processes.default_start_method()
        if self.start_method not in mp.get_all_start_methods():
            raise FleetError(
                f"start_method={self.start_method!r} is not available here; choose one of: "
                f"{', '.join(mp.get_all_start_methods())}."
            )
        self.copy = copy
        # Spinning pays when each worker can keep a core; with more workers than cores it steals
        # the cores that the stepping workers need (measured: benchmarks/speed.py envs busy).
        if spin_us is None:
            spin_us = DEFAULT_SPIN_US if num_workers <= cores else 0.0
        # Workers of envs that wait (stepping threads, or more workers than cores) run under SCHED_BATCH: a batch task
        # that wakes does not preempt the running one, so the trainer writes every worker its command before any of
        # them takes its core, instead of handing the core over at each command it writes (docs/backends.md).
        batch_scheduling = threads > 1 or num_workers > cores
        if max_restarts < 0:
            raise FleetError(f"max_restarts={max_restarts} must be 0 (never restart a worker) or more.")
        if env_timeout is not None and env_timeout < 0:
            raise FleetError(f"env_timeout={env_timeout} must be a number of seconds, or 0 or None to wait forever.")
        env_names = [str(getattr(fn, "env_id", None) or repr(fn)) for fn in env_fns]

        # Spaces come from one env built here, as gymnasium's AsyncVectorEnv does: the shared block
        # must be sized before the workers start. Its build is bounded as a worker's is.
        self.single_observation_space, self.single_action_space, rows = read_built(
            env_fns[0], lambda probe: (probe.observation_space, probe.action_space,
                                       getattr(probe.unwrapped, "agent_rows", None)),  # a multi-agent game (fleetrl/envs/multiagent.py): flags per agent
            env_names[0], env_timeout)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        layout, nbytes = make_layout(n, num_workers, self.single_observation_space, self.single_action_space, rows)

        # Contiguous groups, sizes differing by at most one (the first groups take the extra envs).
        sizes = [n // num_workers + (1 if w < n % num_workers else 0) for w in range(num_workers)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self._env_worker = np.repeat(np.arange(num_workers), sizes)
        self._env_ids_all = np.arange(n, dtype=np.int64)

        # The env functions travel pickled as bytes, unpickled by the worker once it has the parent's
        # sys.path: unpickling may import the env's module. Kept, to start a replacement worker. cloudpickle (as
        # gymnasium's AsyncVectorEnv uses) also takes closures and lambdas, such as CleanRL's make_env thunks.
        try:
            workers = [Worker(w, int(starts[w]), int(starts[w + 1]),
                              cloudpickle.dumps((env_fns[starts[w]:starts[w + 1]], self.single_observation_space,
                                                 self.single_action_space)))
                       for w in range(num_workers)]
        except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
            raise FleetError(
                f"SharedMemoryVectorEnv sends the env functions to worker processes, so they must be "
                f"picklable by cloudpickle (functions, closures or classes such as EnvFactory that hold no open "
                f"files, locks or live envs): {exc}"
            ) from None
        self._workers = workers
        self.threads = max(1, min(int(threads), max(sizes)))

        ctx = processes.context(self.start_method)  # a forkserver outlives a SIGTERM to the group
        buffer = ctx.RawArray(ctypes.c_uint8, nbytes)
        self._views = map_views(buffer, layout)
        self._supervisor = Supervisor(workers, ctx, buffer, layout, self._views, env_names, threads=self.threads,
                                      spin_us=float(spin_us), batch_scheduling=batch_scheduling, max_restarts=int(max_restarts),
                                      env_timeout=float(env_timeout) if env_timeout else None)
        try:
            self._supervisor.start()
        except BaseException:  # a failed build raised EnvWorkerError (and closed); Ctrl-C must close too
            self.close()
            raise

    # ---- the synchronous interface ---------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (env ``i`` seeded with ``seed + i``); steps still in flight are discarded."""
        self.async_reset(seed)
        obs, _, _, _, info, _ = self._gather(self._supervisor.take(self.num_envs))
        return obs, info  # {} unless keep_env_infos: then the envs' reset infos

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every env once and wait for all of them (``async_batch`` does not apply)."""
        self._check_open()
        sup = self._supervisor
        if any(w.in_flight for w in self._workers) or sup.ready:
            raise FleetError(
                "step() steps every env, but some envs still have a send() whose results recv() has not "
                "returned; finish the send/recv cycle (or call reset()) before step()."
            )
        self._write_actions(actions, slice(None), self.num_envs)
        for w in range(self.num_workers):
            sup.command(w, STEP)
        obs, reward, terminated, truncated, info, _ = self._gather(sup.take(self.num_envs))
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Stop every worker (asked to close its envs and exit, then after ``CLOSE_GRACE_S`` SIGKILL: workers ignore
        SIGTERM) and release the pipes."""
        if self._supervisor is not None:
            self._supervisor.close()

    def __enter__(self) -> "SharedMemoryVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the asynchronous interface (EnvPool's send/recv) ----------------------------------------

    def async_reset(self, seed: int | None = None) -> None:
        """Start a reset of every env; ``recv`` then returns reset observations (reward 0, no flags)."""
        self._check_open()
        sup = self._supervisor
        sup.drain()
        if seed is None:
            self._views["seeded"][:] = False
            sup.seed_base = None
        else:
            sup.seed_base = seed + self._env_ids_all
            self._views["seeds"][:] = sup.seed_base
            self._views["seeded"][:] = True
        for w in range(self.num_workers):
            sup.command(w, RESET)

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
            if self._workers[w].in_flight or w in self._supervisor.ready:
                worker = self._workers[w]
                raise FleetError(
                    f"send() got envs {worker.lo}..{worker.hi - 1} (worker {w}), which are still in flight; recv() their "
                    f"results before sending them new actions."
                )
        self._write_actions(actions, ids, count)
        for w in workers:
            self._supervisor.command(w, STEP)

    def recv(self, env_ids: np.ndarray | Sequence[int] | None = None) -> RecvResult:
        """The first ``async_batch`` envs to finish: ``obs, reward, terminated, truncated, info, env_ids``.

        ``env_ids``: wait for exactly these envs instead (whole worker groups that were sent), as the
        zero-lag sampler does with its two halves; results of other envs that finish meanwhile wait.
        """
        self._check_open()
        sup = self._supervisor
        if env_ids is not None:
            workers = self._workers_of(np.asarray(env_ids, dtype=np.int64).reshape(-1))
            for w in workers:
                if not (self._workers[w].in_flight or w in sup.ready):
                    worker = self._workers[w]
                    raise FleetError(f"recv() waits for envs {worker.lo}..{worker.hi - 1}, which were not sent; send() them first.")
            return self._gather(sup.take_workers(workers))
        pending = sum(w.size for w in self._workers if w.in_flight) + sum(self._workers[w].size for w in sup.ready)
        if pending < self.async_batch:
            raise FleetError(
                f"recv() waits for async_batch={self.async_batch} envs, but only {pending} are in flight; "
                f"send() actions to more envs first."
            )
        return self._gather(sup.take(self.async_batch))

    def split(self, count: int) -> list[np.ndarray]:
        """Up to ``count`` groups of env ids, each of whole worker groups, to send and receive apart."""
        groups = np.array_split(np.arange(self.num_workers), min(count, self.num_workers))
        return [np.concatenate([self._env_ids_all[self._workers[w].envs] for w in workers]) for workers in groups]

    @property
    def keep_env_infos(self) -> bool:
        """make_vec (fleetrl/envs/gym_vector.py) hands gymnasium's users every env's own infos: with this set, the workers
        send them through shared memory and the info dict carries "env_infos", {position: (step info, reset info)} for
        the envs whose infos are not empty, as fleetrl's SyncVectorEnv gives them. Off in training."""
        return bool(self._views["keep_infos"][0])

    @keep_env_infos.setter
    def keep_env_infos(self, keep: bool) -> None:
        self._views["keep_infos"][0] = keep

    @property
    def worker_restarts(self) -> int:
        """Workers restarted so far, all of them together."""
        return self._supervisor.restarts

    @property
    def worker_pids(self) -> list[int | None]:
        """The process id of each worker (for monitoring and tests); a restarted worker has a new one."""
        return [w.proc.pid for w in self._workers]

    def __repr__(self) -> str:
        return (
            f"SharedMemoryVectorEnv(num_envs={self.num_envs}, num_workers={self.num_workers}, threads={self.threads}, "
            f"async_batch={self.async_batch}, start_method={self.start_method!r})"
        )

    # ---- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._supervisor is None or self._supervisor.closed:
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
        if int(seen.sum()) != ids.size or any(counts[w] != self._workers[w].size for w in workers):
            groups = ", ".join(f"{w.lo}..{w.hi - 1}" for w in self._workers)
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

    def _gather(self, workers: list[int]) -> RecvResult:
        """Copy the results of ``workers``' envs out of shared memory, indexed by position in env_ids."""
        v = self._views
        lo, hi = self._workers[workers[0]].lo, self._workers[workers[-1]].hi
        if hi - lo == sum(self._workers[w].size for w in workers):  # contiguous: slices (views)
            sel: slice | np.ndarray = slice(lo, hi)
            env_ids = self._env_ids_all[lo:hi].copy()
            obs = v["obs"][sel].copy() if self.copy else v["obs"][sel]
            take = lambda a: a[sel].copy()  # noqa: E731
        else:  # fancy indexing copies once already
            sel = env_ids = np.concatenate([self._env_ids_all[self._workers[w].envs] for w in workers])
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
        if v["keep_infos"][0]:
            lengths = v["info_len"][env_ids]
            env_infos = {int(k): pickle.loads(v["info_bytes"][env_ids[k], : lengths[k]].tobytes()) for k in np.flatnonzero(lengths)}
            if env_infos:
                info["env_infos"] = env_infos
        return obs, reward, terminated, truncated, info, env_ids
