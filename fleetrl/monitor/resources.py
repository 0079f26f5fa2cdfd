"""Resource sampling in a background thread: CPU and memory of this process tree (env workers included)
and, on NVIDIA GPUs, utilisation, memory and power via NVML; plus the driver-version check preflight uses."""

from __future__ import annotations

import os
import threading
import time

import psutil

DEFAULT_INTERVAL_S = 2.0
MB = 1024 * 1024
CPU_KEYS = ("resources/cpu_percent", "resources/system_cpu_percent", "resources/rss_mb")
GPU_KEYS = ("resources/gpu_util", "resources/gpu_mem_mb", "resources/gpu_power_w")


class ResourceSampler:
    """Samples every ``interval`` seconds until stopped; ``latest()`` returns the newest sample.

    - ``resources/cpu_percent``: CPU of the process tree, summed over processes (100 = one core busy);
    - ``resources/system_cpu_percent``: the whole machine (100 = every core busy);
    - ``resources/rss_mb``: resident memory of the tree, summed (pages shared between processes count twice);
    - on NVIDIA GPUs: ``resources/gpu_util`` (mean % over the visible GPUs), ``resources/gpu_mem_mb`` and
      ``resources/gpu_power_w`` (totals). Without NVML or a GPU these keys are simply absent.

    One sample costs a few milliseconds of one core, well under 1% at the default 2 s;
    ``sample_cpu_s / samples`` shows the cost measured.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL_S, pid: int | None = None, gpus: bool = True, enabled: bool = True):
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.enabled = enabled  # off on ranks other than 0: start() does nothing, latest() is empty
        self.interval = interval
        self.pid = pid or os.getpid()
        self.gpus = gpus
        self.samples = 0
        self.sample_cpu_s = 0.0  # CPU time the sampling itself took, so its cost stays visible
        self._procs: dict[int, psutil.Process] = {}
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._gpu_handles: list = []

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ResourceSampler:
        if self._thread is not None or not self.enabled:
            return self
        self._root = psutil.Process(self.pid)
        self._procs = {}
        if self.gpus:
            self._open_nvml()
        # psutil's CPU percentages measure from the previous call: this first sample primes them
        # (and gives memory right away); the next one, an interval later, has real CPU numbers
        psutil.cpu_percent(interval=None)
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fleetrl-resources", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml, self._gpu_handles = None, []

    def __enter__(self) -> ResourceSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def latest(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    # ---- sampling -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        started = time.thread_time()
        cpu = rss = 0.0
        for proc in self._tree():
            try:
                with proc.oneshot():  # one read of /proc/PID/stat for both numbers
                    cpu += proc.cpu_percent(interval=None)
                    rss += proc.memory_info().rss
            except psutil.Error:
                continue  # exited between listing and reading
        values = {"resources/cpu_percent": cpu, "resources/system_cpu_percent": psutil.cpu_percent(interval=None), "resources/rss_mb": rss / MB}
        values.update(self._gpu_values())
        with self._lock:
            self._latest = values
        self.samples += 1
        self.sample_cpu_s += time.thread_time() - started

    def _tree(self) -> list[psutil.Process]:
        """This process and all its descendants, reusing last sample's Process objects: a fresh object's
        cpu_percent() has no previous reading to measure from and always says 0."""
        pids = descendant_pids(self.pid)
        if pids is None:  # no /proc children files: psutil scans every process on the machine instead
            try:
                pids = [p.pid for p in self._root.children(recursive=True)]
            except psutil.Error:
                pids = []
        procs = {self.pid: self._root}
        for pid in pids:
            cached = self._procs.get(pid)
            try:
                # is_running() compares the creation time too, so a reused pid gets a new object
                procs[pid] = cached if cached is not None and cached.is_running() else psutil.Process(pid)
            except psutil.Error:
                continue  # already gone
        self._procs = procs
        return list(procs.values())

    def _open_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no nvidia-ml-py, no driver, no GPU: CPU numbers only, and no warning
            return
        self._nvml = pynvml
        self._gpu_handles = visible_gpu_handles(pynvml)

    def _gpu_values(self) -> dict[str, float]:
        if not self._gpu_handles:
            return {}
        nvml = self._nvml
        util = _over_gpus(self._gpu_handles, lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        mem = _over_gpus(self._gpu_handles, lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / MB)
        power = _over_gpus(self._gpu_handles, lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)  # mW -> W
        values = {}
        # a reading a GPU does not support (utilisation on a MIG slice, power on some boards) is left out
        if util:
            values["resources/gpu_util"] = sum(util) / len(util)
        if mem:
            values["resources/gpu_mem_mb"] = sum(mem)
        if power:
            values["resources/gpu_power_w"] = sum(power)
        return values


def descendant_pids(pid: int) -> list[int] | None:
    """All descendants of ``pid`` from Linux's /proc/PID/task/TID/children, walking only the tree.

    psutil's children() reads the stat file of every process on the machine, which on a busy node with
    thousands of processes would cost more than the 1% of a core this sampler allows itself. None where
    the kernel has no children files (not Linux, or built without CONFIG_PROC_CHILDREN).
    """
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # exited meanwhile
        for tid in tasks:  # a child belongs to the thread that forked it, so every thread is read
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def _over_gpus(handles: list, read) -> list[float]:
    values = []
    for handle in handles:
        try:
            values.append(float(read(handle)))
        except Exception:
            continue
    return values


def visible_gpu_handles(nvml) -> list:
    """NVML handles of the GPUs this process may use: those CUDA_VISIBLE_DEVICES names (indices or
    UUIDs), else all. Like CUDA, the list stops at the first entry that names no GPU. (NVML counts in
    PCI bus order; CUDA does too under CUDA_DEVICE_ORDER=PCI_BUS_ID, as Slurm and most clusters set up.)"""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        entries = [str(i) for i in range(nvml.nvmlDeviceGetCount())] if visible is None else [e.strip() for e in visible.split(",") if e.strip()]
    except Exception:
        return []
    handles = []
    for entry in entries:
        try:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit() else nvml.nvmlDeviceGetHandleByUUID(entry))
        except Exception:
            break
    return handles


def parse_version(version: str) -> tuple[int, ...]:
    """``"535.104.05"`` -> ``(535, 104, 5)``; a non-numeric tail (``"470.57.02-beta"``) is ignored."""
    numbers = []
    for part in version.strip().split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):
            break
    if not numbers:
        raise ValueError(f"not a dotted version number: {version!r}")
    return tuple(numbers)


def gpu_driver_ok(version: str, minimum: str = "450.80.02") -> bool:
    """Whether an NVIDIA driver version is at least ``minimum``, compared part by part as numbers
    ("470" counts as 470.0.0, so it passes 450.80.02; "418.67" does not)."""
    have, need = parse_version(version), parse_version(minimum)
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def describe_usage(usage: dict[str, float], perf: dict[str, float]) -> str:
    """A short status for the progress display: CPU and GPU utilisation and the dominant phase."""
    parts = []
    if "resources/cpu_percent" in usage:
        parts.append(f"CPU {usage['resources/cpu_percent']:.0f}%")
    if "resources/gpu_util" in usage:
        parts.append(f"GPU {usage['resources/gpu_util']:.0f}%")
    shares = {k[len("perf/"):-len("_share")]: v for k, v in perf.items() if k.endswith("_share")}
    if shares:
        phase = max(shares, key=shares.get)
        parts.append(f"{phase} {100 * shares[phase]:.0f}%")
    return "  ".join(parts)
