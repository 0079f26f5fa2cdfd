"""Where an off-policy algorithm's updates run: in its own loop, or in a learner process on another core.

``learner = run.learner(td_update, update_target, acting=q_network)`` takes the algorithm's update functions (they
close over its networks and optimiser); the loop calls ``learner(td_update, batch)`` where CleanRL calls the code.

* ``--policy-lag 0`` (the default): the call runs the function here and returns what it returns. CleanRL's loop.
* ``--policy-lag 1``: a learner process starts at once, never by forking this one, which runs threads (monitoring,
  TensorBoard's writer, OpenMP's pool) and so could deadlock a forked child: multiprocessing's forkserver forks it
  (fleetrl/processes.py). It imports torch while the run sets up and fills its buffer. The first call sends it the
  update functions with everything they close over, in one cloudpickle, so it gets the networks and optimiser as they
  are then (after a resume's restore), the optimiser still holding those networks' own parameters. Each call sends its
  arguments (a sampled batch) and returns at once, so the learner updates on one core while this process acts and
  steps the envs on another. Calls run in order, one at a time: a
  call first waits for the previous one, then copies the weights that update produced into ``acting``. Acting is
  therefore one update behind (with DQN's defaults, 10 env steps), and the run stays deterministic for a seed.
  A call returns what the previous call of the same function returned (its losses, as floats). The learner publishes
  the acting network's weights after each update in shared-memory tensors (torch.multiprocessing).

Checkpoints see the learner's state: before each save, ``sync`` fetches the learner's copy of every registered
object (networks, optimiser) into this process. The learner ignores SIGINT and SIGTERM from its first instruction on
(this process stops the run and checkpoints it) and exits when this process closes it or dies. It is CPU-only (its
weights are published in shared CPU memory) and single-process: under torchrun every core already has a rank.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import torch
import torch.multiprocessing  # noqa: F401 - its reductions send the shared-memory weight tensors to the learner
from torch import nn

from fleetrl import processes
from fleetrl.errors import FleetError

__all__ = ["Learner", "check_policy_lag"]

POLL_SECONDS = 1.0  # how often a wait checks that the learner process is still alive
ANSWER_TIMEOUT_S = 600.0  # the longest a wait for the learner may take: its boot and an update take seconds, so this is a hang
PROCESS_NAME = "fleetrl-learner"  # what ps, top and psutil show for it (15 characters at most)
SPIN_SECONDS = 0.002  # a wait spins this long before it sleeps (see _ready)


def check_policy_lag(policy_lag: int, world_size: int, algo: str) -> None:
    """Refuse a policy lag the learner cannot run on this job, before anything starts (its range, 0 or 1, is in the
    algorithm's range table)."""
    if policy_lag and world_size > 1:
        raise FleetError(f"fleetrl {algo} --policy-lag 1 runs the updates in a second process on this machine, but under torchrun "
                         f"each of the {world_size} ranks already keeps a core busy and their gradients are averaged in step. "
                         f"Leave out --policy-lag (0) under torchrun, or run one process with --policy-lag 1.")


class Learner:
    """Runs update functions here (``lag`` 0) or in a learner process (``lag`` 1); see the module docstring."""

    def __init__(self, updates: Sequence[Callable[..., Any]], acting: nn.Module, owned: dict[str, Any], lag: int, device: Any,
                 torch_threads: int = 1, answer_timeout: float = ANSWER_TIMEOUT_S):
        if lag and torch.device(device).type != "cpu":
            raise FleetError(f"--policy-lag 1 runs the updates in a CPU learner process, which publishes its weights in shared CPU "
                             f"memory; the run is on {device}, where an update is short anyway. Leave out --policy-lag (0), "
                             f"or train on the CPU (--no-cuda) with it.")
        self.updates, self.acting, self.owned, self.lag = list(updates), acting, owned, lag
        self.torch_threads = torch_threads
        self.answer_timeout = answer_timeout  # seconds each wait for the learner's answer may take
        self._process: Any = None
        self._conn: Any = None
        self._started = False  # the learner process got the functions and their objects (at the first call)
        self._pending = False  # a call was sent and its answer not read yet
        self._results: dict[int, Any] = {}  # update index -> what its last finished call returned
        self._published: list[torch.Tensor] = []  # the learner's newest acting weights, in shared memory
        if lag:
            self._boot()

    def __call__(self, update: Callable[..., Any], *args: Any) -> Any:
        if not self.lag:
            return update(*args)
        index = self.updates.index(update)
        if not self._started:
            self._start()
        self._wait()  # the previous update is done and its weights now act
        self._send(("update", index, [_to_host(arg) for arg in args]))
        self._pending = True
        return self._results.get(index, {})

    # ---------------------------------------------------------------- this process
    def _boot(self) -> None:
        """Start the learner process: it imports torch while this process goes on, then waits for :meth:`_start`."""
        self._published = [p.detach().clone().share_memory_() for p in self.acting.parameters()]
        # the modules the state will need (the algorithm's, the network's), imported while booting, not at the first call
        modules = sorted({f.__module__ for f in self.updates} | {type(self.acting).__module__} - {"__main__"})
        context = processes.context()
        parent_conn, child_conn = context.Pipe()
        self._process = context.Process(target=_serve, name=PROCESS_NAME, daemon=True,
                                        args=(child_conn, self._published, self.torch_threads, processes.ImportPath.here(), modules))
        self._process.start()
        child_conn.close()  # so that the learner is the only holder of its end: this process sees EOF when it dies
        self._conn = parent_conn

    def _start(self) -> None:
        """Send the learner the update functions and what they close over, as they are now, in one pickle: inside it the
        optimiser holds the very parameters of the networks the functions update."""
        self._send(("start", -1, cloudpickle.dumps((self.updates, self.acting, self.owned, torch.get_rng_state()),
                                                   protocol=pickle.HIGHEST_PROTOCOL)))
        self._started = True

    def _send(self, message: tuple) -> None:
        try:
            self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._died() from None

    def _receive(self) -> tuple:
        deadline = time.monotonic() + self.answer_timeout
        while not _ready(self._conn, min(POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
            if not self._process.is_alive():
                raise self._died()
            if time.monotonic() >= deadline:
                raise self._hung()
        try:
            reply = pickle.loads(self._conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            raise self._died() from None
        if reply[0] == "error":
            is_fleet_error, text = reply[2]
            self._pending = False
            if is_fleet_error:
                raise FleetError(text)
            raise RuntimeError(f"the learner process (--policy-lag 1) failed in an update:\n{text}")
        return reply

    def _wait(self) -> None:
        if not self._pending:
            return
        _, index, result = self._receive()
        self._pending = False
        self._results[index] = result
        with torch.no_grad():
            for param, published in zip(self.acting.parameters(), self._published):
                param.copy_(published)

    def _died(self) -> FleetError:
        self._process.join(timeout=1.0)
        code = self._process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return FleetError(f"The learner process (--policy-lag 1) {how} (out of memory?). The run stopped; its last checkpoint "
                          f"holds it. Continue with --resume auto, with --policy-lag 0 if this repeats.")

    def _hung(self) -> FleetError:
        """The learner is alive but gave no answer in time: an update stuck (a deadlock, a lock never released). It is
        killed, so that closing the run does not wait for it."""
        self._process.kill()
        self._process.join(timeout=POLL_SECONDS)
        return FleetError(f"The learner process (--policy-lag 1) gave no answer within {self.answer_timeout:g} s, where an update takes "
                          f"seconds: an update hung in it, so it was killed and the run stopped; its last checkpoint holds it. "
                          f"Continue with --resume auto, with --policy-lag 0 (the updates in the training process) if this repeats.")

    def sync(self) -> None:
        """Wait for the learner, then copy its state of every registered object into this process (before a checkpoint)."""
        if not self._started:
            return  # no update yet: this process's objects are the state
        self._wait()
        self._send(("state", -1, None))
        states = torch.load(io.BytesIO(self._receive()[2]), weights_only=True)
        for name, obj in self.owned.items():
            obj.load_state_dict(states[name])

    def close(self) -> None:
        if self._process is None:
            return
        try:
            self._conn.send_bytes(pickle.dumps(("stop", -1, None)))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # it is gone already
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
        self._process = None


# ---------------------------------------------------------------- the learner process
def _serve(conn, published: list[torch.Tensor], torch_threads: int, import_path: processes.ImportPath, modules: list[str]) -> None:
    # the trainer stops the run and checkpoints it, then closes us; the functions may live in modules only it finds
    processes.become_child(import_path)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(PROCESS_NAME)
    torch.set_num_threads(torch_threads)
    for name in modules:
        with contextlib.suppress(Exception):  # only a head start: unpickling the state imports them anyway, and reports failures
            importlib.import_module(name)
    updates: list[Callable[..., Any]] = []
    acting: nn.Module | None = None
    owned: dict[str, Any] = {}
    while True:
        try:
            while not _ready(conn, POLL_SECONDS):
                pass
            kind, index, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            return  # the trainer is gone
        if kind == "stop":
            return
        try:
            if kind == "start":
                updates, acting, owned, rng = cloudpickle.loads(payload)
                torch.set_rng_state(rng)  # draws continue the trainer's stream, as a fork's did
                continue
            if kind == "state":
                buffer = io.BytesIO()
                torch.save({name: obj.state_dict() for name, obj in owned.items()}, buffer)
                conn.send_bytes(pickle.dumps(("state", index, buffer.getvalue()), protocol=pickle.HIGHEST_PROTOCOL))
                continue
            result = updates[index](*[_from_host(arg) for arg in payload])
            with torch.no_grad():
                for target, param in zip(published, acting.parameters()):
                    target.copy_(param)
            floats = None if result is None else {name: float(value) for name, value in result.items()}
            conn.send_bytes(pickle.dumps(("done", index, floats), protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:  # noqa: BLE001 - reported to the trainer, which raises it
            text = str(exc) if isinstance(exc, FleetError) else traceback.format_exc()
            conn.send_bytes(pickle.dumps(("error", index, (isinstance(exc, FleetError), text))))
            return


def _ready(conn, timeout: float) -> bool:
    """Whether a message arrived within ``timeout``. It spins for the first ``SPIN_SECONDS``: waking a sleeping process
    costs 50-200 us on a VM, and the other side usually answers within that. Spinning took DQN on CartPole from 4,900
    to 8,000 SPS (the learner waits for each batch, the trainer for each update)."""
    deadline = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < deadline:
        if conn.poll(0):
            return True
    return conn.poll(timeout)


def _to_host(value: Any) -> Any:
    """Tensors (alone or in a named tuple such as a ReplayBatch) as numpy arrays, to pickle cheaply."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*[_to_host(v) for v in value])
    return value


def _from_host(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*[_from_host(v) for v in value])
    return value

