"""The CPU cores this process may use: its affinity mask (taskset, Slurm, cpusets) within its cgroup's CPU quota.

``os.cpu_count()`` counts the machine's cores, not the allocation: under ``taskset``, Slurm, Docker or Kubernetes a
plan made from it starts more busy workers than there are cores, and they stall each other. Everything in fleetrl
that sizes threads or worker processes asks :func:`available_cores` instead. No torch here: env workers import it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cores:
    """What limits this process's cores: ``usable`` is the smallest of the machine's count, the affinity mask and the
    cgroup quota (rounded down, at least 1)."""

    usable: int
    machine: int  # os.cpu_count()
    affinity: int  # CPUs in the affinity mask
    quota: float | None  # cores' worth of CPU time the cgroup allows, None when unlimited

    def limits(self) -> str:
        """What holds this process below the machine's cores, e.g. ``affinity mask 1 of the machine's 2``; "" if nothing."""
        limits = []
        if self.affinity != self.machine:
            limits.append(f"affinity mask {self.affinity}")
        if self.quota is not None and math.floor(self.quota) < self.affinity:
            limits.append(f"cgroup quota {self.quota:g}")
        return f"{', '.join(limits)} of the machine's {self.machine}" if limits else ""

    def describe(self) -> str:
        """e.g. ``2 cores`` or ``1 core (affinity mask 1 of the machine's 2)``."""
        text = f"{self.usable} core{'s' if self.usable != 1 else ''}"
        return text + (f" ({self.limits()})" if self.limits() else "")


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota, in cores, on this process's cgroup and its ancestors (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None when nothing limits it or the files cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    quotas = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: one unified tree
            quotas += [q for d in _ancestors(root, path) if (q := _v2_quota(d / "cpu.max")) is not None]
        elif "cpu" in controllers.split(","):
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    quotas += [q for d in _ancestors(mount, path) if (q := _v1_quota(d)) is not None]
                    break
    if not lines:  # no /proc: the container's root cgroup is all there is to read
        quotas += [q for q in (_v2_quota(root / "cpu.max"), _v1_quota(root / "cpu")) if q is not None]
    return min(quotas) if quotas else None


def _ancestors(mount: Path, path: str) -> list[Path]:
    """``mount/path`` and each parent folder up to ``mount`` (a quota anywhere above applies too)."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quota(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def cores() -> Cores:
    """This process's cores, and what limits them."""
    machine = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = machine
    quota = cgroup_cpu_quota()
    usable = min(machine, affinity)
    if quota is not None:
        usable = min(usable, math.floor(quota))
    return Cores(max(1, usable), machine, affinity, quota)


def available_cores() -> int:
    """How many cores this process may keep busy (at least 1)."""
    return cores().usable
