"""`fleetrl eval` plays the game as training does: FIRE after a lost life, seeded returns, one video per episode."""

import json

import numpy as np
import pytest

from fleetrl.envs import make_vector_env
from fleetrl.envs.atari import FRAME_SKIP, MAX_FRAMES_PER_EPISODE
from fleetrl.envs.vector import episode_stats

from conftest import require_module, run_fleetrl_here

FIXED = "fleetrl_test_envs:FixedStart-v0"


@pytest.mark.parametrize("backend", ["sync", "ale", "envpool"])
def test_eval_envs_get_a_policy_that_never_fires_past_a_lost_life_on_breakout(backend):
    # Breakout serves the ball only on FIRE: an eval env that does not press it after a lost life idles to the cap
    require_module("ale_py", "atari")
    if backend == "envpool":
        require_module("envpool", "envpool")
    envs = make_vector_env("BreakoutNoFrameskip-v4", 1, backend, training=False)
    try:
        envs.reset(seed=0)
        for step in range(1, 5001):
            _, _, terminated, truncated, info = envs.step(np.zeros(1, np.int64))  # NOOP, never FIRE
            if terminated[0] or truncated[0]:
                break
        assert terminated[0] and not truncated[0], f"no game over in {step} steps: the ball was not served after a lost life"
        (episode,) = episode_stats(info)
        cap = MAX_FRAMES_PER_EPISODE // FRAME_SKIP
        assert step <= episode[1] < cap // 5, "well below the 27,000-step cap (the length counts the hidden steps too, as in training)"
    finally:
        envs.close()


@pytest.fixture(scope="module")
def fixed_start_run(tmp_path_factory):
    """A barely trained policy on an env whose every episode is the same: its action probabilities are far from 0 and 1.
    Trained, and evaluated below, in this process (`fleetrl eval` runs as a process of its own in test_cli_fuzz.py)."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    proc = run_fleetrl_here("train", "ppo", "--env-id", FIXED, "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128",
                            "--run-dir", str(run_dir), "--no-cuda", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def evaluate(run_dir, *flags: str) -> dict:
    proc = run_fleetrl_here("eval", str(run_dir), "--env-id", FIXED, "--episodes", "6", "--json", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_deterministic_returns_have_no_spread_on_a_fixed_start_and_stochastic_ones_vary(fixed_start_run):
    greedy = evaluate(fixed_start_run)
    assert len(set(greedy["returns"])) == 1 and greedy["std_return"] == 0.0, greedy["returns"]
    sampled = evaluate(fixed_start_run, "--stochastic")
    assert len(set(sampled["returns"])) > 1 and sampled["std_return"] > 0, sampled["returns"]


@pytest.mark.slow
def test_the_same_seed_repeats_the_returns_exactly(fixed_start_run):
    first = evaluate(fixed_start_run, "--stochastic", "--seed", "5")
    again = evaluate(fixed_start_run, "--stochastic", "--seed", "5")
    other = evaluate(fixed_start_run, "--stochastic", "--seed", "6")
    assert first["returns"] == again["returns"]
    assert first["returns"] != other["returns"], "the seed drives the sampled actions"


@pytest.mark.slow
def test_eval_capture_video_writes_one_mp4_per_episode_of_its_length(fixed_start_run):
    iio = require_module("imageio.v2", "video")
    require_module("imageio_ffmpeg", "video")
    evaluate(fixed_start_run, "--capture-video")
    videos = sorted((fixed_start_run / "videos_eval").glob("*.mp4"))
    assert len(videos) == 6, videos
    for video in videos:
        reader = iio.get_reader(video)
        try:
            assert reader.count_frames() == 20 + 1, "the reset frame and one per step"
        finally:
            reader.close()
