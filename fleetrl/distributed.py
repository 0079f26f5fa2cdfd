"""Compute layer: data-parallel training under torchrun (one process, N processes, N nodes).

Launch with ``torchrun``; nothing here starts processes. The global ``RANK`` and ``WORLD_SIZE``
are used (not ``LOCAL_RANK`` as a rank, which only works on one node). Replicas stay identical:
parameters are broadcast from rank 0 once, gradients are averaged with an explicit all-reduce
over flat buckets, started during the backward pass (waiting for it is its own, timed phase), and every decision that could
split the ranks (early stop on KL, a non-finite loss) is taken from all-reduced figures.

Seeds: the env with global index ``g = rank * local_num_envs + i`` is seeded ``seed + g``, so the
envs of all ranks together are seeded exactly as ``num_envs`` envs in one process. The torch and
numpy streams of rank ``r`` start from ``seed + r``.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import os
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _unflatten_dense_tensors

from fleetrl.errors import FleetError

BUCKET_BYTES = 2 * 1024 * 1024  # gradients are all-reduced in flat buckets of about this size
WATCHDOG_MARGIN_S = 10.0  # past --dist-timeout, this much longer in one collective ends the process


@dataclass
class Dist:
    """This process's place in the job; a single process is world size 1 and skips all communication."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    comm_phase: Any = None  # a PhaseTimer phase that times every collective
    timeout_s: float = 300.0  # --dist-timeout
    _waiting_since: float | None = None  # when the collective this rank waits in began
    _watchdog: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to another process (the learner's update functions close over it, fleetrl/learner.py) leaves this
        process's phase timer and watchdog thread behind."""
        return {**self.__dict__, "comm_phase": None, "_waiting_since": None, "_watchdog": None}

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @contextmanager
    def _timed(self):
        """Every blocking collective runs in here: timed, and watched. gloo does not always honour its timeout
        when a peer's node vanishes (a SIGKILLed node 1 left rank 0 waiting in an all-reduce for good), so a
        watchdog thread ends this process once a collective has waited ``--dist-timeout`` plus a margin."""
        if self.enabled and self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="fleetrl-dist-watchdog", daemon=True)
            self._watchdog.start()
        self._waiting_since = time.monotonic()
        try:
            with self.comm_phase if self.comm_phase is not None else nullcontext():
                yield
        except RuntimeError as exc:  # gloo/NCCL: a peer's connection reset, or the collective's timeout
            if not self.enabled:
                raise
            raise FleetError(
                f"Rank {self.rank} lost the other ranks in a collective: {str(exc).strip().splitlines()[0][:300]} "
                f"A rank or its node died or stopped answering (within --dist-timeout {self.timeout_s:g} s). The newest "
                f"checkpoint is intact: restart the job with --resume auto, or launch with torchrun --max-restarts to do it "
                f"automatically. If a rank is only slow (a long checkpoint write, a slow env step), raise --dist-timeout."
            ) from None
        finally:
            self._waiting_since = None

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self.timeout_s + WATCHDOG_MARGIN_S:
                print(f"fleetrl: error: rank {self.rank} waited {time.monotonic() - since:.0f} s for the other ranks in a collective, "
                      f"past --dist-timeout {self.timeout_s:g} s: a rank or its node is gone or stuck. This process stops now; "
                      f"the newest checkpoint is intact, so restart the job with --resume auto (or use torchrun --max-restarts). "
                      f"If a rank is only slow (a long checkpoint write, a slow env step), raise --dist-timeout.",
                      file=sys.stderr, flush=True)
                os._exit(1)  # a thread cannot interrupt the blocked C++ wait; nothing is left to lose: checkpoints are atomic

    # --- collectives; each is a no-op at world size 1 ---

    def allreduce_sum_np(self, values: np.ndarray) -> np.ndarray:
        """Sum a float64 array over ranks (normalisation statistics, global figures)."""
        if not self.enabled:
            return values
        with self._timed():
            t = torch.as_tensor(np.ascontiguousarray(values, dtype=np.float64), device=self.device)
            dist.all_reduce(t)
            return t.cpu().numpy()

    def mean(self, values: Iterable[float]) -> list[float]:
        """The mean over ranks of a few scalars, in one all-reduce."""
        values = list(values)
        if not self.enabled:
            return values
        return (self.allreduce_sum_np(np.asarray(values, np.float64)) / self.world_size).tolist()

    def normalize(self, x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """(x - mean) / (std + eps) with the mean and unbiased std of x over all ranks together.

        The statistics are float64, two-pass: each rank's count, mean and sum of squared deviations, gathered and
        combined as Chan et al. combine partial variances (alone: its own). A sum of squares minus n * mean**2 cancels
        badly when the mean is large against the spread, so W ranks would not compute what one process computes."""
        with torch.no_grad():
            local = x.detach().to(torch.float64)
            local_mean = local.mean()
            mine = torch.stack([torch.tensor(float(local.numel()), dtype=torch.float64, device=x.device), local_mean,
                                ((local - local_mean) ** 2).sum()])
            parts = [mine]
            if self.enabled:
                parts = [torch.empty_like(mine) for _ in range(self.world_size)]
                with self._timed():
                    dist.all_gather(parts, mine)
            counts, means, squares = torch.stack(parts).unbind(1)
            n = counts.sum()
            mean = (counts * means).sum() / n
            var = (squares.sum() + (counts * (means - mean) ** 2).sum()) / (n - 1)
        return (x - mean.to(x.dtype)) / (var.sqrt().to(x.dtype) + eps)

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Start every replica from rank 0's initial parameters."""
        if not self.enabled:
            return
        with self._timed(), torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def gradient_sync(self, params: Iterable[torch.nn.Parameter]) -> "GradientSync":
        """Averages the gradients of ``params`` over ranks; one per optimiser. Run backward as ``sync.backward(loss)``
        to overlap the all-reduce with it, then ``sync.finish()`` before the optimiser's step."""
        return GradientSync(self, list(params))

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (small metadata such as finished episodes), in rank order."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        with self._timed():
            dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the resume checkpoint, the run folder)."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        with self._timed():
            dist.broadcast_object_list(box, src=0, device=self.device if self.backend == "nccl" else None)
        return box[0]

    def check_replicas_identical(self, module: torch.nn.Module) -> str:
        """Raise if any rank's parameters differ bit for bit from rank 0's; return the digest."""
        digest = hashlib.sha256()
        for tensor in module.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        mine = digest.hexdigest()
        everyone = self.gather_objects(mine)
        if len(set(everyone)) != 1:
            diverged = [r for r, d in enumerate(everyone) if d != everyone[0]]
            raise FleetError(f"Replicas diverged: the parameters of rank(s) {diverged} differ from rank 0's. This is a fleetrl bug; please report it.")
        return mine

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class GradientSync:
    """Averages the gradients of one optimiser's parameters over ranks, overlapping backward.

    ``sync.backward(loss)`` runs ``loss.backward()`` with this sync's hooks armed: parameters are
    grouped, in the order backward produces their gradients, into flat buckets of about
    ``BUCKET_BYTES``, and a complete bucket's all-reduce starts while backward goes on through
    earlier layers. :meth:`finish` waits for them (the timed ``comm`` phase is only that wait),
    reduces whatever did not start, and returns the ``extra`` scalars averaged over ranks.

    Whatever backward passes ran, ``finish`` leaves in each ``.grad`` the mean over ranks of that
    ``.grad`` as it stands then: gradients accumulated over several backward passes are averaged
    together. A backward run through these parameters by another loss (SAC's actor loss through
    the critic) or a plain ``loss.backward()`` starts no all-reduce, and a bucket that gains a
    gradient after its all-reduce started is reduced again from ``.grad`` at ``finish``. The
    hooks fire in the same order on every rank, so the ranks issue the same collectives in the
    same order. At world size 1 it does nothing.
    """

    def __init__(self, dist_: Dist, params: list[torch.nn.Parameter]):
        self.dist = dist_
        self.params = [p for p in params if p.requires_grad]
        self.buckets: list[list[torch.nn.Parameter]] = [[]]
        size = 0
        for p in reversed(self.params):  # backward reaches the last layers first
            if self.buckets[-1] and size + p.numel() * p.element_size() > BUCKET_BYTES:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._armed = False  # True only inside self.backward: other backward passes start no all-reduce
        self._ready = [0] * len(self.buckets)  # gradients produced by the current armed backward, per bucket
        self._pending: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket -> (started all-reduce, its flat buffer)
        self._stale: set[int] = set()  # started buckets that gained a gradient since: reduce again at finish
        if dist_.enabled:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, starting each complete bucket's all-reduce as its gradients are ready."""
        if not self.dist.enabled:
            loss.backward()
            return
        self._ready = [0] * len(self.buckets)
        self._armed = True
        try:
            loss.backward()
        finally:
            self._armed = False

    def _grad_ready(self, p: torch.nn.Parameter) -> None:
        b = self._bucket_of[id(p)]
        if b in self._pending:  # its all-reduce already read .grad, which has just changed
            self._stale.add(b)
        elif self._armed:
            self._ready[b] += 1
            if self._ready[b] == len(self.buckets[b]):
                self._launch(b)

    def _launch(self, b: int) -> None:
        # a copy, always (_flatten_dense_tensors returns a one-tensor bucket's .grad itself): a later backward may add to .grad
        # while the all-reduce is in flight
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.buckets[b]])
        self._pending[b] = (dist.all_reduce(flat, async_op=True), flat)

    def finish(self, extra: torch.Tensor | None = None) -> torch.Tensor | None:
        """Replace every gradient by its mean over ranks; return ``extra`` (scalars) averaged over ranks too."""
        if not self.dist.enabled:
            return extra
        with self.dist._timed():
            for b in sorted(self._stale):  # every rank saw the same hooks, so every rank re-reduces the same buckets
                self._pending.pop(b)[0].wait()
            for b in range(len(self.buckets)):
                if b not in self._pending:  # a parameter no armed backward used, or a stale bucket
                    self._launch(b)
            if extra is not None:
                extra = extra.detach().to(torch.float64).clone()
                dist.all_reduce(extra)
                extra /= self.dist.world_size
            for b, (work, flat) in self._pending.items():
                work.wait()
                flat /= self.dist.world_size
                bucket = self.buckets[b]
                for p, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    if p.grad is None:
                        p.grad = reduced.clone()
                    else:
                        p.grad.copy_(reduced)
        self._pending.clear()
        self._stale.clear()
        return extra


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_distributed(cuda: bool, backend: str | None = None, timeout_s: float = 300.0) -> Dist:
    """Join the torchrun job if there is one (NCCL on CUDA, gloo on CPU; ``backend`` overrides)."""
    if not launched_by_torchrun():
        return Dist()
    # torch.distributed.nn binds the default group into its functions' default arguments when first imported,
    # and torch.optim imports it lazily. Imported after init_process_group, it keeps the gloo group (and rank 0's
    # round store) alive past destroy_process_group, so their threads are torn down during interpreter exit,
    # which now and then aborts a finished worker (SIGABRT) and makes torchrun restart a job that was done.
    # Imported before the group exists, it binds None.
    importlib.import_module("torch.distributed.nn")  # not `import`, which would make `torch` local here
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    use_cuda = cuda and torch.cuda.is_available()
    device, backend = place_rank(torch.cuda.device_count() if use_cuda else 0, local_rank, local_world_size, backend)
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _round_store(rank, world_size, timeout) if torchrun_shares_its_store() else None
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank if store is not None else -1,
        world_size=world_size if store is not None else -1,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    return Dist(rank, world_size, local_rank, local_world_size, backend, device, timeout_s=timeout_s)


def place_rank(gpus: int, local_rank: int, local_world_size: int, backend: str | None) -> tuple[torch.device, str]:
    """This rank's device and the process-group backend: NCCL with one GPU per rank, gloo on CPUs.

    With more ranks on a node than GPUs (e.g. 2 processes sharing 1 GPU) rank ``r`` uses GPU
    ``r % gpus`` and the default backend is gloo, because NCCL refuses two ranks on one GPU.
    """
    if gpus == 0:
        if backend == "nccl":
            raise FleetError("--dist-backend nccl needs CUDA GPUs, and none is available here. Use --dist-backend gloo on CPUs.")
        return torch.device("cpu"), backend or "gloo"
    shared = local_world_size > gpus
    if shared and backend == "nccl":
        raise FleetError(
            f"--dist-backend nccl cannot put two ranks on one GPU, and this node runs {local_world_size} processes on "
            f"{gpus} GPU(s). Launch --nproc_per_node={gpus}, or leave --dist-backend unset (gloo shares the GPUs)."
        )
    return torch.device("cuda", local_rank % gpus), backend or ("gloo" if shared else "nccl")


ROUND_STORE_KEY = "fleetrl/round_store"  # in torchrun's store: "PORT/NONCE" of the current round's store


def torchrun_shares_its_store() -> bool:
    """True when torchrun hands its workers its own long-lived store (the c10d rendezvous default)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _round_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """A store private to this round of the job, so that a restarted round never reads a dead round's keys.

    torchrun's shared store outlives restarts, and torch's env:// init puts every round's keys under the
    same names there, so after ``--max-restarts`` the new ranks can read the dead round's gloo/NCCL
    addresses and fail or hang while connecting (pytorch/pytorch#135712). ``TORCHELASTIC_RESTART_COUNT``
    cannot tell rounds apart across nodes (each node counts its own restarts). Instead rank 0 serves a
    fresh store on a free port and announces ``PORT/NONCE`` in torchrun's store; the other ranks accept an
    announcement only when a store answers there with the same nonce, so a dead round's is skipped.
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    shared = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    if rank == 0:
        own = dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout)
        nonce = uuid.uuid4().hex
        own.set("nonce", nonce)
        shared.set(ROUND_STORE_KEY, f"{own.port}/{nonce}")
        return own
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        shared.wait([ROUND_STORE_KEY])
        own_port, nonce = shared.get(ROUND_STORE_KEY).decode().split("/")
        store = _connect_if_nonce(host, int(own_port), nonce, timeout)
        if store is not None:
            return store
        if time.monotonic() > deadline:
            raise FleetError(
                f"rank {rank} found no store of this round's rank 0 at {host}:{own_port} within --dist-timeout "
                f"({timeout.total_seconds():.0f} s): rank 0 did not start. Check rank 0's output for its error."
            )
        time.sleep(0.2)


def _connect_if_nonce(host: str, port: int, nonce: str, timeout: datetime.timedelta) -> dist.Store | None:
    try:  # a plain connect first: a dead round's port refuses at once, without torch's retry loop and logs
        socket.create_connection((host, port), timeout=2).close()
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
        if store.get("nonce").decode() != nonce:  # the port was reused by a newer round's store
            return None
    except (OSError, RuntimeError):
        return None
    store.set_timeout(timeout)
    return store


def split_evenly(total: int, world_size: int, what: str, flag: str) -> int:
    """Each rank's share of a global quantity, or a clear refusal when it does not divide."""
    if total % world_size:
        raise FleetError(
            f"{what} ({flag} {total}) must split evenly over the {world_size} processes of this torchrun job. "
            f"Raise {flag} to a multiple of {world_size} (e.g. {(total // world_size + 1) * world_size}), or launch "
            f"a number of processes that divides {total}."
        )
    return total // world_size


def rank_seed(seed: int, rank: int, global_step: int = 0) -> int:
    """The seed of rank ``rank``'s torch/numpy streams; a resumed run re-derives them from its step."""
    return (seed + rank + 1_000_003 * global_step) % (2**31)


def shared_generator(device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch generator that is the same on every rank, for draws the replicas must agree on (Rainbow's noise: the
    replicas are one network learning from the global batch). Under torchrun rank 0 draws its seed from its own torch
    RNG (seeded and checkpointed with the run) and broadcasts it, so every rank calls this at the same point. In one
    process: None, so the caller draws from torch's global RNG, as CleanRL does."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    seed = torch.randint(2**62, (1,), device=device)
    dist.broadcast(seed, src=0)
    return torch.Generator(device=device).manual_seed(int(seed.item()))


__all__ = ["Dist", "init_distributed", "launched_by_torchrun", "place_rank", "rank_seed", "shared_generator", "split_evenly"]
