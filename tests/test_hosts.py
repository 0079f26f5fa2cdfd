"""The suite passes on every host a user or CI may have, checked here on the one at hand: the tests that read the CPU's
bf16 flags run again on a CPU with native bf16 and on one without (a copy of /proc/cpuinfo bind-mounted over it in a
mount namespace of their own), and the tests that pin to a core run again in a cpuset that does not hold CPU 0 (a real
cgroup, as `docker --cpuset-cpus=1` or a Slurm step makes). Both need root; CI (.ci/run) is root."""

from __future__ import annotations

import ast
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
# the tests that reach the precision or memory-format choice (each must hold on both kinds of CPU): marked cpu_choice, and
# test_every_test_that_reads_the_cpu_choice_is_marked keeps the mark on every one of them. The serial ones need the machine
# to themselves (test_auto_backend's quiet-and-loaded pair, which compares two runs' lines with each other) and stay out.
# Only the files that hold the mark are collected (collecting the whole suite takes 20 s)
PRECISION_TESTS = [*(f"tests/{p.name}" for p in sorted(TESTS_DIR.glob("test_*.py")) if p.name != Path(__file__).name
                     and "mark.cpu_choice" in p.read_text()), "-m", "cpu_choice and not serial"]
# what a test uses when it reads the choice: the chooser, the bf16 probe, the timing it stubs, or the line a run prints
CPU_CHOICE_NAMES = {"choose_accel", "native_bf16", "_time_training_steps", "_cpu_flags", "measured_once"}
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


# what fleetrl's probe says of the CPU (as a run's start-up line would), printed by the pytest process itself before it runs
# the tests: one torch import serves the check and the tests
SAY_NATIVE_BF16_THEN_PYTEST = ("import sys, torch; from fleetrl.accel import native_bf16\n"
                               "print('native bf16:', native_bf16(torch.device('cpu'))[0], flush=True)\n"
                               "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def is_already(native: bool) -> bool:
    """Whether this machine's CPU flags are those :func:`cpuinfo_with_bf16` would pretend (the other lines, such as the
    clock, change from one read to the next and say nothing of bf16)."""
    flag_lines = {tuple(sorted(line.split(":", 1)[1].split())) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")}
    pretended = {tuple(sorted(line.split(":", 1)[1].split())) for line in cpuinfo_with_bf16(native).splitlines()
                 if line.startswith("flags")}
    return flag_lines == pretended


def pytest_in(prefix: list[str], tests: list[str], tmp_path: Path, say_native_bf16: bool = False) -> subprocess.CompletedProcess:
    """Run ``tests`` in a fresh pytest behind ``prefix`` (a namespace or cgroup wrapper), with a cache of measured settings
    of its own (a choice cached on the real CPU must not answer for the pretended one). ``say_native_bf16``: the process
    first prints ``native bf16: True|False`` as fleetrl's probe finds it there."""
    env = {**fleetrl_env(1), "FLEETRL_CACHE_DIR": str(tmp_path / "cache")}
    start = [sys.executable, "-c", SAY_NATIVE_BF16_THEN_PYTEST] if say_native_bf16 else [sys.executable, "-m", "pytest"]
    return subprocess.run([*prefix, *start, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
                          capture_output=True, text=True, cwd=TESTS_DIR.parent, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("native", [False, True], ids=["without-native-bf16", "with-native-bf16"])
def test_the_precision_tests_pass_on_a_cpu_with_and_without_native_bf16(native, tmp_path):
    _need_root_and("unshare", "mount")
    if is_already(native):
        # this CPU is of that kind, and the suite runs these very tests on it: a fresh pytest here would repeat them
        skip_unless_ci(f"this CPU {'has' if native else 'lacks'} native bf16 itself: the suite's own run of the cpu_choice "
                       "tests is this check", ci_provides=False)
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo_with_bf16(native))
    # a private mount namespace: the bind mount is seen by this command only, and goes with it
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /proc/cpuinfo && exec "$@"', str(fake)]
    proc = pytest_in(prefix, PRECISION_TESTS, tmp_path, say_native_bf16=True)
    assert proc.stdout.startswith(f"native bf16: {native}\n"), proc.stdout[-2000:] + proc.stderr[-2000:]
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


def _reads_the_cpu_choice(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in CPU_CHOICE_NAMES or isinstance(sub, ast.Attribute) and sub.attr in CPU_CHOICE_NAMES:
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and (sub.value in CPU_CHOICE_NAMES or "precision:" in sub.value):
            return True
    return False


def _marked_cpu_choice(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Attribute) and sub.attr == "cpu_choice" for sub in ast.walk(node))


def test_every_test_that_reads_the_cpu_choice_is_marked():
    """A test that reads the precision or layout choice but is not marked would pass on this host and fail on the other
    kind (as test_memory_format_pins_the_layout_... did on a bf16 host, outside the old `-k precision or bf16`)."""
    unmarked, marked = [], 0
    for path in sorted(TESTS_DIR.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and _marked_cpu_choice(n) for n in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and _reads_the_cpu_choice(node):
                # the mark on the test, or on at least one of its parameter sets (pytest.param(..., marks=...))
                if module_marked or any(_marked_cpu_choice(d) for d in node.decorator_list):
                    marked += 1
                else:
                    unmarked.append(f"{path.name}::{node.name}")
    assert not unmarked, f"mark these @pytest.mark.cpu_choice (tests/test_hosts.py reruns them on both kinds of CPU): {unmarked}"
    assert marked >= 7, marked  # the scan finds the tests it is meant to find
