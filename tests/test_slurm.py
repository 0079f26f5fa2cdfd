"""fleetrl on a real Slurm cluster: a throwaway one (fleetrl/tools/minicluster.py) with two nodes, each a host of its
own, running docs/slurm/train.sbatch as a user would: 2-node training, a killed node, a requeue, a preemption; and
`fleetrl benchmark --slurm` and `fleetrl tune --slurm` submitting arrays over both nodes and following them."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from fleetrl import checkpoint
from fleetrl.processes import pid_alive
from fleetrl.monitor.tbread import read_scalars
from fleetrl.tools import minicluster, minicluster_host, slurm_jobs
from fleetrl.tools.new import template
from fleetrl.tools.returns import final_return

from conftest import (assert_same_learner, fleetrl_env, killed_on_exit, postgres_server, require_module, require_slurm,
                      run_fleetrl_here, run_fleetrl_in_process, skip_unless_ci)
from fleetrl_test_envs import NO_DELAY_FILE_ENV

REPO = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO / "docs" / "slurm" / "train.sbatch"
BATCH = 4 * 128  # classic control's default batch: 4 envs (2 a rank) x 128 steps
# the same observation every step and no episode end, so a resumed run sees what an uninterrupted one sees; fp32 and
# one thread, since --precision auto and the thread plan measure and decide, and two runs could decide differently
TRAIN = ["ppo", "--env-id", "fleetrl_test_envs:Stateless-v0", "--env-backend", "sync", "--precision", "fp32", "--no-cuda", "--torch-threads", "1"]
# Stateless-v0 whose steps sleep 5 ms: an iteration (2 envs a rank x 128 steps) takes at least 1.28 s however fast the host,
# so a run stopped right after a checkpoint is stopped well before its end (plain Stateless-v0 at the 20k SPS of a fast host
# trains 24 iterations in under a second: it could end between two polls). Each start's first iteration is at full speed:
# no stop has to land in it (the stops follow a checkpoint written at its end or later)
SLOW = "fleetrl_test_envs:SlowStatelessAfter128-v0"
NO_DELAY = "no-delay"  # once this file is in the test's folder, a start of the job makes SLOW's envs without the sleep


@pytest.fixture
def submit_training(slurm_cluster, tmp_path):
    """``submit_training(iterations, *flags, env_id=...)``: docs/slurm/train.sbatch on two nodes, training ``iterations``
    iterations on ``env_id`` (Stateless-v0) into ``tmp_path/run``; returns (job id, run dir). Each job it submitted is ended
    for good as the test ends, however it ends (a requeued job waits to start again: it is cancelled too): a failed test
    leaves no job holding the nodes."""
    def submit(iterations: int, *extra: str, env_id: str = "") -> tuple[str, Path]:
        run_dir = tmp_path / "run"
        env = {**fleetrl_env(), "FLEETRL_PYTHON": sys.executable, NO_DELAY_FILE_ENV: str(tmp_path / NO_DELAY)}
        train = list(TRAIN)
        train[train.index("--env-id") + 1] = env_id or train[train.index("--env-id") + 1]
        job = slurm_cluster.submit(TRAIN_SCRIPT, *train, "--total-timesteps", str(iterations * BATCH), "--run-dir", str(run_dir),
                                   *extra, cwd=tmp_path, env=env)
        return job, run_dir

    with jobs_killed_on_exit(slurm_cluster):
        yield submit


def output(cluster: minicluster.MiniCluster, job: str) -> str:
    return cluster.job_output(cluster.job(job), tail=20_000)


def wait_for_checkpoint_after(cluster: minicluster.MiniCluster, job: str, run_dir: Path, step: int, timeout: float = 120) -> None:
    """Until the running job has written a checkpoint past global step ``step``: the folder is looked at every 0.1 s
    (the stop that follows lands right after the checkpoint), Slurm asked once a second whether the job still runs (each
    scontrol is a process start, and the host's cores train the ranks)."""
    deadline, asked = time.monotonic() + timeout, float("-inf")
    while not any(int(c.stem.split("_")[1]) > step for c in checkpoint.list_checkpoints(run_dir)):
        if time.monotonic() - asked >= 1.0:
            asked = time.monotonic()
            info = cluster.job(job)
            assert info["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {info['JobState']}:\n{output(cluster, job)}"
        assert time.monotonic() < deadline, f"no checkpoint past step {step} within {timeout} s:\n{output(cluster, job)}"
        time.sleep(0.1)


def release_requeued(cluster: minicluster.MiniCluster, job: str) -> None:
    """Let the requeued (pending) ``job`` start again 2 s from now, not after cred_expire (5 s, the least Slurm takes):
    the wait is Slurm's, the test is of what the job does when it starts again. Not at once: a start in the second its last
    credential was revoked is refused, and the job fails (seen here). A job that has already started is left as it is."""
    cluster.slurm("scontrol", "update", f"JobId={job}", "StartTime=now+2", check=False)


def assert_trained_once_to(run_dir: Path, iterations: int) -> None:
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == iterations * BATCH
    steps = [p.step for p in read_scalars(run_dir, "charts/learning_rate")]
    assert steps == [BATCH * i for i in range(1, iterations + 1)], "every iteration logged exactly once: resumed, not repeated"


def training_processes(cluster: minicluster.MiniCluster, node: str) -> list[psutil.Process]:
    """The training processes on ``node``: its torchrun launcher and the ranks under it (not Slurm's own)."""
    found = []
    for proc in minicluster_host.processes_in_netns(cluster.node(node).netns):
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
    if len(os.sched_getaffinity(0)) >= 2:  # the allocation's cores, not the machine's: a cpuset may hold one
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
            # munged and slurmctld here; on the node: slurmd, slurmstepd, the job's shell and sleep, the sleep run there.
            # `ip netns exec` enters the namespace a moment after Popen returns, so wait for all seven (CI once saw six)
            deadline = time.monotonic() + 20
            while True:
                procs = [psutil.Process(pid) for pid in cluster.pids.values()] + minicluster_host.processes_in_netns(cluster.nodes[0].netns)
                if len(procs) >= 7 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert len(procs) >= 7, procs
            raise RuntimeError("the test's own failure")
    on_node.wait(timeout=10)
    assert not [p for p in procs if pid_alive(p.pid, p.create_time())], "every process of the cluster ended"
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
        skip_unless_ci("cannot make a user namespace here to run as a non-root user (unshare --user)")
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
@pytest.mark.timeout(500)
def test_a_two_node_job_stopped_by_usr1_a_requeue_and_a_killed_node_resumes_each_time_and_ends_bit_identical_to_one_node(
        slurm_cluster, submit_training, tmp_path):
    # One job through every way a job stops, each start resuming where the last left off (its four starts are the cost:
    # each start brings up torchrun and a rank on both nodes). Each stop comes right after a checkpoint (every 2
    # iterations), the last by iteration ~6: the 6 iterations left take over 7 s, so no stop can land after the end.
    iterations = 12
    job, run_dir = submit_training(iterations, "--checkpoint-every", "2", "--torch-deterministic", env_id=SLOW)
    # what it must end as: two processes on one node trained uninterrupted, beside the job (which mostly waits). Stateless-v0
    # is SLOW without its sleep: the same observations and rewards. Started once the job trains: its start, like each of the
    # job's, is mostly imports of torch, and the two would share the cores
    local_dir, local = tmp_path / "one-node", []
    with contextlib.ExitStack() as stack:
        def start_reference() -> None:
            local.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fleetrl", "train", *TRAIN,
                 "--total-timesteps", str(iterations * BATCH), "--run-dir", str(local_dir), "--torch-deterministic"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=fleetrl_env(), start_new_session=True))
            stack.enter_context(killed_on_exit(local[0]))

        stopped_by_and_resumed(slurm_cluster, job, run_dir, iterations, start_reference)
        local_stderr = local[0].communicate(timeout=180)[1]
    assert local[0].returncode == 0, local_stderr[-3000:]
    assert_same_learner(checkpoint.load_checkpoint(run_dir), checkpoint.load_checkpoint(local_dir))


def stopped_by_and_resumed(slurm_cluster: minicluster.MiniCluster, job: str, run_dir: Path, iterations: int,
                           once_training: Callable[[], None]) -> None:
    """The job of the test above through its four starts, and what each start and stop must leave; ``once_training()``
    is called as the first start's first stop is sent (the job has come up and trains)."""
    stops = []

    def stopped_at(info: dict[str, str]) -> list[int]:
        found = re.findall(r"fleetrl: error: stopped by SIGTERM at global step ([\d,]+)\.", slurm_cluster.job_output(info, tail=20_000))
        return [int(step.replace(",", "")) for step in found]

    # 1 and 2, the two ways a job is stopped for later: USR1 to the batch script (what --signal=B:USR1@120 sends before the
    # time limit), which requeues the job itself; and scontrol requeue (or a preemption), which sends SIGTERM to everything
    for restarts, stop in enumerate([["scancel", "--signal=USR1", "--batch", job], ["scontrol", "requeue", job]]):
        wait_for_checkpoint_after(slurm_cluster, job, run_dir, stops[-1] if stops else 0)
        slurm_cluster.slurm(*stop)
        if not stops:
            once_training()
        # requeued (Restarts counts up at once), and the stopped run has said where it stopped
        slurm_cluster.wait_for_job(job, ["PENDING", "RUNNING"], timeout=90,
                                   until=lambda j: j.get("Restarts") == str(restarts + 1) and len(stopped_at(j)) == restarts + 1)
        stops.append(stopped_at(slurm_cluster.job(job))[-1])
        release_requeued(slurm_cluster, job)
        assert (run_dir / "checkpoints" / f"ckpt_{stops[-1]:012d}.pt").exists(), "the stop wrote a checkpoint of where it stopped"

    # 3: node2's training vanishes, launcher and rank, with no goodbye: the job ends with fleetrl's message
    wait_for_checkpoint_after(slurm_cluster, job, run_dir, stops[-1])
    victims = training_processes(slurm_cluster, "node2")
    assert victims, "node2 runs a torchrun launcher and its rank"
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    info = slurm_cluster.wait_for_job(job, timeout=90)
    ended_after = time.monotonic() - killed_at
    text = output(slurm_cluster, job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "2", text[-3000:]
    assert ended_after < 30, f"the job took {ended_after:.0f} s to end"
    # the surviving rank (on node1; rank 0 or 1, as the rendezvous numbered them) says what happened and what to do
    assert re.search(r"fleetrl: error: Rank \d lost the other ranks.*--resume auto", text), text[-3000:]
    killed_with = int(checkpoint.load_checkpoint(run_dir)["global_step"])
    assert stops[-1] < killed_with < iterations * BATCH

    # 4: a requeue (the script resumes with --resume auto) trains to the total; at full speed, since no stop has to land
    # in this start (the same steps, without the sleep)
    (run_dir.parent / NO_DELAY).touch()
    slurm_cluster.slurm("scontrol", "requeue", job)
    slurm_cluster.wait_for_job(job, ["PENDING", "RUNNING"], timeout=30)
    release_requeued(slurm_cluster, job)
    info = slurm_cluster.wait_for_job(job, timeout=180, until=lambda j: j.get("Restarts") == "3")
    text = output(slurm_cluster, job)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert info["NodeList"] == "node[1-2]" and info["NumNodes"] == "2"
    assert "rendezvous at node1:" in text and "replicas in sync: 2 ranks hold bit-identical parameters" in text, text[-3000:]
    assert 0 < stops[0] < stops[1] < killed_with, stops
    assert "USR1: the run writes a checkpoint" in text and "SIGTERM: the run writes a checkpoint" in text
    assert_trained_once_to(run_dir, iterations)


def test_the_docs_give_the_script_the_tests_run():
    docs = (REPO / "docs" / "distributed.md").read_text()
    block = re.search(r"```bash\n(#!/bin/bash\n# fleetrl data-parallel training on Slurm.*?)```", docs, re.S)
    assert block, "docs/distributed.md shows docs/slurm/train.sbatch"
    assert block.group(1) == TRAIN_SCRIPT.read_text(), "docs/distributed.md shows docs/slurm/train.sbatch as it is"


# ---- fleetrl benchmark and fleetrl tune submit arrays ------------------------------------------------------------

# CartPole in one iteration of 4 envs x 128 steps. The backend, precision and threads are fixed: auto measures and
# decides, and a 1-CPU task and a process on the whole machine could decide differently (the benchmark gives each run
# --torch-threads: 1 here, from --workers 2 on 2 cores, and on Slurm from --slurm-cpus-per-task 1)
BENCH_TRAIN = ["fleetrl", "train", "ppo", "--total-timesteps", "512", "--num-envs", "4", "--num-steps", "128", "--env-backend", "sync",
               "--precision", "fp32", "--no-progress"]
# two runs: one task on each node at once (each node has a core of its own, and a task asks for one)
BENCH_GRID = ["--env-ids", "CartPole-v1", "CartPole-v0", "--num-seeds", "1"]
BENCH_RUNS = ("CartPole-v1__1", "CartPole-v0__1")


def queued_jobs(cluster: minicluster.MiniCluster) -> set[str]:
    """The jobs (an array counts once, by its job id) that wait, run or are completing on the cluster."""
    return set(cluster.slurm("squeue", "--noheader", "--format=%F").split())


def kill_arrays(cluster: minicluster.MiniCluster, jobs: set[str], timeout: float = 60) -> None:
    """End the jobs (or arrays) for good: cancel what waits, so that none starts, and SIGKILL what runs (scancel
    --signal alone cancels nothing pending); again until squeue lists none of them, since a job caught between a
    requeue and its next start is neither (~2 s; a finished job: Slurm only says so)."""
    deadline = time.monotonic() + timeout
    while jobs := jobs & queued_jobs(cluster):
        assert time.monotonic() < deadline, f"jobs {sorted(jobs)} still queued {timeout:g} s after they were cancelled"
        for job in jobs:
            cluster.slurm("scancel", "--state=PENDING", job, check=False)
            cluster.slurm("scancel", "--signal=KILL", job, check=False)
        time.sleep(0.5)


@contextlib.contextmanager
def jobs_killed_on_exit(cluster: minicluster.MiniCluster):
    """Every job submitted while the block runs (through fleetrl's CLI too, whose job ids the test may never see) is
    ended for good as the block ends, however it ends: a failed test leaves no job holding the shared cluster's nodes."""
    before = queued_jobs(cluster)
    try:
        yield
    finally:
        kill_arrays(cluster, queued_jobs(cluster) - before)


@pytest.fixture
def own_jobs_killed(slurm_cluster):
    with jobs_killed_on_exit(slurm_cluster):
        yield


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_a_test_failing_right_after_a_requeue_leaves_the_cluster_empty(slurm_cluster, tmp_path):
    # a requeued job waits (cred_expire) before it starts again: SIGKILL does not reach it, and it would then hold the
    # nodes through every later test
    with pytest.raises(RuntimeError, match="the test's own failure"):
        with jobs_killed_on_exit(slurm_cluster):
            job = slurm_cluster.submit(_script(tmp_path, "sleep 600"), sbatch=["--requeue", "--nodes=2"], cwd=tmp_path)
            slurm_cluster.wait_for_job(job, ["RUNNING"], timeout=60)
            slurm_cluster.slurm("scontrol", "requeue", job)
            raise RuntimeError("the test's own failure")
    assert not queued_jobs(slurm_cluster), slurm_cluster.slurm("squeue")
    # cancelled for good, not waiting out its requeue delay to start again: Slurm never starts a finished job on its own
    info = slurm_cluster.job(job)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "1", info


@pytest.fixture(scope="module")
def benchmark_both_ways(slurm_cluster, tmp_path_factory):
    """The same 2-run grid (2 envs x 1 seed) by `fleetrl benchmark --slurm` on the cluster and by a local pool of two
    workers, at the same time (each is mostly process starts); returns {"slurm"|"local": (result, output, out folder,
    seconds)}. The array trains a user's own copy of PPO (`fleetrl new my_ppo --from ppo`, `fleetrl train ./my_ppo.py`), the
    local pool the built-in: the same code, so the same returns. The command that submits and follows the array runs in
    this process (its tasks are processes on the nodes, and get this environment as sbatch passes it on); the local pool
    is a process beside it."""
    root = tmp_path_factory.mktemp("benchmark")
    (root / "my_ppo.py").write_text(template("ppo", "my_ppo"))
    env = slurm_cluster.env(fleetrl_env())
    began = time.monotonic()
    # its array is ended for good however the fixture ends, before its yield too (a benchmark that timed out)
    with jobs_killed_on_exit(slurm_cluster):
        local = subprocess.Popen([sys.executable, "-m", "fleetrl", "benchmark", *BENCH_GRID, "--out", str(root / "local"), "--workers",
                                  "2", "--", *BENCH_TRAIN], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=root, start_new_session=True)
        with killed_on_exit(local):
            with pytest.MonkeyPatch.context() as here:
                for name, value in env.items():
                    if os.environ.get(name) != value:
                        here.setenv(name, value)
                slurm = run_fleetrl_here("benchmark", *BENCH_GRID, "--out", str(root / "slurm"), "--slurm", "--", "fleetrl", "train",
                                         "./my_ppo.py", *BENCH_TRAIN[3:], cwd=root)
            done = {"slurm": (slurm, slurm.stdout + slurm.stderr, root / "slurm", round(time.monotonic() - began, 1))}
            output = local.communicate(timeout=300)[0]
            done["local"] = (local, output, root / "local", round(time.monotonic() - began, 1))
        yield done


def summary_without_wall_times(out: Path) -> list[dict]:
    with open(out / "summary.csv") as f:
        return [{k: v for k, v in row.items() if not k.startswith("wall")} for row in csv.DictReader(f)]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_benchmark_array_on_the_two_nodes_summarises_exactly_as_a_local_run_of_the_same_seeds(benchmark_both_ways):
    (proc, output, out, took), (local, local_output, local_out, _) = benchmark_both_ways["slurm"], benchmark_both_ways["local"]
    print(f"benchmark array of {len(BENCH_RUNS)} tasks (and the local pool beside it): {took} s")
    assert proc.returncode == 0, output
    assert local.returncode == 0, local_output
    # the live view: each task's end, and the array's counts. A task shorter than the 2 s poll can go from PENDING to
    # COMPLETED between two polls, so RUNNING is only checked where it was seen (the next test's tasks wait, and show it):
    # before the end, on the node the task ended on. Each task says itself that it ran: its Slurm output names its run
    job = json.loads((out / "benchmark.slurm.json").read_text())["job_id"]
    for task in range(len(BENCH_RUNS)):
        label = rf"task {job}_{task} \((CartPole-v[01]) seed (1)\)"
        (completed,) = re.finditer(rf"{label}: COMPLETED on (node[12])", output)
        for running in re.finditer(rf"{label}: RUNNING on (node[12])", output):
            assert running.start() < completed.start() and running.group(3) == completed.group(3), output
        env_id, seed, _node = completed.groups()
        said = (out / "logs" / f"slurm_{job}_{task}.out").read_text()
        assert f"{env_id} seed {seed}: exit code 0 after" in said, said
    assert f"array {job}: {len(BENCH_RUNS)} COMPLETED" in output
    assert set(re.findall(r"COMPLETED on (node\d)", output)) == {"node1", "node2"}, "the tasks ran on both nodes"
    # collected as a local run collects them: the same summary, and the same final return for every run
    assert "| CartPole-v1 |" in output and "summary: " in output
    assert summary_without_wall_times(out) == summary_without_wall_times(local_out)
    for run in BENCH_RUNS:
        assert final_return(out / run) == final_return(local_out / run) is not None, run
        assert json.loads((out / "status" / f"{run}.json").read_text())["ok"] is True


@pytest.mark.slurm
@pytest.mark.slow
def test_a_one_cpu_slurm_task_plans_its_threads_for_one_core(benchmark_both_ways, slurm_cluster):
    """Cores from Slurm: each array task asked for 1 CPU (--slurm-cpus-per-task 1), and Slurm's affinity binding (each
    mini cluster node has one core of its own here) reaches the thread plan that the task's fleetrl run prints."""
    _, output, out, _ = benchmark_both_ways["slurm"]
    per_core = minicluster._hardware().get("ThreadsPerCore", 1)  # Slurm hands out whole cores: 1 CPU is 1 core, its hyperthreads too
    machine = os.cpu_count()
    for log in sorted((out / "logs").glob("CartPole-*.log")):
        plan = next((line for line in log.read_text().splitlines() if line.startswith("threads on")), None)
        assert plan is not None, log.read_text()[-2000:]
        expected = f"threads on {per_core} core{'s' if per_core > 1 else ''}"
        expected += f" (affinity mask {per_core} of the machine's {machine})" if per_core != machine else ""
        assert plan.startswith(expected + ":"), f"{log.name}: {plan}"
        assert "torch 1 (--torch-threads)" in plan, plan  # the task's thread count: its SLURM_CPUS_PER_TASK


# a run that says where it started; Bad-v0 fails at once; the others wait, Finishes-v0 until OUT/go exists, Waits-v0
# until SIGTERM, and say so
FAKE_RUN = [sys.executable, "-c", """import os, signal, socket, sys, time
args = sys.argv[1:]
env_id, run_dir = args[args.index("--env-id") + 1], args[args.index("--run-dir") + 1]
print("started", env_id, "on", socket.gethostname(), flush=True)
if env_id == "Bad-v0":
    print("this env is bad: giving up", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM: stopping", flush=True), sys.exit(143)))
go = os.path.join(os.path.dirname(run_dir), "go")
while not (env_id == "Finishes-v0" and os.path.exists(go)):
    time.sleep(0.1)
"""]


class OutputSoFar:
    """A process's output (stdout, with stderr in it) read on a thread as it comes, so a test can wait for a line of it
    while the process runs."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> str:
        """The whole output, once the process has ended."""
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=timeout)
        return self.text()


def wait_until(condition, timeout: float, what: str, output_of: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert output_of is None or output_of.poll() is None, f"exited ({output_of.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_benchmark_tasks_fail_with_their_exit_code_and_log_a_requeue_keeps_the_log_and_scancel_or_ctrl_c_cancels(
        slurm_cluster, own_jobs_killed, tmp_path):
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "fleetrl", "benchmark", "--env-ids", "Bad-v0", "Finishes-v0", "Waits-v0", "--num-seeds", "1",
            "--out", str(out), "--slurm", "--", *FAKE_RUN]
    env = slurm_cluster.env(fleetrl_env())

    def state(task: int) -> dict[str, str]:
        return slurm_jobs.array_tasks(job, env).get(task, {})

    def log(name: str) -> list[str]:
        """The lines of the run's log (its first lines are the command, the fake run's code among them)."""
        path = out / "logs" / f"{name}__1.log"
        return path.read_text().splitlines() if path.exists() else []

    def said(name: str, start: str) -> list[int]:
        """Where the run's log has lines that start so."""
        return [i for i, line in enumerate(log(name)) if line.startswith(start)]

    follower = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    live = OutputSoFar(follower)
    with killed_on_exit(follower):
        wait_until(lambda: (out / "benchmark.slurm.json").exists(), 60, "the array's submission", follower)
        job = json.loads((out / "benchmark.slurm.json").read_text())["job_id"]
        # task 0 (Bad-v0) fails; then the others run, one on each node, and wait: long enough for the live view to show them
        # running (the benchmark test's tasks may end between two of its polls)
        wait_until(lambda: said("Finishes-v0", "started Finishes-v0") and said("Waits-v0", "started Waits-v0"), 60,
                   "both waiting runs to start", follower)
        assert state(0)["JobState"] == "FAILED"
        wait_until(lambda: all(re.search(rf"task {job}_{task} \({name} seed 1\): RUNNING on node[12]", live.text())
                               for task, name in ((1, "Finishes-v0"), (2, "Waits-v0"))), 60, "the live view to show both running", follower)
        # a requeue (as a preemption does): SIGTERM, and the task runs again after cred_expire, its log kept
        slurm_cluster.slurm("scontrol", "requeue", f"{job}_1")
        # once the live view has shown it waiting to start again, it may start 2 s on, not after cred_expire
        wait_until(lambda: re.search(rf"task {job}_1 \(Finishes-v0 seed 1\): PENDING.*requeued 1x", live.text()), 60,
                   "the live view to show the task requeued", follower)
        release_requeued(slurm_cluster, f"{job}_1")
        wait_until(lambda: len(said("Finishes-v0", "started Finishes-v0")) == 2, 60, "the requeued task to start again", follower)
        # a plain scancel ends a task for good: the script's SIGTERM trap no longer requeues it
        slurm_cluster.slurm("scancel", f"{job}_2")
        (out / "go").touch()
        output = live.wait(timeout=60)
    assert follower.returncode == 1, output
    assert state(1)["JobState"] == "COMPLETED" and state(1)["Restarts"] == "1"
    assert state(2)["JobState"] == "CANCELLED" and state(2)["Restarts"] == "0", "scancel cancelled the task, not requeued it"
    # the requeued task's log: its first start, stopped by the requeue's SIGTERM, then its second start, appended
    starts, stopped, again = said("Finishes-v0", "started Finishes-v0"), said("Finishes-v0", "SIGTERM: stopping"), \
        said("Finishes-v0", "--- ")
    assert len(starts) == 2 and len(stopped) == 1 and starts[0] < stopped[0] < again[0] < starts[1], log("Finishes-v0")
    assert "requeued: start 2 of this task" in log("Finishes-v0")[again[0]]
    assert any("SIGTERM (scancel, scontrol requeue or a preemption): the run writes a checkpoint" in line for line in log("Finishes-v0"))
    assert said("Waits-v0", "SIGTERM: stopping")
    # the live view said what happened to each task; the failed ones are reported with their exit code and log tail
    assert re.search(rf"task {job}_0 \(Bad-v0 seed 1\): FAILED: exit code 3 on node[12]", output), output
    assert re.search(rf"task {job}_1 \(Finishes-v0 seed 1\): PENDING.*requeued 1x", output), output
    assert re.search(rf"task {job}_2 \(Waits-v0 seed 1\): CANCELLED on node[12]", output), output
    assert re.search(rf"FAILED Bad-v0 seed 1: exit code 3 on node[12] \(Slurm task {job}_0\)", output), output
    assert "  | this env is bad: giving up" in output
    assert "2 of 3 runs failed" in output and "Traceback" not in output

    # the same command again submits what did not finish; Ctrl-C cancels that array, and nothing of it stays queued
    follower = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    with killed_on_exit(follower):
        wait_until(lambda: json.loads((out / "benchmark.slurm.json").read_text())["job_id"] != job, 60, "the second array", follower)
        job = json.loads((out / "benchmark.slurm.json").read_text())["job_id"]
        # its first start begins the run's log afresh
        wait_until(lambda: said("Waits-v0", "started Waits-v0") and not said("Waits-v0", "SIGTERM: stopping"), 60,
                   "the waiting run to start again", follower)
        follower.send_signal(signal.SIGINT)
        output = follower.communicate(timeout=90)[0]
    assert follower.returncode == 130, output
    assert "skipped Finishes-v0 seed 1: finished in an earlier call" in output
    assert f"stopping: cancelling the array {job}" in output and f"the Slurm array {job} was cancelled" in output
    assert state(1) == {} or state(1)["JobState"] == "CANCELLED"  # task 1 was not submitted this time
    assert state(2)["JobState"] == "CANCELLED" and state(2)["Restarts"] == "0"
    assert not slurm_cluster.slurm("squeue", "--noheader", f"--jobs={job}"), "no task of the array is left queued or running"


def test_slurm_flags_are_one_clear_error_where_no_slurm_answers(tmp_path, monkeypatch):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    tools = {"benchmark": ["benchmark", "--env-ids", "CartPole-v1", "--out", str(tmp_path / "b"), "--slurm", "--", "true"],
             "tune": ["tune", "--env-ids", "CartPole-v1", "--search", str(space), "--out", str(tmp_path / "t"), "--slurm", "--",
                      "fleetrl", "train", "ppo"]}
    for tool, argv in tools.items():
        with monkeypatch.context() as no_path:
            no_path.setenv("PATH", "/nonexistent")
            no_slurm = run_fleetrl_in_process(*argv)
        assert no_slurm.returncode == 2 and no_slurm.stderr.startswith("fleetrl: error: No Slurm here: sbatch"), no_slurm.stderr
        assert "--slurm-template" in no_slurm.stderr and len(no_slurm.stderr.strip().splitlines()) == 1, no_slurm.stderr
        if tool == "benchmark" and shutil.which("scontrol"):  # Slurm's commands, but a configuration that is missing, or names no
            # running controller (one check for both tools: slurm_jobs.check_reachable)
            dead = tmp_path / "dead.conf"
            dead.write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\nNodeName=n1 CPUs=1\n"
                            "PartitionName=p Nodes=n1\n")
            for conf, said in ((tmp_path / "no-such.conf", "which is not a file"), (dead, "Slurm's controller does not answer here")):
                with monkeypatch.context() as elsewhere:
                    elsewhere.setenv("SLURM_CONF", str(conf))
                    no_cluster = run_fleetrl_in_process(*argv)
                assert no_cluster.returncode == 2 and said in no_cluster.stderr, no_cluster.stderr
                assert "Traceback" not in no_cluster.stderr and len(no_cluster.stderr.strip().splitlines()) == 1, no_cluster.stderr
        assert not list(tmp_path.glob("*/*.slurm")), "refused before anything was written or submitted"


SPACE = "learning-rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\n"


def test_slurm_scripts_are_their_owners_alone_and_no_flag_puts_a_line_break_into_their_header(tmp_path):
    require_module("optuna", "tune")
    (tmp_path / "space.yaml").write_text(SPACE)
    bench = ["benchmark", "--env-ids", "CartPole-v1", "--slurm-template"]
    tune = ["tune", "--env-ids", "CartPole-v1", "--search", str(tmp_path / "space.yaml"), "--slurm-template"]
    train = ["--", "fleetrl", "train", "ppo"]
    for tool, argv in (("benchmark", bench), ("tune", tune)):
        out = tmp_path / tool
        out.mkdir()
        (out / f"{tool}.slurm").write_text("an earlier call's script\n")
        (out / f"{tool}.slurm").chmod(0o755)
        made = run_fleetrl_in_process(*argv, "--out", str(out), *train)
        assert made.returncode == 0, made.stderr
        assert oct(stat.S_IMODE((out / f"{tool}.slurm").stat().st_mode)) == oct(0o700), "sbatch reads it as its owner; no one else may"
        assert subprocess.run(["bash", "-n", str(out / f"{tool}.slurm")]).returncode == 0
    # a line break in a comment or #SBATCH line would end it there and run the rest as a command
    for argv in ([*bench, "--out", str(tmp_path / "x\ntouch INJECTED")], [*tune, "--out", str(tmp_path / "x\ntouch INJECTED")],
                 [*tune, "--out", str(tmp_path / "named"), "--study-name", "a\ntouch INJECTED"]):
        refused = run_fleetrl_in_process(*argv, *train)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "its line break would end that line and run the rest as a shell command" in " ".join(refused.stderr.split()), refused.stderr
        assert "\\ntouch INJECTED" in refused.stderr, "the message shows the text with its line break"
        assert len(list(tmp_path.glob("*/*.slurm"))) == 2, "no script written besides the two above"


def test_tune_on_slurm_refuses_a_storage_url_with_a_password_and_names_where_libpq_reads_one(tmp_path):
    require_module("optuna", "tune")
    (tmp_path / "space.yaml").write_text(SPACE)
    for flag in ("--slurm", "--slurm-template"):  # the script and every task's command line would carry it
        proc = run_fleetrl_in_process("tune", "--env-ids", "CartPole-v1", "--search", str(tmp_path / "space.yaml"), "--out",
                                      str(tmp_path / "out"), "--storage", "postgresql://tuner:s3cret@10.0.0.5:5432/study", flag, "--",
                                      "fleetrl", "train", "ppo")
        text = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "carries a password" in text and "PGPASSWORD" in text and "~/.pgpass" in text, text
        assert "://tuner@10.0.0.5:5432/study" in text and "s3cret" not in proc.stdout + proc.stderr, text
    assert not list((tmp_path / "out").glob("*.slurm")), "no script written"


@pytest.mark.slurm
def test_an_array_record_without_a_job_id_is_one_paragraph(slurm_cluster, tmp_path, monkeypatch):
    out = tmp_path / "bench"
    out.mkdir()
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    for record in ({"tasks": {"0": "CartPole-v1 seed 1"}}, ["12"], {"job_id": "--help"}):  # another version's, or edited
        (out / "benchmark.slurm.json").write_text(json.dumps(record))
        proc = run_fleetrl_in_process("benchmark", "--env-ids", "CartPole-v1", "--out", str(out), "--slurm", "--", "true")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "is not a record of a Slurm array" in proc.stderr and "squeue --me" in proc.stderr, proc.stderr
    assert not (out / "benchmark.slurm").exists(), "nothing submitted"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_tune_array_of_two_tuners_over_both_nodes_records_exactly_the_studys_three_trials_in_postgresql_on_the_bridge(
        slurm_cluster, own_jobs_killed, child_env, tmp_path, monkeypatch):
    optuna = require_module("optuna", "tune")
    from sqlalchemy.engine import make_url

    from fleetrl.tools.tune.storage import open_storage, parse_storage

    space = tmp_path / "space.yaml"
    space.write_text("learning-rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\nupdate-epochs: {type: int, low: 2, high: 4}\n")
    bridge = slurm_cluster.controller_address  # this machine's address on the nodes' network: the server listens there only
    with postgres_server(bridge, clients=f"{bridge.rsplit('.', 1)[0]}.0/24") as url:
        # a server's password goes to the tasks as libpq reads it, in PGPASSWORD (sbatch passes the environment on),
        # never in the script or a command line
        password = make_url(url).password
        url = make_url(url)._replace(password=None).render_as_string(hide_password=False)  # URL.set ignores None
        if password:
            monkeypatch.setenv("PGPASSWORD", password)
        began = time.monotonic()
        (tmp_path / "my_ppo.py").write_text(template("ppo", "my_ppo"))  # a user's own algorithm file, tuned on the nodes
        # 3 trials for 2 tuners: a count kept by each tuner would make 4 or 6. A trial is 2 iterations of 2 envs x 128 steps.
        # The command that submits and follows runs in this process (the tuners and trials are processes on the nodes);
        # its tasks get this environment, as sbatch passes it on
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        proc = run_fleetrl_here("tune", "--env-ids", "CartPole-v1", "--search", str(space), "--study-name", "across", "--trials", "3",
                                "--storage", url, "--out", str(tmp_path / "out"), "--slurm", "--slurm-workers", "2",
                                "--slurm-cpus-per-task", "1", "--", "fleetrl", "train", "./my_ppo.py", "--total-timesteps", "512",
                                "--num-envs", "2", "--num-steps", "128", "--env-backend", "sync", cwd=tmp_path)
        print(f"tune array of 2 tuners, 3 trials: {time.monotonic() - began:.1f} s")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not password or password not in (tmp_path / "out" / "tune.slurm").read_text()
        study = optuna.load_study(study_name="across", storage=open_storage(parse_storage(url), stale_after=600))
        trials = study.get_trials(deepcopy=False)
    assert f"://postgres@{bridge}:" in url and not bridge.startswith("127.")
    assert sorted(t.number for t in trials) == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in trials)
    assert {t.user_attrs["host"] for t in trials} == {"node1", "node2"}, "the tuners on both nodes ran trials"
    for task in (0, 1):
        assert re.search(rf"task \d+_{task} \(tuner worker {task}\): RUNNING on node[12]", proc.stdout), proc.stdout
        assert re.search(rf"task \d+_{task} \(tuner worker {task}\): COMPLETED on node[12]", proc.stdout), proc.stdout
    assert "trials 3/3 done: 3 complete" in proc.stdout and "fleetrl tune: study 'across': 3 trials (3 complete" in proc.stdout
