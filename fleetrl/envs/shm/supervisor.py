"""The async backend's supervisor: it starts the env worker processes, sends them commands, waits for their reports,
and restarts a worker whose env raised, that died or that hung, so that training goes on.

What a restart does: what is left of the worker is killed, a new process takes its slot (same shared memory, same
env functions, a new generation number that tells its reports from the old one's), and its envs are reset with seeds
derived from the run's seeds and the restart count. The command that met the failure still returns, with the new
reset observations: each of those envs' episodes ends there, as truncated, with ``final_obs`` the last observation it
returned, reward 0 and no episode statistics. (An env that had finished the step before the failure keeps that
step's reward, flags and statistics; its episode is cut after it.) A worker that dies while idle is restarted when
it is next sent a command, so results waiting for ``recv`` are never overwritten. Each restart prints one warning
line. Past ``max_restarts`` restarts, or when an env fails to build at construction, the caller gets
:class:`fleetrl.errors.EnvWorkerError` with the worker's traceback; an env's own FleetError is raised as it is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import numpy as np

from fleetrl.envs.shm.layout import Layout
from fleetrl.envs.shm.worker import CLOSE, OK, RESET, STEP, THREAD_VARS, worker_main
from fleetrl.errors import EnvWorkerError, FleetError
from fleetrl.processes import ImportPath, start_time

READ_SIZE = 4096  # a multiple of the 4-byte record, so a read never splits one
CLOSE_GRACE_S = 2.0  # close(): time for workers to close their envs and exit on their own before SIGKILL
ERROR_MESSAGE_WAIT_S = 5.0  # how long to wait for a failed worker's traceback
KILL_WAIT_S = 5.0  # a restart waits this long for a SIGKILLed worker to go (else close() reaps it)
# A (re)started worker imports its env's modules and builds its envs (ROMs, simulators) before it
# answers; env_timeout measures a step or reset, so the build gets at least this long.
MIN_BUILD_TIMEOUT_S = 30.0


@dataclass(eq=False)
class Worker:
    """One env worker process, and what the trainer knows of it. A restart puts a new process in the same record."""

    index: int
    lo: int  # its envs are lo .. hi-1
    hi: int
    payload: bytes  # its env functions, pickled: unpickled by the worker once it has the trainer's sys.path
    proc: Any = None  # the multiprocessing Process
    cmd_conn: Connection | None = None  # the trainer's write end of its command pipe
    err_conn: Connection | None = None  # the trainer's read end of its traceback pipe
    generation: int = 0  # one more per restart: tells this process's reports from a replaced one's
    restarts: int = 0  # its restarts so far: the restarted envs' seeds derive from it
    # None: serving. "start": building its envs at construction (a failure raises). "build" and "reset": a restarted
    # worker building, then resetting its envs (a failure restarts it again).
    phase: str | None = "start"
    cmd: bytes | None = None  # the command in flight (or the one that met a failure)
    in_flight: bool = True  # owes a report (every worker reports once its envs are built)
    deadline: float = float("inf")  # time.monotonic() by which it must report
    died_idle: tuple[str, str] | None = None  # it died while idle: (cause, what), restarted at its next command
    kept: tuple | None = None  # the failed step's results that stand, until the restart's reset returns

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def envs(self) -> slice:
        return slice(self.lo, self.hi)


class Supervisor:
    """The worker processes of one vector env; ``ready`` holds the workers whose reports wait to be taken."""

    def __init__(self, workers: list[Worker], ctx: Any, buffer: Any, layout: Layout, views: dict[str, np.ndarray],
                 env_names: list[str], *, threads: int, spin_us: float, batch_scheduling: bool, max_restarts: int,
                 env_timeout: float | None):
        self.workers, self._ctx, self._buffer, self._layout, self._views = workers, ctx, buffer, layout, views
        self._env_names, self.threads, self.spin_us, self.batch_scheduling = env_names, threads, spin_us, batch_scheduling
        self.max_restarts, self.env_timeout = max_restarts, env_timeout
        self._build_timeout = max(env_timeout, MIN_BUILD_TIMEOUT_S) if env_timeout else None
        self.restarts = 0  # workers restarted so far, all of them together
        self.seed_base: np.ndarray | None = None  # each env's seed at the last seeded reset, for restarts
        self.ready: deque[int] = deque()
        self.closed = False
        self._import_path = ImportPath.here()  # the workers', restarted ones too
        self._started = start_time(os.getpid())  # the workers' parent: its pid with this, never a later process's pid
        # One result pipe for all workers. The trainer keeps its write end too, for workers it starts later
        # (restarts); deaths are seen on the process sentinels, not as end-of-file here.
        self._result_conn, self._result_w = ctx.Pipe(duplex=False)
        self._result_fd = self._result_conn.fileno()
        os.set_blocking(self._result_fd, False)  # try a read first; poll only when nothing is there
        self._poller = select.poll()
        self._poller.register(self._result_fd, select.POLLIN)
        self._sentinel_of: dict[int, int] = {}  # process sentinel fd -> worker index
        self._retired: list[Any] = []  # replaced processes a SIGKILL had not ended yet
        self._finalizer = weakref.finalize(self, shutdown_workers, workers, [self._result_conn, self._result_w], self._retired)

    # ---- the vector env's calls ------------------------------------------------------------------

    def start(self) -> None:
        """Start every worker and wait until all have built their envs (a failed build raises)."""
        for worker in self.workers:
            self._start_process(worker)
            if self._build_timeout:
                worker.deadline = time.monotonic() + self._build_timeout
        self.take(sum(w.size for w in self.workers))

    def command(self, w: int, cmd: bytes) -> None:
        """Send ``STEP`` or ``RESET`` to worker ``w`` (a worker that died idle is restarted for it)."""
        worker = self.workers[w]
        worker.in_flight, worker.cmd = True, cmd
        self._views["stepped"][worker.envs] = False
        if self.env_timeout:
            worker.deadline = time.monotonic() + self.env_timeout
        if worker.died_idle is not None:
            self._restart(worker, *worker.died_idle)
            return
        try:
            os.write(worker.cmd_conn.fileno(), cmd)
        except OSError:  # nobody reads the pipe: the worker died, and its sentinel will say so
            pass

    def take(self, num_envs: int) -> list[int]:
        """Take ready workers, in the order they finished, until they hold ``num_envs`` envs (sorted by index)."""
        taken: list[int] = []
        count = 0
        while count < num_envs:
            if not self.ready:
                self._wait()
            w = self.ready.popleft()
            taken.append(w)
            count += self.workers[w].size
        return sorted(taken)  # deterministic order within a batch: env_ids ascending

    def take_workers(self, workers: list[int]) -> list[int]:
        """Wait until all of ``workers`` are ready and take them; other ready workers stay queued."""
        while not set(workers).issubset(self.ready):
            self._wait()
        for w in workers:
            self.ready.remove(w)
        return sorted(workers)

    def drain(self) -> None:
        """Wait out every command in flight and drop unreturned results (before a reset)."""
        while any(w.in_flight for w in self.workers):
            self._wait()
        self.ready.clear()

    def close(self) -> None:
        self.closed = True
        self._finalizer()

    # ---- waiting, and what a failure leads to ------------------------------------------------------

    def _wait(self) -> None:
        """Block until one more worker is ready, restarting those that fail, die or pass their deadline."""
        before = len(self.ready)
        while len(self.ready) == before:
            events = [] if self._read_results() else self._poller.poll(self._poll_timeout_ms())
            dead = [(self.workers[w], fd) for fd, _ in events if (w := self._sentinel_of.get(fd)) is not None]
            if dead:
                self._read_results()  # a worker may report and then die: take its report first
            for worker, fd in dead:
                if worker.proc.sentinel == fd:  # not replaced meanwhile
                    self._died(worker)
            if self.env_timeout or self._build_timeout:
                now = time.monotonic()
                for worker in self.workers:
                    if worker.deadline <= now:
                        self._hung(worker)

    def _read_results(self) -> bool:
        """Take the reports waiting on the result pipe; False when there were none."""
        try:
            data = os.read(self._result_fd, READ_SIZE)
        except BlockingIOError:
            return False
        for record in memoryview(data).cast("I").tolist():
            worker = self.workers[record & 0xFFFF]
            if (record >> 16) == (worker.generation & 0xFFFF):  # else from a process since replaced
                self._on_report(worker)
        return bool(data)  # (never end-of-file: the trainer holds a write end)

    def _poll_timeout_ms(self) -> int | None:
        deadline = min(w.deadline for w in self.workers)
        if deadline == float("inf"):
            return None  # sentinels report deaths; nothing else to watch for
        return max(0, int((deadline - time.monotonic()) * 1000) + 1)

    def _on_report(self, worker: Worker) -> None:
        """The worker finished its command (or its build): queue it as ready, or go on with its restart."""
        if self._views["status"][worker.index] != OK:
            self._failed(worker)
            return
        if worker.phase == "build":  # a restarted worker has built its envs: reset them
            self._reset_restarted(worker)
            return
        if worker.phase == "reset" and worker.cmd == STEP:
            self._cut_episodes(worker)
        worker.phase, worker.in_flight, worker.deadline = None, False, float("inf")
        self.ready.append(worker.index)

    def _failed(self, worker: Worker) -> None:
        """The worker reported that an env raised: restart it, or stop if restarting cannot help."""
        env_index, phase, tb, fleet_error = worker.lo, "step", "(the worker sent no traceback)", None
        try:
            if worker.err_conn.poll(ERROR_MESSAGE_WAIT_S):
                env_index, phase, tb, fleet_error = worker.err_conn.recv()
        except (EOFError, OSError):
            pass
        tb = tb.rstrip()
        if fleet_error:  # the env's own FleetError: raised as it is, as the in-process backends raise it
            try:
                err = pickle.loads(fleet_error)
            except Exception:  # noqa: BLE001 - then the traceback tells
                err = None
            if isinstance(err, FleetError):
                if getattr(err, "env_index", 0) is None:
                    err.env_index = env_index
                self.close()
                raise err
        what = (f"Env {env_index} ({self._env_names[env_index]!r}) in env worker {worker.index} (pid {worker.proc.pid}) "
                f"raised during {phase}")
        if fleet_error is not None or worker.phase == "start":
            self._fail(f"{what}. The vector env is closed. The worker's traceback:\n{tb}", env_index, worker)
        last_line = tb.splitlines()[-1] if tb else "?"
        self._restart(worker, f"env {env_index} raised during {phase}: {last_line}", what, tb, env_index)

    def _died(self, worker: Worker) -> None:
        """The worker's process ended: restart it now if it owes a report, else at its next command."""
        if self._views["status"][worker.index] != OK:  # it reported a failure, then died: its traceback tells more
            self._failed(worker)
            return
        proc = worker.proc
        proc.join(0.1)
        code = proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {-code}, {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        what = (f"Env worker {worker.index} (pid {proc.pid}, envs {worker.lo}..{worker.hi - 1}, {self._env_names[worker.lo]!r}) "
                f"died unexpectedly ({how}). It was killed, ran out of memory or crashed in native code")
        if worker.phase == "start":
            self._fail(f"{what}. The vector env is closed.", worker.lo, worker)
        if not worker.in_flight:
            # Its envs' last results may still wait for recv(), in shared memory; a restart now would
            # overwrite them. Stop watching it, and restart it when it is sent its next command.
            self._unwatch(worker)
            worker.died_idle = (f"worker process died ({how})", what)
            return
        self._restart(worker, f"worker process died ({how})", what)

    def _hung(self, worker: Worker) -> None:
        building = worker.phase in ("start", "build")
        timeout = self._build_timeout if building else self.env_timeout
        what = (f"Env worker {worker.index} (pid {worker.proc.pid}, envs {worker.lo}..{worker.hi - 1}, "
                f"{self._env_names[worker.lo]!r}) gave no answer within {timeout:g} s "
                + ("(the time allowed to build envs), so an env hangs in construction" if building
                   else "(env_timeout), so an env hangs in step or reset"))
        if worker.phase == "start":
            self._fail(f"{what}. The vector env is closed.", worker.lo, worker)
        self._restart(worker, f"no answer within {timeout:g} s", what)

    def _restart(self, worker: Worker, cause: str, what: str, tb: str | None = None, env_index: int | None = None) -> None:
        """Replace the worker's process; the new one builds and resets its envs, then its command returns.

        ``cause``: one line for the warning; ``what``: the sentence that opens the error should the
        limit be reached; ``tb``: the worker's traceback, if it sent one.
        """
        env_index = worker.lo if env_index is None else env_index
        if self.restarts >= self.max_restarts:
            self._fail(
                f"{what}. Env workers of this vector env were restarted {self.restarts} times already, "
                f"and max_restarts={self.max_restarts} allows no more: fix the env, or, if it only fails "
                f"now and then, allow more restarts with --max-env-restarts. The vector env is closed."
                + (f" The worker's traceback:\n{tb}" if tb else ""),
                env_index, worker,
            )
        if worker.phase is None and worker.cmd == STEP:  # (a failing restart keeps the first failure's)
            self._keep_finished_step(worker)
        self.restarts += 1
        worker.restarts += 1
        print(f"fleetrl: warning: restarting env worker {worker.index} (envs {worker.lo}..{worker.hi - 1}, "
              f"{self._env_names[worker.lo]!r}; restart {self.restarts} of at most {self.max_restarts}): {cause}",
              file=sys.stderr, flush=True)
        self._stop_process(worker, polite=tb is not None)
        worker.generation += 1
        worker.died_idle = None
        self._start_process(worker)
        worker.phase, worker.in_flight = "build", True
        if self._build_timeout:
            worker.deadline = time.monotonic() + self._build_timeout

    def _reset_restarted(self, worker: Worker) -> None:
        """Reset a restarted worker's envs, seeded from the run's seeds and this worker's restart count."""
        seeds, seeded = self._views["seeds"], self._views["seeded"]
        if self.seed_base is None:
            seeded[worker.envs] = False
        else:  # distinct from every seed+i of the run and from earlier restarts, yet reproducible
            seeds[worker.envs] = [int(np.random.SeedSequence(int(s), spawn_key=(worker.restarts,)).generate_state(1)[0])
                                  for s in self.seed_base[worker.envs]]
            seeded[worker.envs] = True
        worker.phase = "reset"
        if self.env_timeout:
            worker.deadline = time.monotonic() + self.env_timeout
        try:
            os.write(worker.cmd_conn.fileno(), RESET)
        except OSError:  # it died already; its sentinel will say so
            pass

    def _keep_finished_step(self, worker: Worker) -> None:
        """Before the restart's reset overwrites them, keep what the worker's envs returned from the failed step.

        Envs that finished the step keep its result; the others (the one that failed, those its stepping thread had
        not reached, all of them if the worker died or hung) never returned from it. Every env's episode then ends on
        the last observation it returned: the terminal one if it ended in this step, else its obs.
        """
        v, sl = self._views, worker.envs
        finished = v["stepped"][sl].copy()
        ended = finished & v["final_mask"][sl]
        worker.kept = (finished, ended, v["reward"][sl].copy(), v["terminated"][sl].copy(), v["truncated"][sl].copy(),
                       v["episode_mask"][sl].copy())
        v["final_obs"][sl][~ended] = v["obs"][sl][~ended]

    def _cut_episodes(self, worker: Worker) -> None:
        """After a restart's reset: the failed step returns, each env's episode ended there (as truncated
        unless it ended in the step anyway), reward 0 and no episode statistics for those that did not
        finish it, and the reset observations."""
        finished, ended, reward, terminated, truncated, has_stats = worker.kept
        v, sl = self._views, worker.envs
        v["reward"][sl] = np.where(finished, reward, 0.0)
        v["terminated"][sl] = terminated & ended
        v["truncated"][sl] = np.where(ended, truncated, True)
        v["final_mask"][sl] = True
        v["episode_mask"][sl] = has_stats & ended

    def _fail(self, message: str, env_index: int, worker: Worker) -> NoReturn:
        err = EnvWorkerError(message, env_index=env_index, worker_index=worker.index)
        self.close()
        raise err

    # ---- worker processes --------------------------------------------------------------------------

    def _start_process(self, worker: Worker) -> None:
        """Start a process for the worker on new pipes; it reports once its envs are built."""
        ctx = self._ctx
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        self._views["status"][worker.index] = OK
        saved_env = {var: os.environ.get(var) for var in THREAD_VARS}
        # A spawned (or freshly started forkserver) child takes os.environ at start: set the thread
        # limits there so numpy/torch see them at import, before the worker function runs.
        os.environ.update({var: "1" for var in THREAD_VARS})
        try:
            proc = ctx.Process(
                target=worker_main,
                name=f"fleetrl-env-worker-{worker.index}",
                args=(worker.index, worker.generation, worker.lo, worker.payload, self._buffer, self._layout, cmd_r,
                      self._result_w, err_w, self._import_path, os.getpid(), self._started, self.spin_us * 1e-6, self.threads,
                      self.batch_scheduling),
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
        # The trainer keeps the write end of the command pipe and the read end of the traceback pipe only.
        cmd_r.close()
        err_w.close()
        worker.proc, worker.cmd_conn, worker.err_conn = proc, cmd_w, err_r
        self._poller.register(proc.sentinel, select.POLLIN)  # readable once the process exits
        self._sentinel_of[proc.sentinel] = worker.index

    def _unwatch(self, worker: Worker) -> None:
        sentinel = worker.proc.sentinel
        if self._sentinel_of.pop(sentinel, None) is not None:
            self._poller.unregister(sentinel)

    def _stop_process(self, worker: Worker, polite: bool) -> None:
        """End the worker's process: a live one whose env raised may close its envs first; else SIGKILL."""
        proc = worker.proc
        self._unwatch(worker)
        if polite and proc.is_alive():
            try:
                os.write(worker.cmd_conn.fileno(), CLOSE)
            except OSError:
                pass
            proc.join(CLOSE_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(KILL_WAIT_S)
        if proc.is_alive():  # stuck in the kernel: close() reaps it
            self._retired.append(proc)
        worker.cmd_conn.close()
        worker.err_conn.close()


def shutdown_workers(workers: list[Worker], other_conns: list[Connection], retired: list[mp.process.BaseProcess]) -> None:
    """Ask every worker to exit (it closes its envs), SIGKILL the ones that have not within ``CLOSE_GRACE_S``; reap
    them, close the pipes. There is no SIGTERM stage: workers ignore SIGTERM from birth (fleetrl/forkserver_init.py),
    so a worker still there after the grace is stuck (an env that hangs), and only SIGKILL ends it.

    Shared by ``close()`` and the finalizer (which also runs at exit), so it must not reference the supervisor. The
    records are the supervisor's own, which a restart updates in place, so this always sees the current processes;
    ``retired``: replaced processes that a SIGKILL had not ended yet.
    """
    started = [w for w in workers if w.proc is not None]
    for worker in started:
        if worker.proc.is_alive():
            try:
                os.write(worker.cmd_conn.fileno(), CLOSE)
            except (OSError, ValueError):  # already closed, or the worker died and nobody reads the pipe
                pass
    deadline = time.monotonic() + CLOSE_GRACE_S
    for worker in started:
        worker.proc.join(max(0.0, deadline - time.monotonic()))
    for proc in [w.proc for w in started] + retired:
        if proc.is_alive():
            proc.kill()
        proc.join(KILL_WAIT_S)  # bounded: one stuck in the kernel can outlive SIGKILL a while, and close must not hang
    for conn in [c for w in started for c in (w.cmd_conn, w.err_conn)] + other_conns:
        try:
            conn.close()
        except OSError:
            pass
