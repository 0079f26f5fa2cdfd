"""An env worker process of the async backend: it builds its envs, then serves step and reset commands, writing the
results straight into shared memory. Its envs step in one thread, or in several at once (``threads``), so that envs
which wait (a simulator in another process, a server, a robot) overlap their waits instead of adding them up."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.shm.layout import INFO_SLOT_BYTES, Layout, map_views
from fleetrl.envs.spaces import check_same_spaces
from fleetrl.envs.wrappers import game_over, set_env_index
from fleetrl.errors import FleetError
from fleetrl.processes import ImportPath, become_child, pid_alive

# One-byte commands on a worker's pipe.
STEP, RESET, CLOSE = b"s", b"r", b"c"
# Status byte a worker leaves in shared memory before it reports on the result pipe.
OK, FAILED = 0, 1
# A result record is a native uint32: the worker index in the low 16 bits, the worker's generation
# (mod 2**16, one more per restart) in the high 16, so a replaced worker's late report is dropped.
RECORD = 4
ORPHAN_POLL_MS = 1000  # an idle worker checks this often that its parent still lives
PREEMPTED_S = 50e-6  # a spin iteration this long means the worker lost its CPU: stop spinning
SPIN_MISSES = 2  # spins in a row that end without a command before the worker stops spinning ...
SPIN_PAUSE = 1000  # ... for this many commands (e.g. while the parent runs a network between steps)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# (env index, phase, the traceback as text, the env's FleetError pickled or b"" if it would not pickle, or None)
Failure = tuple[int, str, str, "bytes | None"]


def record_of(index: int, generation: int) -> bytes:
    return (index | (generation & 0xFFFF) << 16).to_bytes(RECORD, sys.byteorder)


def limit_threads() -> None:
    """Library thread pools get one thread per worker: a pool per worker would oversubscribe the CPUs."""
    for var in THREAD_VARS:
        os.environ[var] = "1"
    if "torch" in sys.modules:  # only if an env (or its module) imported it; never import it here
        sys.modules["torch"].set_num_threads(1)


def current_failure(env_index: int, phase: str) -> Failure:
    """The exception being handled, as the worker reports it. A FleetError (an output check, a space mismatch) says
    the env is wrong: the trainer raises it as it is instead of restarting a worker that would fail the same way, so
    it travels pickled, apart from the traceback, and an unpicklable one still leaves the traceback."""
    exc, fleet_error = sys.exc_info()[1], None
    if isinstance(exc, FleetError):
        try:
            fleet_error = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - any pickling failure: the traceback still tells
            fleet_error = b""
    return env_index, phase, traceback.format_exc(), fleet_error


class EnvStepper:
    """Runs one command over a worker's envs: in the calling thread, or split into ``threads`` contiguous slices that
    as many threads step at once (the calling thread takes the first). A slice stops at its first failing env; the
    others finish their envs, and the ``stepped`` array says which envs completed the command."""

    def __init__(self, envs: list[gym.Env], lo: int, views: dict[str, np.ndarray], threads: int = 1):
        self.envs, self.lo, self.v = envs, lo, views
        # act_buf[i] of a 1-D action array is a numpy scalar (a copy), as SyncVectorEnv passes it; an array action
        # must be copied, or an env keeping it would see the parent's next actions
        self._scalar_actions = views["actions"].ndim == 1
        bounds = np.linspace(0, len(envs), max(1, min(threads, len(envs))) + 1).round().astype(int)
        self.slices = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self.failure: Failure | None = None
        self._cmd = STEP
        self._lock = threading.Lock()
        self._remaining = 0
        self._all_done = threading.Semaphore(0)
        self._starts = [threading.Semaphore(0) for _ in self.slices[1:]]
        # daemon threads: one stuck in a hanging env must not keep the process alive once it is told to exit
        self._helpers = [threading.Thread(target=self._serve, args=(k,), name=f"fleetrl-env-stepper-{k}", daemon=True)
                         for k in range(1, len(self.slices))]
        for helper in self._helpers:
            helper.start()

    def run(self, cmd: bytes) -> Failure | None:
        """Step (``STEP``) or reset (``RESET``) every env once; the first failure, if any env raised."""
        self.failure, self._cmd = None, cmd
        self._remaining = len(self._helpers)
        for start in self._starts:
            start.release()
        self._run_slice(0)
        if self._helpers:
            self._all_done.acquire()
        return self.failure

    def close(self) -> None:
        """Let the helper threads go, then close the envs."""
        self._cmd = CLOSE
        for start in self._starts:
            start.release()
        for helper in self._helpers:
            helper.join(timeout=1.0)
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must finish
                pass

    def _serve(self, k: int) -> None:
        while True:
            self._starts[k - 1].acquire()
            if self._cmd == CLOSE:
                return
            self._run_slice(k)
            with self._lock:
                self._remaining -= 1
                last = self._remaining == 0
            if last:
                self._all_done.release()

    def _run_slice(self, k: int) -> None:
        first, end = self.slices[k]
        v, phase, i = self.v, "step", self.lo + first
        keep_infos = bool(v["keep_infos"][0])  # make_vec's users get every env's infos (fleetrl/envs/gym_vector.py)
        try:
            for i in range(self.lo + first, self.lo + end):
                env = self.envs[i - self.lo]
                info = reset_info = None
                if self._cmd == RESET:
                    phase = "reset"
                    obs, reset_info = env.reset(seed=int(v["seeds"][i]) if v["seeded"][i] else None)
                    reward, terminated, truncated = 0.0, False, False
                    v["final_mask"][i], v["episode_mask"][i] = False, False
                else:
                    phase = "step"
                    action = v["actions"][i] if self._scalar_actions else v["actions"][i].copy()
                    obs, reward, terminated, truncated, info = env.step(action)
                    if game_over(terminated, truncated):  # same-step autoreset: keep the last obs, start the next episode
                        v["final_obs"][i], v["final_mask"][i] = obs, True
                        episode = info.get("episode")
                        if episode is not None:
                            v["episode_r"][i], v["episode_l"][i] = episode["r"], episode["l"]
                        v["episode_mask"][i] = episode is not None
                        phase = "reset"
                        obs, reset_info = env.reset()
                    else:
                        v["final_mask"][i], v["episode_mask"][i] = False, False
                if keep_infos:
                    write_infos(v, i, info, reset_info)
                v["obs"][i] = obs  # the one copy of the observation, straight into shared memory
                v["reward"][i], v["terminated"][i], v["truncated"][i] = reward, terminated, truncated
                v["stepped"][i] = True
        except Exception:  # noqa: BLE001 - every env error is reported to the trainer, which restarts or stops
            failure = current_failure(i, phase)
            with self._lock:
                if self.failure is None:
                    self.failure = failure


def write_infos(v: dict[str, np.ndarray], i: int, info: dict | None, reset_info: dict | None) -> None:
    """Env ``i``'s infos of this command into its slot of shared memory, pickled (length 0 when both are empty)."""
    if not info and not reset_info:
        v["info_len"][i] = 0
        return
    data = pickle.dumps((info, reset_info), protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > INFO_SLOT_BYTES:
        raise FleetError(f"env {i} returned infos of {len(data):,} bytes pickled, more than the {INFO_SLOT_BYTES:,} the async "
                         f"backend carries per env and step. Return smaller infos (large data belongs in the observation), "
                         f"or use backend='sync'.")
    v["info_bytes"][i, : len(data)] = np.frombuffer(data, np.uint8)
    v["info_len"][i] = len(data)


def worker_main(
    index: int,
    generation: int,
    lo: int,
    payload: bytes,
    buffer: Any,
    layout: Layout,
    cmd_conn: Connection,
    result_conn: Connection,
    error_conn: Connection,
    import_path: ImportPath,
    parent_pid: int,
    parent_started: float | None,
    spin_s: float,
    threads: int = 1,
    batch_scheduling: bool = False,
) -> None:
    """Build envs ``lo .. lo+len(env_fns)-1``, then serve step/reset commands until told to close.
    ``batch_scheduling``: run under SCHED_BATCH (its stepping threads too), so that waking this worker never preempts
    the trainer while it writes the other workers' commands."""
    # The trainer owns the stop; a worker still exits when it dies (see ``parent_pid``). Its import path, before the
    # env functions are unpickled: custom env modules (``mymod:MyEnv-v0``) import here exactly as in the trainer.
    become_child(import_path)
    limit_threads()
    if batch_scheduling:
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or refused: the default policy only costs speed
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    cmd_fd, result_fd = cmd_conn.fileno(), result_conn.fileno()
    record = record_of(index, generation)
    views = map_views(buffer, layout)
    status = views["status"]

    def report(failure: Failure) -> None:
        status[index] = FAILED
        try:
            error_conn.send(failure)
        except Exception:  # noqa: BLE001 - the parent is gone or closed the pipe; nothing more to tell
            pass

    envs: list[gym.Env] = []
    i = lo
    try:
        env_fns, obs_space, act_space = pickle.loads(payload)
        limit_threads()
        for i, env_fn in enumerate(env_fns, start=lo):
            env = env_fn()
            set_env_index(env, i)  # the output check's errors say which env of the vector
            envs.append(env)
            check_same_spaces(i, env, obs_space, act_space)
        limit_threads()
        status[index] = OK
    except Exception:  # noqa: BLE001 - reported; the trainer raises it
        report(current_failure(i, "construction"))
    stepper = EnvStepper(envs, lo, views, threads if status[index] == OK else 1)
    os.write(result_fd, record)

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
                while now < deadline and now - last < PREEMPTED_S:
                    try:
                        cmd = os.read(cmd_fd, 1)
                        break
                    except BlockingIOError:
                        last, now = now, perf_counter()
                spin_misses = 0 if cmd is not None else spin_misses + 1
                if spin_misses >= SPIN_MISSES:
                    spin_pause, spin_misses = SPIN_PAUSE, 0
            elif spin_pause:
                spin_pause -= 1
            if cmd is None:
                # Idle: block on the command pipe, but wake now and then to notice an orphaning (a killed
                # trainer). Not the parent process: that is the forkserver, which SIGTERM to the process group
                # ends while the trainer lives on to checkpoint.
                if not poller.poll(ORPHAN_POLL_MS):
                    if not pid_alive(parent_pid, parent_started):
                        break
                    continue
                try:
                    cmd = os.read(cmd_fd, 1)
                except BlockingIOError:
                    continue
            if cmd == CLOSE or not cmd:  # b"": the parent closed its end
                break
            if status[index] != OK:  # a failed worker only waits to be replaced or closed
                os.write(result_fd, record)
                continue
            failure = stepper.run(cmd)
            if failure is not None:
                report(failure)
            os.write(result_fd, record)
    finally:
        stepper.close()
