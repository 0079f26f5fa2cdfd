"""Monitoring during training: resources, phase timing shares, the windowed SPS, W&B offline, videos; each run in the
test's process (issue 46: a process start that imports torch costs about 2.5 s)."""

import os
from pathlib import Path

import numpy as np
import pytest

from fleetrl.monitor.tbread import read_scalars, scalar_tags
from fleetrl.monitor.timing import PhaseTimer

from conftest import require_module, run_fleetrl_here, run_fleetrl_in_process


def test_phases_nest_without_double_counting_and_each_lap_reports_its_own_iteration(phase_clock):
    # binary fractions of a second, so every sum and share is exact
    timer = PhaseTimer(distributed=True)
    with timer.learn:
        phase_clock.advance(0.25)
        with timer.comm:  # pauses learn
            phase_clock.advance(0.5)
        phase_clock.advance(0.125)  # learn again
    with timer.env:
        phase_clock.advance(0.0625)
    phase_clock.advance(0.0625)  # in no phase: other
    assert timer.lap() == {
        "perf/env_time": 0.0625, "perf/env_share": 0.0625, "perf/inference_time": 0.0, "perf/inference_share": 0.0,
        "perf/learn_time": 0.375, "perf/learn_share": 0.375, "perf/comm_time": 0.5, "perf/comm_share": 0.5,
        "perf/other_time": 0.0625, "perf/other_share": 0.0625,
    }
    assert timer.last_lap_seconds == 1.0
    with timer.inference:  # the next iteration counts from the last lap: 0.5 s of wall, a quarter of it inference
        phase_clock.advance(0.125)
    phase_clock.advance(0.375)
    perf = timer.lap()
    assert (perf["perf/inference_time"], perf["perf/inference_share"], perf["perf/learn_time"], perf["perf/comm_time"]) == (0.125, 0.25, 0, 0)
    assert (perf["perf/other_time"], perf["perf/other_share"]) == (0.375, 0.75)
    assert "perf/wait_time" not in perf, "a phase never entered is not reported outside a distributed run's four"


@pytest.mark.slow
def test_training_logs_plausible_resources_and_phase_shares(tmp_path, monkeypatch):
    from fleetrl.monitor import logger, trainlog
    from fleetrl.monitor.resources import ResourceSampler

    run_dir = tmp_path / "run"
    # sampled and logged every 0.1 s, not every second, so a run of 20 iterations (a second or two) logs several of each
    monkeypatch.setattr(logger, "MONITOR_INTERVAL_S", 0.1)
    monkeypatch.setattr(trainlog, "ResourceSampler", lambda interval, **kwargs: ResourceSampler(interval=0.1, **kwargs))
    # through the CLI's entry point in this process: the resources sampled are this process's, as they are a trainer's
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", str(20 * 512), "--env-backend",
                                  "sync", "--run-dir", str(run_dir), "--no-cuda")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = scalar_tags(run_dir)
    for tag in ("resources/cpu_percent", "resources/system_cpu_percent", "resources/rss_mb", "charts/SPS_window",
                "perf/env_time", "perf/inference_time", "perf/learn_time", "perf/other_time", "perf/env_share", "perf/other_share"):
        assert tag in tags, tag
    assert "perf/comm_time" not in tags, "no communication phase in a single process"
    assert max(p.value for p in read_scalars(run_dir, "resources/cpu_percent")) > 0
    assert min(p.value for p in read_scalars(run_dir, "resources/rss_mb")) > 50
    shares = {t: [p.value for p in read_scalars(run_dir, t)] for t in tags if t.endswith("_share")}
    assert len(shares["perf/env_share"]) >= 3, "logged at several iterations"
    for i in range(1, len(shares["perf/env_share"])):  # the first iteration includes warm-up
        assert sum(v[i] for v in shares.values()) == pytest.approx(1.0, abs=0.02)
    assert all(0 <= v <= 1 for values in shares.values() for v in values)  # how small other_share is depends on the machine
    windowed = [p.value for p in read_scalars(run_dir, "charts/SPS_window")]
    assert all(w > 0 for w in windowed)


def wandb_offline_history(run_file: Path) -> dict[str, list[tuple[int, float]]]:
    """Each scalar an offline W&B run holds, as (global_step, value) in the order logged. The ``.wandb`` file is a
    7-byte header, then wandb's protobuf ``Record``s in LevelDB's log format: 32 KiB blocks of chunks, each with a
    7-byte header (crc32, length, type: 1 whole record, 2 first part, 3 middle, 4 last)."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is no W&B run file: {data[:7]!r}"
    history: dict[str, list[tuple[int, float]]] = {}
    pos, parts, block = 7, [], 32 * 1024
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts = [data[pos + 7:pos + 7 + length]] if kind in (1, 2) else parts + [data[pos + 7:pos + 7 + length]]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(b"".join(parts))
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                for key, value in items.items():
                    if not key.startswith("_") and key != "global_step":
                        history.setdefault(key, []).append((items["global_step"], value))
    return history


@pytest.mark.slow
def test_track_with_wandb_offline_holds_each_tensorboard_scalar_once(tmp_path, monkeypatch):
    require_module("wandb", "track")
    import wandb

    run_dir = tmp_path / "run"
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    # one env: no two episodes end at one step (W&B keeps one value per step and key, TensorBoard each of them); the run
    # folder relative to the working directory, as users give it (W&B saves copies of event files under that path); in
    # this process, whose W&B service is stopped after, as a process's exit stops it
    ours = {name for name in os.environ if name.startswith("WANDB_")}
    try:
        proc = run_fleetrl_here("train", "ppo", "--num-envs", "1", "--num-steps", "512", "--total-timesteps", "2048", "--track",
                                "--wandb-project-name", "fleetrl-test", "--run-dir", "run", "--no-cuda", "--no-progress", cwd=tmp_path)
    finally:
        wandb.teardown()
        for name in {name for name in os.environ if name.startswith("WANDB_")} - ours:  # what W&B set for its service
            os.environ.pop(name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1, os.listdir(run_dir)
    copies = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("events.out.tfevents.*"))
    assert len(copies) == 1, f"TensorBoard's event file, copied into the W&B run inside the run folder: {copies[:3]}"
    history = wandb_offline_history(offline[0])
    tags = scalar_tags(run_dir)
    assert {"losses/policy_loss", "losses/value_loss", "charts/episodic_return", "charts/SPS", "perf/learn_share"} <= tags
    assert set(history) == tags, f"in W&B only: {set(history) - tags}; in TensorBoard only: {tags - set(history)}"
    for tag in tags:  # every point, once, at its step: W&B mirrors TensorBoard exactly
        points = [(p.step, pytest.approx(p.value, rel=1e-6, abs=1e-12)) for p in read_scalars(run_dir, tag)]
        assert history[tag] == points, tag
    assert len(history["losses/policy_loss"]) == 4, "4 iterations of 512 steps, one loss each"


@pytest.mark.slow
def test_capture_video_records_the_scheduled_training_episodes_whole(tmp_path):
    """CartPole rendered by pygame in a real training run: one env, so TensorBoard's episode lengths are env 0's, in order.
    The videos are the schedule's episodes (0, 1, 8, 27, ...), each its episode's length + 1 frames of the moving cart,
    and no half-written file is left."""
    require_module("imageio_ffmpeg", "video")
    require_module("pygame", "video")
    import imageio.v2 as imageio

    scheduled = {k**3 for k in range(10)}.__contains__  # CleanRL's schedule: episodes 0, 1, 8, 27, ..., 729

    run_dir = tmp_path / "run"
    # in this process (its recorder and pygame's rendering are what is tested, not a process start)
    proc = run_fleetrl_here("train", "ppo", "--env-id", "CartPole-v1", "--env-backend", "sync", "--num-envs", "1", "--num-steps", "256",
                            "--total-timesteps", "1024", "--capture-video", "--run-dir", str(run_dir), "--no-cuda", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lengths = [int(p.value) for p in read_scalars(run_dir, "charts/episodic_length")]
    assert len(lengths) > 27, f"{len(lengths)} episodes: too few to reach the schedule's fourth video"
    files = sorted(p.name for p in (run_dir / "videos").iterdir())
    recorded = [i for i in range(len(lengths)) if scheduled(i)]
    names = [f"rl-video-episode-{i}.mp4" for i in recorded]
    # the episode still running when training ends is finished early where it is scheduled (and was started)
    assert files == sorted(names) or (scheduled(len(lengths))
                                      and files == sorted([*names, f"rl-video-episode-{len(lengths)}.mp4"])), files
    for i in recorded:
        frames = imageio.mimread(str(run_dir / "videos" / f"rl-video-episode-{i}.mp4"), memtest=False)
        assert len(frames) == lengths[i] + 1, f"episode {i}: {lengths[i]} steps, so the reset frame and one per step"
        assert frames[0].shape == (400, 600, 3) and frames[0].std() > 0, "CartPole's picture, not a blank frame"
        assert not np.array_equal(frames[0], frames[-1]), "the cart and pole move during an episode"
