"""Monitoring during training: resources, phase timing shares, the windowed SPS, W&B offline."""

import os

import pytest

from fleetrl.monitor.tbread import read_scalars, scalar_tags
from fleetrl.monitor.timing import PhaseTimer

from conftest import fleetrl_env, run_fleetrl


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
def test_training_logs_plausible_resources_and_phase_shares(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_fleetrl("train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", str(80 * 512), "--env-backend", "sync",
                       "--run-dir", str(run_dir), "--no-cuda", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = scalar_tags(run_dir)
    for tag in ("resources/cpu_percent", "resources/system_cpu_percent", "resources/rss_mb", "charts/SPS_window",
                "perf/env_time", "perf/inference_time", "perf/learn_time", "perf/other_time", "perf/env_share", "perf/other_share"):
        assert tag in tags, tag
    assert "perf/comm_time" not in tags, "no communication phase in a single process"
    assert max(p.value for p in read_scalars(run_dir, "resources/cpu_percent")) > 0
    assert min(p.value for p in read_scalars(run_dir, "resources/rss_mb")) > 50
    shares = {t: [p.value for p in read_scalars(run_dir, t)] for t in tags if t.endswith("_share")}
    for i in range(1, len(shares["perf/env_share"])):  # the first iteration includes warm-up
        assert sum(v[i] for v in shares.values()) == pytest.approx(1.0, abs=0.02)
    assert all(0 <= v <= 1 for values in shares.values() for v in values)  # how small other_share is: benchmarks/monitor_overhead.py
    windowed = [p.value for p in read_scalars(run_dir, "charts/SPS_window")]
    assert all(w > 0 for w in windowed)


@pytest.mark.slow
def test_track_with_wandb_offline_leaves_an_offline_run(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = fleetrl_env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path))
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "fleetrl", "train", "ppo", "--total-timesteps", "2048", "--track",
                           "--wandb-project-name", "fleetrl-test", "--run-dir", str(run_dir), "--no-cuda"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline, os.listdir(run_dir)
    assert any(offline[0].rglob("*.wandb")), "the offline run holds its data file"


@pytest.mark.slow
def test_capture_video_leaves_a_playable_mp4(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v2 as imageio

    run_dir = tmp_path / "run"
    proc = run_fleetrl("train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--capture-video",
                       "--run-dir", str(run_dir), "--no-cuda", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert videos, "no video written"
    frames = imageio.mimread(str(videos[0]), memtest=False)
    assert len(frames) >= 1 and frames[0].ndim == 3
