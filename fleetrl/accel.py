"""Compute settings for the networks, chosen at start and explained: precision (fp32, or bf16 autocast around the
network only), memory format (channels-last for CNNs), torch.compile of the learner step, and the CUDA runtime flags.

Where there is a choice it is measured on this machine, once: the result is cached per machine, torch version,
threads and network (``~/.cache/fleetrl/accel.json``, or ``$FLEETRL_CACHE_DIR``; :func:`measured_once`, which
``--actor-device auto`` uses too), because each setting changes the arithmetic and a timing taken beside other jobs
swings several-fold. So the same command trains the same way on a
quiet and on a busy machine, and a resumed run keeps the settings its checkpoint was trained with.

Only the network's forward runs in bf16. Its outputs come back as fp32 (``Agent.forward`` casts them), so
log-probabilities, the ratio, the losses, GAE, normalisation, the parameters and the optimiser stay fp32, and acting
and learning compute log-probabilities the same way (at equal parameters the first minibatch's ``approx_kl`` is ~0).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from fleetrl.errors import FleetError
from fleetrl.files import write_atomically
from fleetrl.nets import network_obs_dtype
from fleetrl.optim import SGD

PRECISIONS = ("auto", "fp32", "bf16")
MEMORY_FORMATS = ("auto", "contiguous", "channels-last")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROBE_STEPS = 3  # timed training steps per candidate setting, taken in turns after one untimed warm-up round
PROBE_MAX_BATCH = 256  # the probe times at most this many samples a step: enough to rank the settings
# A setting later in the list (channels-last, bf16) must be this much faster than an earlier one to be chosen: each
# changes the arithmetic, so near-ties must not flip with the machine's load from one start of a command to the next
PROBE_MARGIN = 0.15
CACHE_FILE = "accel.json"
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # without these, CPUs emulate bf16 (measured 10x slower)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise FleetError(f"Unknown --precision {precision!r}; choose one of: {', '.join(PRECISIONS)} "
                         f"(auto picks bf16 only where the hardware runs it natively and it measures faster).")


def check_memory_format(memory_format: str) -> None:
    if memory_format not in MEMORY_FORMATS:
        raise FleetError(f"Unknown --memory-format {memory_format!r}; choose one of: {', '.join(MEMORY_FORMATS)} (auto "
                         f"measures both for a CNN and keeps contiguous unless channels-last is clearly faster; contiguous "
                         f"gives the same bits as a PyTorch script such as CleanRL's on every machine).")


def autocast(device_type: str, dtype: torch.dtype):
    """bf16 autocast for a network's forward, or nothing at fp32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether this device runs bf16 natively, and what says so."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, f"{torch.cuda.get_device_name(device)} {'has' if ok else 'lacks'} native bf16"
    flags = _cpu_flags()
    found = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
    if found:
        return True, f"this CPU has {'/'.join(found)}"
    return False, f"this CPU has no native bf16 ({' or '.join(NATIVE_BF16_CPU_FLAGS)})"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def configure_device(device: torch.device) -> None:
    """Engine-owned runtime flags: cuDNN picks its fastest (still deterministic when asked) algorithms, and fp32
    matmuls and convolutions use TF32 tensor cores on GPUs that have them."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


@dataclass(frozen=True)
class Accel:
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    compile: bool = False
    reason: str = "defaults"

    @property
    def label(self) -> str:
        name = "bf16" if self.dtype == torch.bfloat16 else "fp32"
        return name + (", channels-last" if self.channels_last else "") + (", compiled" if self.compile else "")

    def apply(self, model: nn.Module) -> nn.Module:
        """Set the model's forward precision and its convolution weights' memory format, in place."""
        model.compute_dtype = self.dtype
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    def state(self) -> dict[str, Any]:
        """The choice as plain values, for checkpoints and the cache."""
        return {"dtype": "bf16" if self.dtype == torch.bfloat16 else "fp32", "channels_last": self.channels_last}

    def compiled(self, fn: Callable, model: nn.Module, dist: Any = None) -> Callable:
        """``fn`` (returning the loss first) under torch.compile with --compile, falling back to eager if it fails."""
        return CompiledStep(fn, model, dist) if self.compile else fn


def choose_accel(model: nn.Module, precision: str, compile: bool, device: torch.device, obs_space: Any, batch_size: int,
                 dist: Any = None, verbose: bool = False, saved: dict[str, Any] | None = None,
                 memory_format: str = "auto") -> Accel:
    """Pick precision and memory format for ``model`` (measured once on this machine where there is a choice), apply
    them, and say why. The probe trains a copy of the model on ``batch_size`` observations from ``obs_space`` (one
    minibatch). ``saved``: a resumed checkpoint's choice (:meth:`Accel.state`), kept as it was. ``memory_format``
    (``--memory-format``): auto measures channels-last against contiguous for a CNN; the others pin one."""
    check_precision(precision)
    check_memory_format(memory_format)
    configure_device(device)
    is_cnn = any(p.dim() == 4 for p in model.parameters())
    native, why_native = native_bf16(device)
    if precision == "auto":
        dtypes = [torch.float32, torch.bfloat16] if native else [torch.float32]
    else:
        dtypes = [DTYPES[precision]]
    formats = {"auto": (False, True), "contiguous": (False,), "channels-last": (True,)}[memory_format] if is_cnn else (False,)
    candidates = [Accel(d, cl, compile) for d in dtypes for cl in formats]

    if saved is not None and precision in ("auto", saved["dtype"]) and memory_format in ("auto", _format_name(saved)):
        choice = Accel(DTYPES[saved["dtype"]], bool(saved["channels_last"]) and is_cnn, compile)
        reason = "as the resumed checkpoint was trained"
    elif len(candidates) == 1:
        choice = candidates[0]
        if precision == "auto":
            reason = f"{why_native}, so fp32" if not native else "fp32"
        else:
            reason = f"--precision {precision}" + (f" (note: {why_native})" if precision == "bf16" and not native else "")
        if memory_format != "auto" and is_cnn:
            reason += f", --memory-format {memory_format}"
    else:
        obs_dtype = torch.uint8 if network_obs_dtype(obs_space.shape, obs_space.dtype) == np.uint8 else torch.float32  # as the learner sees them
        example_obs = torch.zeros((min(batch_size, PROBE_MAX_BATCH), *obs_space.shape), dtype=obs_dtype, device=device)
        key = cache_key(model, [c.label for c in candidates], example_obs, device)

        def measure() -> dict[str, float]:
            return {c.label: t for c, t in _time_training_steps(model, candidates, example_obs, device).items()}

        seconds, how = measured_once(key, measure)
        times = {c: seconds[c.label] for c in candidates}
        fastest = min(times.values())
        choice = next(c for c in candidates if times[c] <= fastest * (1 + PROBE_MARGIN))
        measured = ", ".join(f"{c.label.replace(', compiled', '')} {t * 1e3:.0f} ms" for c, t in times.items())
        prefix = f"{why_native}; " if precision == "auto" else f"--precision {precision}; "
        reason = f"{prefix}{how} a training step of {example_obs.shape[0]} samples: {measured}"
        if memory_format != "auto" and is_cnn:  # only the precision was measured
            reason += f"; --memory-format {memory_format}"
    if dist is not None and dist.enabled:  # every replica must run the same arithmetic: rank 0's choice wins
        choice, reason = dist.broadcast_object((choice, reason))
    choice = Accel(choice.dtype, choice.channels_last, compile, reason)
    choice.apply(model)
    if verbose:
        print(f"precision: {choice.label} ({reason})", flush=True)
    return choice


def _format_name(saved: dict[str, Any]) -> str:
    return "channels-last" if saved["channels_last"] else "contiguous"


def cache_dir() -> Path:
    return Path(os.environ.get("FLEETRL_CACHE_DIR") or Path.home() / ".cache" / "fleetrl")


def measured_once(key: str, measure: Callable[[], dict[str, float]]) -> tuple[dict[str, float], str]:
    """Seconds per setting for ``key`` (:func:`cache_key`): measured by ``measure()`` the first time on this machine,
    then read from the cache, so a choice made from them does not change with the load from one start to the next.
    Also says how they were got, for the start-up line."""
    cached = _read_cache().get(key)
    if cached is not None:
        return ({label: ms / 1e3 for label, ms in cached["ms"].items()},
                f"measured on this machine before (cached in {cache_dir() / CACHE_FILE}; delete it to measure again)")
    seconds = measure()
    _write_cache(key, {"ms": {label: t * 1e3 for label, t in seconds.items()}, "when": time.strftime("%Y-%m-%d %H:%M")})
    return seconds, "measured"


def cache_key(model: nn.Module, labels: list[str], example_obs: torch.Tensor | np.ndarray, device: torch.device) -> str:
    """What a timing depends on: the device, torch and its threads, the network, the batch and the settings compared
    (``labels``)."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
    shapes = ",".join(str(tuple(p.shape)) for p in model.parameters())
    parts = [where, torch.__version__, str(torch.get_num_threads()), type(model).__name__, shapes, str(tuple(example_obs.shape)),
             str(example_obs.dtype), "|".join(labels)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"{model} {sorted(_cpu_flags() & set(NATIVE_BF16_CPU_FLAGS))} {os.cpu_count()}"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads((cache_dir() / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, entry: dict[str, Any]) -> None:
    """Add one measurement, atomically; a cache that cannot be written only means measuring again next time."""
    path = cache_dir() / CACHE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**_read_cache(), key: entry}, indent=1))
    except OSError:
        pass


def _time_training_steps(model: nn.Module, settings: list[Accel], example_obs: torch.Tensor, device: torch.device) -> dict[Accel, float]:
    """Median seconds of forward + backward + an optimiser step for each setting, on throwaway copies of the model.
    The settings take turns step by step, so a change in the machine's load hits them alike."""
    probes = {s: s.apply(copy.deepcopy(model)) for s in settings}
    optimizers = {s: SGD(p.parameters(), lr=0.0) for s, p in probes.items()}
    times: dict[Accel, list[float]] = {s: [] for s in settings}
    for _ in range(1 + PROBE_STEPS):  # the first round warms up and is not counted
        for s, probe in probes.items():
            t0 = time.perf_counter()
            out, value = probe(example_obs)[:2]  # (a recurrent agent also returns its state)
            loss = out.logsumexp(-1).mean() + value.square().mean()
            optimizers[s].zero_grad()
            loss.backward()
            optimizers[s].step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[s].append(time.perf_counter() - t0)
    return {s: float(np.median(t[1:])) for s, t in times.items()}


class CompiledStep:
    """``fn`` under torch.compile. The first call also compiles the backward (``torch.autograd.grad``, which leaves
    ``.grad`` and its hooks alone); if anything fails, every later call runs eager ``fn``, with one warning. Under
    torchrun all ranks agree, so replicas never mix compiled and eager arithmetic."""

    def __init__(self, fn: Callable, model: nn.Module, dist: Any = None):
        self.fn, self.dist = fn, dist
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.compiled_fn = torch.compile(fn)
        self.checked, self.failed = False, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.checked:
            self.checked = True
            self.failed = not self._compiles(*args, **kwargs)
        return (self.fn if self.failed else self.compiled_fn)(*args, **kwargs)

    def _compiles(self, *args: Any, **kwargs: Any) -> bool:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss = self.compiled_fn(*args, **kwargs)[0]
                torch.autograd.grad(loss, self.params, allow_unused=True)
            ok, error = True, ""
        except Exception as exc:  # any compiler failure: eager is always correct
            ok, error = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if self.dist is not None and self.dist.enabled:
            ok = bool(self.dist.allreduce_sum_np(np.array([float(ok)]))[0] == self.dist.world_size)
            error = error or "another rank failed to compile"
        if not ok:
            print(f"warning: torch.compile failed ({error[:300]}); training continues eager (leave out --compile to skip the try).",
                  file=sys.stderr, flush=True)
        elif self.dist is None or self.dist.is_main:
            print(f"compile: learner step compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        return ok
