"""The learner process (``--policy-lag 1``): updates run in a process of their own on another core, never forked from the
trainer, acting follows one update behind, checkpoints hold the learner's state, and neither a kill nor a signal loses or
orphans anything."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import torch
from torch import nn

from fleetrl import checkpoint
from fleetrl.algos import dqn
from fleetrl.errors import FleetError
from fleetrl.learner import PROCESS_NAME, Learner
from fleetrl.monitor.tbread import read_scalars

from conftest import dqn_updates_made, fleetrl_env, killed_on_exit, run_fleetrl_in_process, start_fleetrl_group, wait_for_checkpoint

CARTPOLE = ["--env-id", "CartPole-v1", "--no-cuda"]
LAGGED = [*CARTPOLE, "--learning-starts", "1000", "--buffer-size", "2000", "--policy-lag", "1", "--no-progress"]


def counter_learner(lag: int):
    """A learner whose one update adds its argument to a single weight, so every value says which updates happened."""
    net = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        net.weight.zero_()

    def bump(amount: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            net.weight.add_(amount)
        return {"weight": net.weight.sum()}

    def fail(kind: str) -> None:
        raise FleetError("a clear problem") if kind == "fleet" else ValueError("an update bug")

    return net, bump, fail, Learner([bump, fail], acting=net, owned={"net": net}, lag=lag, device="cpu")


def learner_processes(pid: int) -> list[psutil.Process]:
    """The learner processes under ``pid``, by name: the forkserver forks them, so they are not its direct children."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name() == PROCESS_NAME:
                found.append(child)
    return found


def adam_learner(lag: int):
    """A learner whose update is an Adam step of a small network: the optimiser must step the network that acts."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = net(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    return net, optimizer, step, Learner([step], acting=net, owned={"net": net, "optimizer": optimizer}, lag=lag, device="cpu")


# ------------------------------------------------------------------------------------------ the engine piece
def test_lag_0_runs_each_update_here_and_returns_its_result():
    net, bump, _, learner = counter_learner(lag=0)
    assert learner(bump, torch.ones(1, 1))["weight"].item() == 1.0 and net.weight.item() == 1.0
    learner.close()


def test_lag_1_acts_one_update_behind_and_sync_fetches_the_learners_state():
    net, bump, _, learner = counter_learner(lag=1)
    try:
        for k in range(1, 6):
            result = learner(bump, torch.ones(1, 1))
            assert net.weight.item() == k - 1, "after call k, acting holds the weights of update k - 1"
            assert result == ({} if k == 1 else {"weight": float(k - 1)}), "a call returns the previous call's result, as floats"
        assert learner_processes(os.getpid()) == [psutil.Process(learner._process.pid)], "the updates run in the learner process"
        learner.sync()
        assert net.weight.item() == 5.0, "sync waits for the last update and fetches the learner's state"
        assert learner(bump, torch.full((1, 1), 2.0))["weight"] == 5.0
    finally:
        learner.close()
    assert learner._process is None


# run in a fresh interpreter: in the test process a forkserver that earlier tests started would already be there, and
# a learner forked by it would pass without this start ever being checked
FRESH_LEARNER = """
import json, os, threading, psutil, torch
from torch import nn
from fleetrl.learner import PROCESS_NAME, Learner

def fork():
    raise AssertionError("the trainer runs threads (monitoring, TensorBoard, OpenMP): a fork of it can deadlock the child")

def where():
    return {"pid": os.getpid()}

stop = threading.Event()
busy = threading.Thread(target=stop.wait, daemon=True)  # the trainer is multi-threaded when the learner starts
busy.start()
torch.ones(256, 256) @ torch.ones(256, 256)  # and OpenMP's pool has run
os.fork = fork
learner = Learner([where], acting=nn.Linear(1, 1), owned={}, lag=1, device="cpu")
try:
    learner(where)
    ran_in = learner(where)["pid"]  # the first call's result comes with the second
    process = psutil.Process(learner._process.pid)
    server = process.parent()
    print(json.dumps({"me": os.getpid(), "threads": threading.active_count(), "ran_in": ran_in, "learner": process.pid,
                      "name": process.name(), "parent": server.pid, "grandparent": server.ppid(),
                      "parent_cmdline": " ".join(server.cmdline())}))
finally:
    learner.close()
    stop.set()
"""


def test_the_learner_process_is_started_without_forking_this_multi_threaded_process():
    proc = subprocess.run([sys.executable, "-c", FRESH_LEARNER], capture_output=True, text=True, timeout=120, env=fleetrl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["threads"] >= 2
    assert seen["ran_in"] == seen["learner"] != seen["me"] and seen["name"] == PROCESS_NAME
    # forked by a forkserver this trainer started (its child), not by the trainer itself
    assert seen["parent"] != seen["me"] and seen["grandparent"] == seen["me"], seen
    assert "forkserver" in seen["parent_cmdline"], seen


def test_lag_1_makes_the_same_updates_as_lag_0_one_call_late_and_the_optimiser_steps_the_acting_network():
    batches = [torch.randn(8, 3, generator=torch.Generator().manual_seed(k)) for k in range(6)]
    ends = []
    for lag in (0, 1):
        net, optimizer, step, learner = adam_learner(lag)
        try:
            before = net.weight.detach().clone()
            for batch in batches:
                learner(step, batch)
            if lag:
                assert not torch.equal(net.weight, before), "acting follows the learner's updates"
            learner.sync()
        finally:
            learner.close()
        ends.append((net.state_dict(), optimizer.state_dict()["state"]))
    (net0, adam0), (net1, adam1) = ends
    for name in net0:
        assert torch.equal(net0[name], net1[name]), f"{name} differs: the learner stepped a network other than the acting one"
    assert {int(s["step"]) for s in adam1.values()} == {len(batches)} and all(torch.equal(adam0[k]["exp_avg"], adam1[k]["exp_avg"]) for k in adam0)


@pytest.mark.parametrize("kind", ["fleet", "bug"])
def test_an_update_that_fails_in_the_learner_raises_here_with_its_message(kind):
    _, bump, fail, learner = counter_learner(lag=1)
    try:
        learner(bump, torch.ones(1, 1))
        learner(fail, kind)
        with pytest.raises(FleetError if kind == "fleet" else RuntimeError) as raised:
            learner(bump, torch.ones(1, 1))
        assert ("a clear problem" if kind == "fleet" else "ValueError: an update bug") in str(raised.value)
    finally:
        learner.close()


def test_a_killed_learner_process_stops_the_run_with_a_clear_error():
    _, bump, _, learner = counter_learner(lag=1)
    try:
        learner(bump, torch.ones(1, 1))
        learner._process.kill()
        learner._process.join()
        with pytest.raises(FleetError, match="killed by signal 9.*--resume auto"):
            learner(bump, torch.ones(1, 1))
            learner(bump, torch.ones(1, 1))
    finally:
        learner.close()


def test_a_learner_that_never_answers_ends_the_wait_in_one_paragraph_and_is_killed():
    net, bump, _, _unused = counter_learner(lag=0)

    def hang(_: None) -> None:
        time.sleep(3600)  # a deadlocked update: the process stays alive and never answers

    learner = Learner([bump, hang], acting=net, owned={"net": net}, lag=1, device="cpu")
    try:
        learner(bump, torch.ones(1, 1))
        learner.sync()  # booted and answering (under the default timeout, however loaded the machine)
        learner.answer_timeout = 1.0
        learner(hang, None)
        began = time.monotonic()
        with pytest.raises(FleetError) as raised:
            learner(bump, torch.ones(1, 1))
        assert time.monotonic() - began < 30, "the wait is bounded by its timeout (a generous guard for a loaded machine)"
        said = str(raised.value)
        assert "\n" not in said and "gave no answer within 1 s" in said and "--resume auto" in said, said
        assert not learner._process.is_alive(), "the hung learner is killed, so closing the run does not wait for it"
    finally:
        learner.close()


def test_bad_policy_lags_are_refused_before_anything_runs(tmp_path):
    proc = run_fleetrl_in_process("train", "dqn", *CARTPOLE, "--policy-lag", "2", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "--policy-lag must be in [0, 1] (0: every step acts" in proc.stderr, proc.stderr
    args = dqn.Args(env_id="CartPole-v1", policy_lag=1, total_timesteps=500_000, learning_rate=2.5e-4, num_envs=2, buffer_size=10_000,
                    tau=1.0, target_network_frequency=500, batch_size=128, end_e=0.05, exploration_fraction=0.5, learning_starts=10_000,
                    train_frequency=10)
    with pytest.raises(FleetError, match="under torchrun.*Leave out --policy-lag"):
        dqn.validate(args, world_size=2)


# ------------------------------------------------------------------------------------------ DQN with --policy-lag 1
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lagged_run_is_deterministic_for_a_seed_and_its_checkpoint_holds_every_update(tmp_path):
    # 199 updates after learning starts, each in the learner's own process; the trainer runs here, through the CLI's entry
    total, runs = 3000, []
    for name in ("a", "b"):
        proc = run_fleetrl_in_process("train", "dqn", *LAGGED, "--total-timesteps", str(total), "--run-dir", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(tmp_path / name)
    curves = [[(p.step, p.value) for p in read_scalars(run, "losses/td_loss")] for run in runs]
    assert curves[0] and curves[0] == curves[1], "the same seed gives the same losses"
    returns = [[p.value for p in read_scalars(run, "charts/episodic_return")] for run in runs]
    assert returns[0] == returns[1]
    state = checkpoint.load_checkpoint(runs[0])
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {dqn_updates_made(total)}, f"the checkpoint's optimiser took every update the learner did: {steps}"
    evaluated = run_fleetrl_in_process("eval", str(runs[0]), "--episodes", "2", "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_the_whole_group_checkpoints_the_learners_state_then_resume_finishes(tmp_path):
    run_dir, total = tmp_path / "run", 60_000
    train = ["train", "dqn", *LAGGED, "--total-timesteps", str(total), "--checkpoint-every", "10", "--run-dir", str(run_dir)]
    proc = start_fleetrl_group(*train)
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, run_dir, 3000)  # by then the learner has made 199 updates
        os.killpg(proc.pid, signal.SIGTERM)  # as Slurm or Ctrl-C do: the learner gets it too, and leaves the stop to the trainer
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in output, output[-3000:]
    state = checkpoint.load_checkpoint(run_dir)
    stopped_at = int(state["global_step"])
    assert stopped_at < total
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {dqn_updates_made(stopped_at)}, f"the learner's every update is in the checkpoint: {steps} at {stopped_at}"
    resumed = run_fleetrl_in_process(*train, "--total-timesteps", str(stopped_at + 1000), "--resume", "auto")  # the resume itself needs no signal
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == stopped_at + 1000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_of_the_trainer_takes_the_learner_with_it_and_resume_auto_finishes(tmp_path):
    run_dir, total = tmp_path / "run", 60_000
    train = ["train", "dqn", *LAGGED, "--total-timesteps", str(total), "--checkpoint-every", "10", "--run-dir", str(run_dir)]
    proc = start_fleetrl_group(*train)
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, run_dir, 3000)  # by then the learner has made 199 updates
        learners = learner_processes(proc.pid)
        assert learners, "the learner runs in a process of its own"
        os.kill(proc.pid, signal.SIGKILL)  # the trainer alone: its learner must not be left running
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(learners, timeout=15)
        assert not alive, f"orphaned learner processes: {alive}"
    killed_at = int(checkpoint.load_checkpoint(run_dir)["global_step"])
    resumed = run_fleetrl_in_process(*train, "--total-timesteps", str(killed_at + 1000), "--resume", "auto")  # the resume itself needs no signal
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert int(checkpoint.load_checkpoint(run_dir)["global_step"]) == killed_at + 1000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_learner_killed_mid_run_stops_the_trainer_with_a_clear_error_and_keeps_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_fleetrl_group("train", "dqn", *LAGGED, "--total-timesteps", "60000", "--checkpoint-every", "10", "--run-dir", str(run_dir))
    with killed_on_exit(proc):
        deadline = time.time() + 180
        while not checkpoint.list_checkpoints(run_dir) or not learner_processes(proc.pid):
            assert proc.poll() is None and time.time() < deadline, "timed out"
            time.sleep(0.1)
        time.sleep(1.0)
        for learner in learner_processes(proc.pid):
            learner.kill()  # what the out-of-memory killer does
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode not in (0, None) and "Traceback" not in output, output[-3000:]
    assert "learner process (--policy-lag 1) was killed by signal 9" in output and "--resume auto" in output, output[-3000:]
    state = checkpoint.load_checkpoint(run_dir)
    assert np.isfinite(float(state["global_step"]))
