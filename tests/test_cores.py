"""Cores come from the allocation (affinity mask, cgroup quota), not from os.cpu_count(): under taskset, Slurm,
Docker or Kubernetes the thread plan, the env workers and preflight count what the process may use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import fleetrl_env, skip_unless_ci
from fleetrl.cores import Cores, cgroup_cpu_quota

MACHINE = os.cpu_count() or 1


def one_allowed_cpu() -> str:
    """A CPU this process may run on, for ``taskset -c``: CPU 0 is not in every allocation (a Docker cpuset, a Slurm
    step), and pinning to a CPU outside the affinity mask fails."""
    return str(max(os.sched_getaffinity(0)))


def pinned_to_one_cpu(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["taskset", "-c", one_allowed_cpu(), *argv], capture_output=True, text=True, env=fleetrl_env(),
                          timeout=180, **kwargs)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_the_tightest_on_the_process_cgroup_and_its_ancestors(tmp_path):
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    _write(tmp_path / "cg" / "slurm" / "cpu.max", "400000 100000\n")  # 4 cores for all of Slurm
    _write(tmp_path / "cg" / "slurm" / "job_7" / "cpu.max", "150000 100000\n")  # 1.5 for the job
    _write(tmp_path / "cg" / "slurm" / "job_7" / "step_0" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(str(proc), tmp_path / "cg") == 1.5


def test_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    _write(tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "50000\n")
    _write(tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cg" / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cg" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(str(proc), tmp_path / "cg") == 0.5


def test_no_quota_anywhere_means_none(tmp_path):
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/user.slice\n")
    _write(tmp_path / "cg" / "user.slice" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(str(proc), tmp_path / "cg") is None
    assert cgroup_cpu_quota(str(tmp_path / "missing"), tmp_path / "nowhere") is None


@pytest.fixture
def two_cores_and_taskset():
    """A machine of 2+ cores (hardware: a 1-core one skips, CI too) and taskset (util-linux: CI has it)."""
    if MACHINE < 2:
        skip_unless_ci("pinning to one core shows nothing on a 1-core machine", ci_provides=False)
    if not shutil.which("taskset"):
        skip_unless_ci("taskset is not installed (apt-get install util-linux)")


needs_two = pytest.mark.usefixtures("two_cores_and_taskset")


# `fleetrl train` then `fleetrl preflight` in one pinned process (one torch import, not two): each must end with status 0,
# and a line after each divides the output
TRAIN_THEN_PREFLIGHT = ("import sys; from fleetrl.cli import main\n"
                        "then = sys.argv.index('--then')\n"
                        "for argv in (sys.argv[1:then], sys.argv[then + 1:]):\n"
                        "    try:\n        main(argv)\n"
                        "    except SystemExit as e:\n        assert not e.code, (argv[0], e.code)\n"
                        "    print('=== done:', argv[0], flush=True)")


@needs_two
@pytest.mark.slow
def test_under_taskset_one_core_the_thread_plan_and_the_env_workers_plan_for_one_and_preflight_counts_it(tmp_path):
    proc = pinned_to_one_cpu([sys.executable, "-c", TRAIN_THEN_PREFLIGHT,
                              "train", "ppo", "--env-id", "CartPole-v1", "--env-backend", "async", "--num-envs", "4", "--num-steps", "16",
                              "--total-timesteps", "64", "--no-cuda", "--run-dir", str(tmp_path / "run"), "--no-progress",
                              "--then", "preflight", "--json", "--seconds", "0.2"])
    # few cores is a warning of preflight's, not a failure
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained, _, rest = proc.stdout.partition("=== done: train\n")
    plan = next(line for line in trained.splitlines() if line.startswith("threads on"))
    # one CPU in the mask; a cgroup quota (a container's, a Slurm job's), if any, is named beside it
    one_cpu = Cores(usable=1, machine=MACHINE, affinity=1, quota=cgroup_cpu_quota())
    assert plan.startswith(f"threads on {one_cpu.describe()}") and "affinity mask 1 of the machine's" in plan, plan
    assert "1 env worker process" in plan, plan

    preflight, done, _ = rest.partition("=== done: preflight\n")
    assert done, proc.stdout[-3000:]
    report = json.loads(preflight)
    assert report["cpu"]["usable"] == 1 and report["cpu"]["affinity"] == 1 and report["cpu"]["cpu_count"] == MACHINE
