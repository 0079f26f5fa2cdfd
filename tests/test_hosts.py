"""The suite passes on every host a user or CI may have, checked here on the one at hand: the tests that read the CPU's
bf16 flags run again on a CPU with native bf16 and on one without (a copy of /proc/cpuinfo bind-mounted over it in a
mount namespace of their own), and the tests that pin to a core run again in a cpuset that does not hold CPU 0 (a real
cgroup, as `docker --cpuset-cpus=1` or a Slurm step makes). Both need root; CI (.ci/run) is root."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import TESTS_DIR, fleetrl_env, skip_unless_ci
from fleetrl.accel import NATIVE_BF16_CPU_FLAGS
CGROUP_V1_CPUSET = Path("/sys/fs/cgroup/cpuset")
CGROUP_V2 = Path("/sys/fs/cgroup")
# the tests that read the precision line or the CPU's bf16 flags (each must hold on both kinds of CPU); test_accel's
# compile tests (60 s) and the other no-dynamo runs read neither
PRECISION_TESTS = ["tests/test_accel.py", "tests/test_optim.py", "-k", "precision or bf16"]
# the tests that pin a process to one core
PINNING_TESTS = ["tests/test_cores.py"]


def _need_root_and(*tools: str) -> None:
    if os.geteuid() != 0:
        skip_unless_ci("only root can mount over /proc/cpuinfo or make a cgroup")
    for tool in tools:
        if not shutil.which(tool):
            skip_unless_ci(f"{tool} is not installed (apt-get install util-linux)")


def cpuinfo_with_bf16(native: bool) -> str:
    """This machine's /proc/cpuinfo with the native-bf16 flags taken out of every flags line, or put in."""
    text = Path("/proc/cpuinfo").read_text()

    def flags(match: re.Match) -> str:
        kept = [f for f in match.group(2).split() if f not in NATIVE_BF16_CPU_FLAGS]
        return match.group(1) + " ".join(kept + (list(NATIVE_BF16_CPU_FLAGS[:1]) if native else []))

    return re.sub(r"^(flags\s*:\s*)(.*)$", flags, text, flags=re.M)


def pytest_in(prefix: list[str], tests: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``tests`` in a fresh pytest behind ``prefix`` (a namespace or cgroup wrapper), with a cache of measured settings
    of its own (a choice cached on the real CPU must not answer for the pretended one)."""
    env = {**fleetrl_env(1), "FLEETRL_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([*prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
                          capture_output=True, text=True, cwd=TESTS_DIR.parent, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("native", [False, True], ids=["without-native-bf16", "with-native-bf16"])
def test_the_precision_tests_pass_on_a_cpu_with_and_without_native_bf16(native, tmp_path):
    _need_root_and("unshare", "mount")
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo_with_bf16(native))
    # a private mount namespace: the bind mount is seen by this command only, and goes with it
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /proc/cpuinfo && exec "$@"', str(fake)]
    check = subprocess.run([*prefix, sys.executable, "-c", "from fleetrl.accel import native_bf16; import torch; "
                            "print(native_bf16(torch.device('cpu')))"], capture_output=True, text=True, env=fleetrl_env(1), timeout=120)
    assert check.returncode == 0 and check.stdout.startswith(f"({native},"), check.stdout + check.stderr
    proc = pytest_in(prefix, PRECISION_TESTS, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@contextlib.contextmanager
def cpuset_without_cpu0() -> Iterator[list[str]]:
    """A cgroup whose cpuset holds the machine's last allowed CPU but not CPU 0; yields the command prefix that starts a
    process inside it. The cgroup is removed afterwards (its processes have ended by then)."""
    allowed = sorted(os.sched_getaffinity(0))
    if allowed[-1] == 0:
        skip_unless_ci("this allocation holds CPU 0 only: no cpuset without it can be made", ci_provides=False)
    name = f"fleetrl-test-nocpu0-{os.getpid()}"
    if (CGROUP_V1_CPUSET / "cpuset.cpus").exists():
        group = CGROUP_V1_CPUSET / name
        group.mkdir()
        (group / "cpuset.mems").write_text((CGROUP_V1_CPUSET / "cpuset.mems").read_text().strip().split(",")[0].split("-")[0])
        procs = group / "tasks"
    elif "cpuset" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
        subtree = CGROUP_V2 / "cgroup.subtree_control"
        if "cpuset" not in subtree.read_text().split():
            subtree.write_text("+cpuset")
        group = CGROUP_V2 / name
        group.mkdir()
        procs = group / "cgroup.procs"
    else:
        skip_unless_ci("no cpuset cgroup controller is mounted (cgroup v1 /sys/fs/cgroup/cpuset or v2 cpuset)")
    try:
        (group / "cpuset.cpus").write_text(str(allowed[-1]))
        yield ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]
    finally:
        for _ in range(50):  # the last process may still be leaving
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


@pytest.mark.slow
def test_the_pinning_tests_pass_in_a_cpuset_without_cpu_0(tmp_path):
    _need_root_and("taskset")
    if (os.cpu_count() or 1) < 2:
        skip_unless_ci("a 1-core machine has no cpuset without CPU 0", ci_provides=False)
    with cpuset_without_cpu0() as prefix:
        refused = subprocess.run([*prefix, "taskset", "-c", "0", "true"], capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0, "CPU 0 must be outside this cpuset, as in `docker --cpuset-cpus=1`"
        proc = pytest_in(prefix, PINNING_TESTS, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
