"""The throwaway Slurm cluster (fleetrl/tools/minicluster.py): two nodes that are hosts of their own, and nothing left
behind when it stops."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fleetrl.tools import minicluster

from conftest import fleetrl_env, require_slurm


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
