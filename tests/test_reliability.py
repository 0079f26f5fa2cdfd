"""A run never loses work: exact resume after SIGTERM, random SIGKILLs, torn checkpoints, a full disk,
checkpoints from elsewhere, and teardown when setup fails. Real processes, real signals, a real full filesystem."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.errors import FleetError
from fleetrl.sampling.replay import CHECKPOINT_BYTES
from fleetrl.monitor.tbread import read_scalars

from conftest import (assert_same_learner, fleetrl_env, fleetrl_frames, python_in_a_clone_named_fleetrl, run_fleetrl_in_process,
                      start_fleetrl, tmpfs)

STATELESS = ["--env-id", "fleetrl_test_envs:Stateless-v0", "--no-cuda", "--env-backend", "sync"]
SLOW_STATELESS = ["--env-id", "fleetrl_test_envs:SlowStateless-v0", *STATELESS[2:]]  # for a signal that must land mid-run
BATCH = 4 * 128  # classic control's default batch


def in_process(*args: str) -> subprocess.CompletedProcess:
    """``fleetrl ARGS`` in this process (conftest.run_fleetrl_in_process), this process's torch threads kept: for the runs
    whose process is not what the test is about (a reference run, a resume, an eval)."""
    threads = torch.get_num_threads()  # a run sets its process's thread count
    try:
        return run_fleetrl_in_process(*args)
    finally:
        torch.set_num_threads(threads)


def state(step: int) -> dict:
    return {"args": {"env_id": "CartPole-v1"}, "model": {"w": torch.full((3,), float(step))}, "global_step": step, "iteration": step}


def names(run_dir) -> list[str]:
    return [p.name for p in checkpoint.list_checkpoints(run_dir)]


# ------------------------------------------------------------------------------------------ checkpoints on disk
def test_retention_and_resume_auto_follow_the_runs_history_not_the_highest_step(tmp_path):
    for step in (100, 200, 300):
        checkpoint.save_checkpoint(state(step), tmp_path, keep=3)
    # the user resumed step 100: the new branch's checkpoint is the newest, and the abandoned 200/300 go first
    checkpoint.save_checkpoint(state(150), tmp_path, keep=2)
    assert names(tmp_path) == ["ckpt_000000000300.pt", "ckpt_000000000150.pt"]
    assert checkpoint.load_checkpoint(tmp_path)["global_step"] == 150, "auto continues the branch written last"
    checkpoint.save_checkpoint(state(250), tmp_path, keep=1)
    assert names(tmp_path) == ["ckpt_000000000250.pt"], "the checkpoint just written is never the one deleted"
    # the new branch reaches a step the abandoned one had: the new file replaces it and is the newest
    checkpoint.save_checkpoint(state(300), tmp_path, keep=5)
    assert names(tmp_path)[-1] == "ckpt_000000000300.pt" and checkpoint.load_checkpoint(tmp_path)["global_step"] == 300


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest"])
def test_auto_skips_a_torn_or_corrupt_newest_checkpoint_with_a_warning(tmp_path, capsys, damage):
    for step in (100, 200):
        checkpoint.save_checkpoint(state(step), tmp_path, keep=3)
    newest = checkpoint.list_checkpoints(tmp_path)[-1]
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF  # one bit pattern changed: still a readable zip, caught by the checksum
        newest.write_bytes(bytes(data))
    else:
        checkpoint.manifest_path(newest).unlink()  # killed between the file and its commit marker
    loaded = checkpoint.load_checkpoint(tmp_path)
    assert loaded["global_step"] == 100 and loaded["model"]["w"].tolist() == [100.0] * 3
    if damage != "no_manifest":
        err = capsys.readouterr().err
        assert "skipping the checkpoint" in err and newest.name in err
        with pytest.raises(FleetError, match="torn|corrupt"):
            checkpoint.load_checkpoint(newest)  # named explicitly: a clear error, not a fallback
    else:  # whole (renamed into place) but unverified: kept, and older than every verified checkpoint
        assert names(tmp_path) == ["ckpt_000000000200.pt", "ckpt_000000000100.pt"]


def test_checkpoints_without_manifests_are_used_unverified_by_eval_and_resume_auto(tmp_path, cartpole_run):
    run_dir = tmp_path / "old"
    shutil.copytree(cartpole_run, run_dir)
    for manifest in (run_dir / "checkpoints").glob("*.json"):
        manifest.unlink()  # as written before checkpoints had manifests
    evaluated = in_process("eval", str(run_dir), "--episodes", "1")
    assert evaluated.returncode == 0 and "has no manifest" in evaluated.stderr, evaluated.stderr[-3000:]
    copied_events = set(run_dir.glob("events.out.tfevents.*"))
    resumed = in_process("train", "ppo", "--resume", "auto", "--run-dir", str(run_dir), "--total-timesteps", str(3 * BATCH))
    assert resumed.returncode == 0 and "has no manifest" in resumed.stderr, resumed.stderr[-3000:]
    assert checkpoint.load_checkpoint(run_dir)["global_step"] == 3 * BATCH
    # continued, not afresh (a fresh start would end at 3 * BATCH too): the resumed process logged the third iteration
    # only, and trained none of the steps before its checkpoint's 2 * BATCH again
    (new_events,) = set(run_dir.glob("events.out.tfevents.*")) - copied_events
    assert [p.step for p in read_scalars(new_events, "charts/learning_rate")] == [3 * BATCH]
    assert [p.step for p in read_scalars(run_dir, "charts/learning_rate")] == [BATCH, 2 * BATCH, 3 * BATCH]


def test_a_checkpoints_manifest_names_its_checkpoint_not_its_folders_newest(tmp_path, cartpole_run):
    run_dir = tmp_path / "run"
    shutil.copytree(cartpole_run, run_dir)
    (older,) = checkpoint.list_checkpoints(run_dir)
    newer = checkpoint.save_checkpoint({**checkpoint.load_checkpoint(older), "global_step": 2 * 1024}, run_dir, keep=5)
    evaluated = {path: in_process("eval", str(path), "--episodes", "1", "--json") for path in (checkpoint.manifest_path(older), run_dir)}
    for path, proc in evaluated.items():
        assert proc.returncode == 0 and "torn" not in proc.stderr and "manifest" not in proc.stderr, proc.stderr[-3000:]
    by_manifest, by_folder = (json.loads(evaluated[path].stdout.strip().splitlines()[-1]) for path in evaluated)
    assert (by_manifest["checkpoint"], by_manifest["global_step"]) == (str(older), 1024), "the manifest's own checkpoint, verified"
    assert (by_folder["checkpoint"], by_folder["global_step"]) == (str(newer), 2048), "the folder's newest is another one"


@contextlib.contextmanager
def manifest_rename_fails(monkeypatch):
    """The commit (the manifest's rename) fails as on a full disk, after every other file was written."""
    real_replace = os.replace

    def fail_on_the_manifest(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_the_manifest)
    try:
        yield
    finally:
        monkeypatch.setattr(os, "replace", real_replace)


def test_a_failed_write_leaves_every_earlier_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(state(100), tmp_path, keep=3)
    with manifest_rename_fails(monkeypatch), pytest.raises(checkpoint.CheckpointWriteError, match="No space left"):
        checkpoint.save_checkpoint(state(200), tmp_path, keep=1)
    assert names(tmp_path) == ["ckpt_000000000100.pt"] and checkpoint.load_checkpoint(tmp_path)["global_step"] == 100
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp-" in p.name]


# ------------------------------------------------------------------------------------------ per-rank shards
def save_with_shards(run_dir, step: int, ranks: int = 2, keep: int = 5):
    """A checkpoint as a run of ``ranks`` processes with --save-buffer writes it: each rank's shard, then rank 0's commit."""
    shards = [checkpoint.write_shard({"replay": {"obs": torch.full((50, 4), float(step + rank))}}, run_dir, step, rank)
              for rank in range(ranks)]
    return checkpoint.save_checkpoint(state(step), run_dir, keep=keep, shards=shards)


def files(run_dir) -> list[str]:
    return sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())


def test_the_manifest_covers_every_shard_and_a_shard_loads_back_mapped(tmp_path):
    path = save_with_shards(tmp_path, 100)
    manifest = json.loads(checkpoint.manifest_path(path).read_text())
    assert [(s["rank"], s["name"], s["holds"]) for s in manifest["shards"]] == [
        (0, "ckpt_000000000100.rank0.pt", ["replay"]), (1, "ckpt_000000000100.rank1.pt", ["replay"])]
    for entry in manifest["shards"]:
        data = (tmp_path / "checkpoints" / entry["name"]).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["size"] == path.stat().st_size and manifest["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "replay" not in checkpoint.load_checkpoint(tmp_path), "the shards stay out of the main file"
    shard = checkpoint.load_shard(tmp_path / "checkpoints" / "ckpt_000000000100.rank1.pt")
    assert shard["replay"]["obs"].tolist() == [[101.0] * 4] * 50


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing"])
def test_a_torn_corrupt_or_missing_shard_makes_auto_take_the_previous_checkpoint(tmp_path, capsys, damage):
    for step in (100, 200):
        save_with_shards(tmp_path, step)
    shard = tmp_path / "checkpoints" / "ckpt_000000000200.rank1.pt"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()  # on a node's own disk that is lost, say
    assert checkpoint.load_checkpoint(tmp_path)["global_step"] == 100, "a run folder gives the newest checkpoint whose files all verify"
    err = capsys.readouterr().err
    assert "skipping the checkpoint" in err and shard.name in err and {"truncate": "torn", "flip": "corrupt", "missing": "missing"}[damage] in err
    with pytest.raises(FleetError, match="Could not use the checkpoint.*ckpt_000000000200.rank1.pt"):
        checkpoint.load_checkpoint(checkpoint.list_checkpoints(tmp_path)[-1])  # named explicitly: refused, not a fallback


def test_retention_and_failed_writes_remove_their_shards_and_keep_the_earlier_checkpoints(tmp_path, monkeypatch):
    for step in (100, 200, 300):
        save_with_shards(tmp_path, step, keep=2)
    assert files(tmp_path) == [f"ckpt_000000000{step}.{kind}" for step in (200, 300) for kind in ("json", "pt", "rank0.pt", "rank1.pt")]
    with manifest_rename_fails(monkeypatch), pytest.raises(checkpoint.CheckpointWriteError, match="No space left"):
        save_with_shards(tmp_path, 400, keep=2)
    assert files(tmp_path) == [f"ckpt_000000000{step}.{kind}" for step in (200, 300) for kind in ("json", "pt", "rank0.pt", "rank1.pt")], \
        "the failed checkpoint's shards went with it, and nothing else did"
    real_save = torch.save

    def disk_full_midway(obj, f, *args, **kwargs):
        f.write(b"the first bytes of a shard")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full_midway)
    with pytest.raises(checkpoint.CheckpointWriteError, match="shard .*rank0.pt: .*No space left"):
        checkpoint.write_shard({"replay": {}}, tmp_path, 400, 0)
    monkeypatch.setattr(torch, "save", real_save)
    (tmp_path / "checkpoints" / "ckpt_000000000150.rank1.pt").write_bytes(b"a shard a killed run left, with no checkpoint")
    save_with_shards(tmp_path, 500, keep=2)
    assert files(tmp_path) == [f"ckpt_000000000{step}.{kind}" for step in (300, 500) for kind in ("json", "pt", "rank0.pt", "rank1.pt")]
    assert checkpoint.load_checkpoint(tmp_path)["global_step"] == 500


def anon_mb() -> float:
    """This process's anonymous resident memory (heap and anonymous maps, not the page cache or mapped files), in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon")) / 1024


def test_a_shard_is_written_and_read_back_without_a_second_copy_of_the_buffer_in_memory(tmp_path):
    import gymnasium as gym
    import numpy as np

    from fleetrl.sampling.replay import ReplayBuffer

    # in this process: what is measured is the growth of its anonymous memory during a write and a read, sampled by a
    # thread every millisecond
    peak, done = [0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], anon_mb())
            time.sleep(0.001)

    def buffer() -> ReplayBuffer:
        # 2 x 114 MiB of observations: a second copy of the buffer, or of either array, is far over what a checkpoint may add
        rb = ReplayBuffer(30_000, 1, gym.spaces.Box(-1, 1, (1000,), np.float32), gym.spaces.Discrete(2), check_memory=False)
        for name in ("obs", "next_obs", "actions", "rewards", "dones"):
            getattr(rb, name)[:] = 1  # resident, as a full buffer is
        return rb

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rb = buffer()
        rb.filled = rb.rows
        rb.obs[-1] = 7
        time.sleep(0.05)
        peak[0] = base = anon_mb()
        checkpoint.write_shard({"replay": rb.state_dict()}, tmp_path, 100, 0)
        time.sleep(0.05)
        save_mb = peak[0] - base
        restored = buffer()
        time.sleep(0.05)
        peak[0] = base = anon_mb()
        restored.load_state_dict(checkpoint.load_shard(checkpoint.shard_path(tmp_path, 100, 0))["replay"])
        time.sleep(0.05)
        load_mb = peak[0] - base
    finally:
        done.set()
        watcher.join()
    buffer_mb, limit_mb = rb.obs.nbytes * 2 / 2**20, CHECKPOINT_BYTES / 2**20
    assert (restored.obs == rb.obs).all() and buffer_mb > 3 * limit_mb, buffer_mb
    # a second copy would add the buffer's 229 MiB; what a checkpoint may add is what the memory check counts for it
    assert save_mb < limit_mb and load_mb < limit_mb, (save_mb, load_mb)


# ------------------------------------------------------------------------------------------ exact resume
def wait_for(predicate, proc: subprocess.Popen, timeout: float = 180, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stdout.read()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def until_the_first_progress_line(proc: subprocess.Popen) -> list[str]:
    """The run's output up to its first progress line, printed after its first iteration: it trains, and its stop
    handlers are in place. (A run that ends first fails the test on what it printed.)"""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step "):
            return seen
    raise AssertionError(f"the run ended before its first iteration: {''.join(seen)[-3000:]}")


def final_state(run_dir) -> dict:
    return checkpoint.load_checkpoint(run_dir)


def torchrun_cmd(nproc: int, python: str = sys.executable) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "fleetrl"]


def run_ranks(nproc: int, *jobs: list[str]) -> None:
    """Each job, ``fleetrl ARGS``, as ``nproc`` ranks started here with torchrun's environment but without torchrun's own
    process (its torch import, ~2.5 s): for the runs whose launcher is not under test. The jobs run side by side; one
    whose port was taken between its choice and rank 0's bind is run again."""

    def start(args: list[str]) -> list[subprocess.Popen]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return [subprocess.Popen([sys.executable, "-m", "fleetrl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env={**fleetrl_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                                      "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                for rank in range(nproc)]

    def finish(ranks: list[subprocess.Popen]) -> tuple[list[int], list[str]]:
        outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
        return [rank.returncode for rank in ranks], outputs

    started = [start(args) for args in jobs]
    try:
        for args, ranks in zip(jobs, started):
            codes, outputs = finish(ranks)
            if codes[0] != 0 and "address already in use" in outputs[0].lower():
                started.append(ranks := start(args))
                codes, outputs = finish(ranks)
            assert codes == [0] * nproc, "\n".join(o[-3000:] for o in outputs)
    finally:  # a job that failed or hung leaves no rank running into the next test
        for rank in (rank for ranks in started for rank in ranks):
            if rank.poll() is None:
                rank.kill()
                rank.wait()


def test_fleetrl_frames_are_found_by_the_packages_location_not_by_a_folder_named_fleetrl(tmp_path):
    from conftest import PACKAGE_DIR

    python = python_in_a_clone_named_fleetrl(tmp_path)
    launcher = Path(python).parent.parent / "lib" / "python3.11" / "site-packages" / "torch" / "distributed" / "run.py"
    ours, algo = PACKAGE_DIR / "run.py", PACKAGE_DIR / "algos" / "ppo.py"
    output = "\n".join(f'  File "{path}", line 7, in f' for path in (launcher, ours, algo))
    assert "/fleetrl/" in str(launcher), "the launcher's frame lies under a folder named fleetrl"
    assert fleetrl_frames(output) == [str(ours), str(algo)] and fleetrl_frames(output, "algos") == [str(algo)]


@pytest.mark.slow
@pytest.mark.parametrize("nproc, stop", [(1, signal.SIGINT), (2, signal.SIGTERM)], ids=["1-ctrl_c", "2-sigterm"])
def test_a_stop_signal_checkpoints_at_once_and_the_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, nproc, stop):
    # Ctrl-C to one process (exit 130), SIGTERM to torchrun, which forwards it to both ranks; SIGTERM to one process is
    # test_sigterm_to_the_whole_process_group_of_an_async_run's and test_parent_watch.py's.
    # short iterations (4 x 16 steps); the stopped run's env sleeps 5 ms a step (0.3 s an iteration however fast the
    # host), so the signal lands well before its end; the other runs' same env without the sleep gives the same data
    iterations, batch = 24, 4 * 16
    # fp32 and one thread, not measured and planned: the runs in this process and in their own decide alike; no
    # checkpoint on a cadence, so the stopped run's only one is the stop's
    train = ["train", "ppo", *STATELESS, "--num-envs", "4", "--num-steps", "16", "--total-timesteps", str(iterations * batch),
             "--checkpoint-every", "1000", "--precision", "fp32", "--torch-threads", "1"]
    slow_train = [SLOW_STATELESS[1] if a == STATELESS[1] else a for a in train]
    # launched as from a clone in a folder named fleetrl, where torchrun's own frames lie under .../fleetrl/.venv
    python = python_in_a_clone_named_fleetrl(tmp_path)
    launcher = torchrun_cmd(nproc, python) if nproc > 1 else [python, "-m", "fleetrl"]

    # the uninterrupted and the resumed runs: only the stopped run's processes are under test, so with one process they
    # run in this one, and with two their ranks start without torchrun, side by side once the stopped run has ended
    whole, stopped_dir = ["--run-dir", str(tmp_path / "whole")], tmp_path / "stopped"
    resume = ["--resume", "auto", "--run-dir", str(stopped_dir)]
    if nproc == 1:
        assert (done := in_process(*train, *whole)).returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen([*launcher, *slow_train, "--run-dir", str(stopped_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=fleetrl_env(), start_new_session=True)
    try:
        seen = until_the_first_progress_line(proc)
        sent = time.time()
        proc.send_signal(stop)  # torchrun forwards it to every rank
        output = "".join(seen) + proc.communicate(timeout=60)[0]
        assert time.time() - sent < 30, "a preempted run must be gone well within Slurm's and Kubernetes' 30 s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    said = {signal.SIGINT: "stopped by Ctrl-C", signal.SIGTERM: "stopped by SIGTERM"}[stop]
    assert proc.returncode != 0 and said in output and "--resume auto" in output, output[-3000:]
    if stop == signal.SIGINT:
        assert proc.returncode == 130, output[-3000:]
    # torchrun itself prints the SignalException it ends on; no traceback may come from fleetrl's ranks
    assert ("Traceback" not in output) if nproc == 1 else not fleetrl_frames(output), output[-3000:]
    assert output.count(said) == 1, "rank 0 reports the stop once"
    (only,) = checkpoint.list_checkpoints(stopped_dir)  # the stop's, off the cadence
    stopped_at = checkpoint.load_checkpoint(only)
    assert batch <= stopped_at["global_step"] < iterations * batch
    assert len(stopped_at["ranks"]) == nproc, "every rank's RNG streams are saved"

    if nproc == 1:
        assert (done := in_process(*train, *resume)).returncode == 0, done.stderr[-3000:]
    else:
        run_ranks(nproc, [*train, *whole], [*train, *resume])
    assert_same_learner(final_state(tmp_path / "whole"), final_state(stopped_dir))
    steps = [p.step for p in read_scalars(stopped_dir, "charts/learning_rate")]
    assert steps == [batch * i for i in range(1, iterations + 1)], "every iteration logged exactly once"


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_of_an_async_run_checkpoints_without_worker_restarts(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fleetrl", "train", "ppo", *SLOW_STATELESS[:-2], "--env-backend", "async",
                             "--total-timesteps", str(400 * BATCH), "--checkpoint-every", "1000", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=fleetrl_env(), start_new_session=True)
    try:
        seen = until_the_first_progress_line(proc)  # the env workers are stepping the second iteration's first steps
        os.killpg(proc.pid, signal.SIGTERM)  # as Slurm does: the trainer and its env workers at once
        output = "".join(seen) + proc.communicate(timeout=60)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in output, output[-3000:]
    assert "restarting env worker" not in output and "Traceback" not in output, output[-3000:]
    assert checkpoint.load_checkpoint(run_dir)["global_step"] > 0


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_at_most_the_work_since_the_last_checkpoint(tmp_path):
    run_dir, iterations, batch = tmp_path / "run", 32, 4 * 32
    # each step sleeps 1 ms, so an iteration of 4 x 32 steps takes at least 0.13 s however fast the host: a life is killed
    # a few iterations after its first new checkpoint, long before the end (plain CartPole's 20k SPS ran a resumed run to
    # its end between two polls): a life trains at most ~4 iterations (one to its new checkpoint, then up to 0.4 s of poll
    # and kill delay), so the four end by iteration ~16 and the last run resumes with several left, even after stalls of
    # this process of 2 s in all (16 iterations) while the run goes on
    train = ["train", "ppo", "--env-id", "fleetrl_test_envs:SlowCartPole-v1", "--env-backend", "sync", "--no-cuda", "--num-steps", "32",
             "--total-timesteps", str(iterations * batch), "--checkpoint-every", "1", "--keep-checkpoints", "2", "--resume", "auto",
             "--run-dir", str(run_dir)]
    rng = random.Random(11)
    kills = 0
    for _ in range(4):
        proc = start_fleetrl(*train)
        before = checkpoint.load_checkpoint(run_dir)["global_step"] if checkpoint.list_checkpoints(run_dir) else 0
        try:
            wait_for(lambda: checkpoint.list_checkpoints(run_dir) and checkpoint.load_checkpoint(run_dir)["global_step"] > before,
                     proc, what="a new checkpoint")
            time.sleep(rng.uniform(0.0, 0.3))  # anywhere in the next ~2 iterations: mid-rollout, mid-update, mid-write of a checkpoint
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        finally:
            proc.wait(timeout=30)
            proc.stdout.close()
        latest = checkpoint.load_checkpoint(run_dir)  # the newest that verifies
        assert latest["global_step"] > before, "each life made progress that survived the kill"
        assert latest["global_step"] < iterations * batch, "killed mid-run, not after its end"
    finished = in_process(*train)  # the last run, not killed: in this process
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert kills == 4 and checkpoint.load_checkpoint(run_dir)["global_step"] == iterations * batch
    steps = [p.step for p in read_scalars(run_dir, "charts/learning_rate")]
    assert steps == [batch * i for i in range(1, iterations + 1)], "no step lost from the curves and none duplicated"


# ------------------------------------------------------------------------------------------ env workers
@pytest.mark.slow
def test_ppo_goes_on_through_env_worker_crashes_counts_them_and_stops_after_the_limit(tmp_path):
    flaky = ["train", "ppo", "--env-id", "fleetrl_test_envs:FlakyTrain-v0", "--env-backend", "async", "--no-cuda",
             "--num-envs", "4", "--total-timesteps", str(8 * BATCH)]
    proc = in_process(*flaky, "--run-dir", str(tmp_path / "ok"))  # the env workers are processes; the trainer is this one
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("restarting env worker") >= 2 and "FlakyEnv was told to fail" in proc.stderr
    restarts = read_scalars(tmp_path / "ok", "resources/env_worker_restarts")
    assert restarts and restarts[-1].value == proc.stderr.count("restarting env worker"), "every restart is counted in the logs"
    assert checkpoint.load_checkpoint(tmp_path / "ok")["global_step"] == 8 * BATCH

    limited = in_process(*flaky, "--max-env-restarts", "1", "--run-dir", str(tmp_path / "limited"))
    assert limited.returncode != 0 and "--max-env-restarts" in limited.stderr and "FlakyEnv was told to fail" in limited.stderr
    assert not fleetrl_frames(limited.stderr, "algos"), "no trainer traceback: only the env's own, inside the message"


# ------------------------------------------------------------------------------------------ a disk that fills up
@pytest.fixture
def small_disk(tmp_path):
    """400 KiB: a run fills it with its own logs and checkpoints."""
    yield from tmpfs(tmp_path, "small", "400k")


@pytest.fixture
def roomy_disk(tmp_path):
    """16 MiB: a run starts with room, and the test fills it mid-run."""
    yield from tmpfs(tmp_path, "roomy", "16m")


@pytest.mark.slow
def test_a_full_disk_is_reported_retried_then_stops_naming_the_last_good_checkpoint(small_disk):
    run_dir = small_disk / "run"
    proc = in_process("train", "ppo", "--env-id", "CartPole-v1", "--no-cuda", "--total-timesteps", str(200 * BATCH),
                      "--checkpoint-every", "2", "--keep-checkpoints", "3", "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("the next checkpoint tries again") == 2, proc.stderr[-3000:]
    assert "3 failed checkpoint writes in a row" in proc.stderr and "No space left on device" in proc.stderr
    last_good = checkpoint.load_checkpoint(run_dir)
    assert f"ckpt_{int(last_good['global_step']):012d}.pt" in proc.stderr.split("last good checkpoint is")[-1]


def fill(folder) -> None:
    """Write zeros into ``folder`` until its filesystem is full."""
    with open(folder / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()


@pytest.mark.slow
def test_a_disk_filled_mid_run_stops_logging_with_one_paragraph_no_thread_traceback_and_the_last_checkpoint_evaluates(roomy_disk):
    run_dir = roomy_disk / "run"
    proc = start_fleetrl("train", "ppo", "--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", "--total-timesteps",
                         str(2000 * BATCH), "--checkpoint-every", "3", "--run-dir", str(run_dir))
    try:
        wait_for(lambda: checkpoint.list_checkpoints(run_dir), proc, what="the first checkpoint")
        fill(roomy_disk)
        output = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert output.count("TensorBoard logging stopped") == 1 and "No space left on device" in output, output[-3000:]
    assert "failed checkpoint writes in a row" in output, "the checkpoints' own retries end the run"
    evaluated = in_process("eval", str(run_dir), "--episodes", "2")
    assert evaluated.returncode == 0 and "Traceback" not in evaluated.stderr, evaluated.stderr[-3000:]


def test_a_run_folder_that_cannot_be_written_is_refused_before_anything_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_fleetrl_in_process("train", "ppo", "--run-dir", str(blocker / "run"), "--total-timesteps", "512")
    assert proc.returncode == 2 and "cannot be written" in proc.stderr and "--run-dir" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------ checkpoints from elsewhere
@pytest.fixture
def cartpole_run(tiny_cartpole_run):
    """The session's finished CartPole run (2 x 512 steps): the tests read it, or copy it first."""
    return tiny_cartpole_run.run_dir


def test_a_checkpoint_of_another_env_or_algorithm_or_a_truncated_one_is_refused_clearly(tmp_path, cartpole_run):
    other_env = run_fleetrl_in_process("train", "ppo", "--resume", str(cartpole_run), "--env-id", "Acrobot-v1", "--run-dir", str(tmp_path / "a"))
    assert other_env.returncode == 2 and "observations of shape (4,)" in other_env.stderr and "(6,)" in other_env.stderr, other_env.stderr
    other_algo = checkpoint.load_checkpoint(cartpole_run)
    checkpoint.save_checkpoint({**other_algo, "algo": "dqn"}, tmp_path / "dqn", keep=1)
    wrong = run_fleetrl_in_process("train", "ppo", "--resume", str(tmp_path / "dqn"), "--run-dir", str(tmp_path / "b"))
    assert wrong.returncode == 2 and "written by dqn" in wrong.stderr, wrong.stderr
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(checkpoint.list_checkpoints(cartpole_run)[-1].read_bytes()[:5000])
    for command in (["train", "ppo", "--resume", str(truncated), "--run-dir", str(tmp_path / "c")], ["eval", str(truncated)]):
        proc = run_fleetrl_in_process(*command)
        assert proc.returncode == 2 and "corrupt or truncated" in proc.stderr, proc.stderr
    for proc in (other_env, wrong):
        assert "Traceback" not in proc.stderr


def test_a_failure_during_setup_tears_down_env_workers_threads_and_the_process_group(cartpole_run, tmp_path):
    from fleetrl.algos import ppo

    def children() -> set[int]:
        found = set()
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "forkserver" not in " ".join(child.cmdline()) and "resource_tracker" not in " ".join(child.cmdline()):
                    found.add(child.pid)
        return found

    before = children()
    # the resumed checkpoint does not fit the env: refused after the async backend's workers started
    args = ppo.Args(env_id="Acrobot-v1", env_backend="async", num_envs=2, resume=str(cartpole_run), run_dir=str(tmp_path / "r"), cuda=False)
    with pytest.raises(FleetError, match="observations of shape"):
        ppo.train(args, explicit={"env_id", "env_backend", "num_envs", "resume", "run_dir"})
    deadline = time.time() + 10
    while children() - before and time.time() < deadline:
        time.sleep(0.1)
    assert not children() - before, "the env workers were stopped"
    assert not [t for t in threading.enumerate() if t.name.startswith("fleetrl-")], "no monitoring or sampler thread left"
    assert not torch.distributed.is_initialized()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the stop-signal handlers are put back"
