"""fleetrl on a real Slurm cluster: a throwaway one (fleetrl/tools/minicluster.py) with two nodes, each a host of its
own, running docs/slurm/train.sbatch as a user would: 2-node training, a killed node, a requeue, a preemption."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars
from fleetrl.tools import minicluster

from conftest import assert_same_learner, fleetrl_env, require_slurm

REPO = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO / "docs" / "slurm" / "train.sbatch"
BATCH = 4 * 128  # classic control's default batch: 4 envs (2 a rank) x 128 steps
# the same observation every step and no episode end, so a resumed run sees what an uninterrupted one sees; fp32 and
# one thread, since --precision auto and the thread plan measure and decide, and two runs could decide differently
TRAIN = ["ppo", "--env-id", "fleetrl_test_envs:Stateless-v0", "--env-backend", "sync", "--precision", "fp32", "--no-cuda", "--torch-threads", "1"]


@pytest.fixture
def submit_training(slurm_cluster, tmp_path):
    """``submit_training(iterations, *flags)``: docs/slurm/train.sbatch on two nodes, training ``iterations`` iterations
    into ``tmp_path/run``; returns (job id, run dir). Each job it submitted is killed as the test ends, however it
    ends: a failed test leaves no job holding the nodes for the next."""
    jobs = []

    def submit(iterations: int, *extra: str) -> tuple[str, Path]:
        run_dir = tmp_path / "run"
        env = {**fleetrl_env(), "FLEETRL_PYTHON": sys.executable}
        jobs.append(slurm_cluster.submit(TRAIN_SCRIPT, *TRAIN, "--total-timesteps", str(iterations * BATCH), "--run-dir", str(run_dir),
                                         *extra, cwd=tmp_path, env=env))
        return jobs[-1], run_dir

    yield submit
    for job in jobs:
        slurm_cluster.slurm("scancel", "--signal=KILL", job, check=False)  # a finished job: Slurm only says so


def output(cluster: minicluster.MiniCluster, job: str) -> str:
    return cluster.job_output(cluster.job(job), tail=20_000)


def wait_for_checkpoint_after(cluster: minicluster.MiniCluster, job: str, run_dir: Path, step: int, timeout: float = 120) -> None:
    """Until the running job has written a checkpoint past global step ``step``."""
    deadline = time.monotonic() + timeout
    while not any(int(c.stem.split("_")[1]) > step for c in checkpoint.list_checkpoints(run_dir)):
        info = cluster.job(job)
        assert info["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {info['JobState']}:\n{output(cluster, job)}"
        assert time.monotonic() < deadline, f"no checkpoint past step {step} within {timeout} s:\n{output(cluster, job)}"
        time.sleep(0.2)


def assert_trained_once_to(run_dir: Path, iterations: int) -> None:
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == iterations * BATCH
    steps = [p.step for p in read_scalars(run_dir, "charts/learning_rate")]
    assert steps == [BATCH * i for i in range(1, iterations + 1)], "every iteration logged exactly once: resumed, not repeated"


def training_processes(cluster: minicluster.MiniCluster, node: str) -> list[psutil.Process]:
    """The training processes on ``node``: its torchrun launcher and the ranks under it (not Slurm's own)."""
    found = []
    for proc in minicluster._processes_in_netns(cluster.node(node).netns):
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(proc.cmdline())
            if "torch.distributed.run" in cmdline or "fleetrl" in cmdline and "train" in cmdline:
                found.append(proc)
    return found


# ---- the cluster itself -----------------------------------------------------------------------------------------


@pytest.mark.slurm
def test_the_nodes_are_separate_hosts_on_the_bridge_each_with_its_own_cores(slurm_cluster):
    probe = "echo $(hostname) $SLURMD_NODENAME $(hostname -I) $(grep Cpus_allowed_list /proc/self/status | cut -f2)"
    out = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "bash", "-c", probe], capture_output=True, text=True,
                         timeout=60, env=slurm_cluster.env(), cwd="/tmp")
    assert out.returncode == 0, out.stderr
    seen = {line.split()[0]: line.split() for line in out.stdout.splitlines()}
    assert sorted(seen) == ["node1", "node2"], out.stdout
    for node in slurm_cluster.nodes:
        _hostname, slurm_name, address, cpus = seen[node.name]
        assert slurm_name == node.name and address == node.address, "each node has its own hostname and its one address"
        assert not address.startswith("127."), "the nodes meet on the bridge, not on loopback"
        assert cpus == node.cpus
    if (os.cpu_count() or 1) >= 2:
        assert seen["node1"][3] != seen["node2"][3], "each node's jobs run on cores of their own"
    # the helper for later tests: a command run on a node sees that node, and names the others from its /etc/hosts
    inside = slurm_cluster.run_on("node2", ["bash", "-c", "hostname; getent ahostsv4 node1"])
    assert inside.returncode == 0 and inside.stdout.split()[:2] == ["node2", slurm_cluster.node("node1").address], inside


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_cluster_is_removed_entirely_even_with_jobs_running_and_its_block_failing(tmp_path):
    require_slurm()
    with pytest.raises(RuntimeError, match="the test's own failure"):
        with minicluster.running(nodes=1) as cluster:
            job = cluster.submit(_script(tmp_path, "sleep 600"), cwd=tmp_path)
            cluster.wait_for_job(job, ["RUNNING"], timeout=30)
            on_node = subprocess.Popen(cluster.on_node("node1", ["sleep", "600"]), start_new_session=True)
            # munged and slurmctld here; on the node: slurmd, slurmstepd, the job's shell and sleep, the sleep run there
            procs = [psutil.Process(pid) for pid in cluster.pids.values()] + minicluster._processes_in_netns(cluster.nodes[0].netns)
            assert len(procs) >= 7, procs
            raise RuntimeError("the test's own failure")
    on_node.wait(timeout=10)
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "every process of the cluster ended"
    assert not Path(cluster.root).exists() and not (minicluster.REGISTRY / f"{cluster.tag}.json").exists()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cluster.bridge not in links and cluster.nodes[0].veth not in links, "no bridge or veth left behind"
    assert cluster.nodes[0].netns not in netns, "no network namespace left behind"


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_cluster_whose_owner_died_is_removed_by_the_next_start():
    require_slurm()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a test run killed outright (SIGKILL) never tears its cluster down
    abandoned = minicluster.start(nodes=1, owner_pid=gone.pid)
    try:
        assert abandoned.tag in minicluster.reap_abandoned()
        assert not Path(abandoned.root).exists()
        assert abandoned.nodes[0].netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        minicluster.stop(abandoned)


def _script(tmp_path: Path, command: str) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/job-%j.out\n{command}\n")
    return path


def test_up_refuses_in_one_paragraph_without_root_or_without_slurm():
    if subprocess.run(["unshare", "--user", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a user namespace here to run as a non-root user")
    # a real unprivileged process: in a user namespace of its own it is uid 65534 and holds no capability here
    not_root = subprocess.run(["unshare", "--user", sys.executable, "-m", "fleetrl", "minicluster", "up", "--dir", "/nonexistent/x"],
                              capture_output=True, text=True, timeout=60, env=fleetrl_env())
    no_slurm = subprocess.run([sys.executable, "-m", "fleetrl", "minicluster", "up", "--dir", "/nonexistent/x"], capture_output=True,
                              text=True, timeout=60, env={**fleetrl_env(), "PATH": "/nonexistent"})
    installed = all(shutil.which(tool) for tool in minicluster.TOOLS)  # else the missing packages are named first
    for proc, fix in ((not_root, "sudo" if installed else "apt-get install"), (no_slurm, "apt-get install")):
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("fleetrl: error:") and fix in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "slurm-wlm" in no_slurm.stderr and "munge" in no_slurm.stderr, no_slurm.stderr


# ---- training across the two hosts ------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_two_node_job_trains_to_its_total_and_ends_bit_identical_to_two_processes_on_one_node(slurm_cluster, submit_training,
                                                                                               tmp_path):
    iterations = 6
    job, run_dir = submit_training(iterations, "--torch-deterministic")
    info = slurm_cluster.wait_for_job(job, timeout=180)
    text = output(slurm_cluster, job)
    assert info["JobState"] == "COMPLETED", text
    assert info["NodeList"] == "node[1-2]" and info["NumNodes"] == "2"
    assert "rendezvous at node1:" in text and "replicas in sync: 2 ranks hold bit-identical parameters" in text, text
    assert_trained_once_to(run_dir, iterations)

    local_dir = tmp_path / "one-node"
    local = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fleetrl", "train",
                            *TRAIN, "--total-timesteps", str(iterations * BATCH), "--run-dir", str(local_dir), "--torch-deterministic"],
                           capture_output=True, text=True, timeout=180, env=fleetrl_env())
    assert local.returncode == 0, local.stderr[-3000:]
    assert_same_learner(checkpoint.load_checkpoint(run_dir), checkpoint.load_checkpoint(local_dir))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_node_ends_the_job_with_fleetrls_message_and_a_requeue_resumes_it_to_its_total(slurm_cluster, submit_training):
    iterations = 24  # the kill comes right after the first checkpoint (iteration 4), well before the end
    job, run_dir = submit_training(iterations, "--checkpoint-every", "4")
    wait_for_checkpoint_after(slurm_cluster, job, run_dir, 0)
    victims = training_processes(slurm_cluster, "node2")
    assert victims, "node2 runs a torchrun launcher and its rank"
    for proc in victims:  # node2's training vanishes: launcher and rank, with no goodbye
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    info = slurm_cluster.wait_for_job(job, timeout=90)
    ended_after = time.monotonic() - killed_at
    text = output(slurm_cluster, job)
    assert info["JobState"] == "FAILED", text
    assert ended_after < 30, f"the job took {ended_after:.0f} s to end"
    # the surviving rank (on node1; rank 0 or 1, as the rendezvous numbered them) says what happened and what to do
    assert re.search(r"fleetrl: error: Rank \d lost the other ranks", text) and "--resume auto" in text, text[-3000:]
    stopped_at = int(checkpoint.load_checkpoint(run_dir)["global_step"])
    assert 0 < stopped_at < iterations * BATCH

    slurm_cluster.slurm("scontrol", "requeue", job)  # the script resumes with --resume auto
    info = slurm_cluster.wait_for_job(job, timeout=180, until=lambda j: j.get("Restarts") == "1")
    assert info["JobState"] == "COMPLETED", output(slurm_cluster, job)
    assert_trained_once_to(run_dir, iterations)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_usr1_and_scontrol_requeue_each_checkpoint_and_the_requeued_job_resumes_to_its_total_without_repeating_a_step(
        slurm_cluster, submit_training):
    # the two ways a job is stopped for later: USR1 to the batch script (what --signal=B:USR1@120 sends before the time
    # limit), which requeues the job itself; and scontrol requeue (or a preemption), which sends SIGTERM to everything
    iterations = 40  # each stop comes right after a checkpoint (every 4 iterations): the second by iteration ~16
    job, run_dir = submit_training(iterations, "--checkpoint-every", "4")
    stops = []

    def stopped_at(info: dict[str, str]) -> list[int]:
        found = re.findall(r"fleetrl: error: stopped by SIGTERM at global step ([\d,]+)\.", slurm_cluster.job_output(info, tail=20_000))
        return [int(step.replace(",", "")) for step in found]

    for restarts, stop in enumerate([["scancel", "--signal=USR1", "--batch", job], ["scontrol", "requeue", job]]):
        wait_for_checkpoint_after(slurm_cluster, job, run_dir, stops[-1] if stops else 0)
        slurm_cluster.slurm(*stop)
        # requeued (Restarts counts up at once), and the stopped run has said where it stopped
        slurm_cluster.wait_for_job(job, ["PENDING", "RUNNING"], timeout=90,
                                   until=lambda j: j.get("Restarts") == str(restarts + 1) and len(stopped_at(j)) == restarts + 1)
        stops.append(stopped_at(slurm_cluster.job(job))[-1])
        assert (run_dir / "checkpoints" / f"ckpt_{stops[-1]:012d}.pt").exists(), "the stop wrote a checkpoint of where it stopped"
    info = slurm_cluster.wait_for_job(job, timeout=180)
    text = output(slurm_cluster, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", text[-3000:]
    assert 0 < stops[0] < stops[1] < iterations * BATCH, stops
    assert "USR1: the run writes a checkpoint" in text and "SIGTERM: the run writes a checkpoint" in text
    assert_trained_once_to(run_dir, iterations)


def test_the_docs_give_the_script_the_tests_run():
    docs = (REPO / "docs" / "distributed.md").read_text()
    block = re.search(r"```bash\n(#!/bin/bash\n# fleetrl data-parallel training on Slurm.*?)```", docs, re.S)
    assert block, "docs/distributed.md shows docs/slurm/train.sbatch"
    assert block.group(1) == TRAIN_SCRIPT.read_text(), "docs/distributed.md shows docs/slurm/train.sbatch as it is"
