"""--capture-video: VideoRecorder writes playable MP4s of whole (real) episodes."""

from __future__ import annotations

import builtins

import gymnasium as gym
import pytest

from conftest import require_module
from fleetrl.envs.video import VideoRecorder, capped_cubic_video_schedule
from fleetrl.envs.wrappers import EpisodeStats
from fleetrl.errors import FleetError

pytestmark = [pytest.mark.needs("imageio_ffmpeg", "video"), pytest.mark.needs("imageio.v2", "video")]  # MP4 writing
needs_pygame = pytest.mark.needs("pygame", "video")  # classic control renders with pygame (gymnasium[classic-control])


def read_frames(path) -> list:
    import imageio.v2 as iio

    reader = iio.get_reader(path)
    try:
        return [frame for frame in reader]
    finally:
        reader.close()


def play(env: gym.Env, seed: int = 0) -> tuple[int, int, dict]:
    """One real episode with random actions, driven like a vector env (reset whenever the env says
    terminated/truncated) until info has "episode". Returns (agent steps, learner episode ends, the stats)."""
    env.action_space.seed(seed)
    steps = ends = 0
    while True:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        if "episode" in info:
            return steps, ends, info["episode"]
        if terminated or truncated:
            ends += 1
            env.reset()


@needs_pygame
def test_cartpole_two_episodes_give_two_playable_mp4s(tmp_path):
    env = VideoRecorder(EpisodeStats(gym.make("CartPole-v1", render_mode="rgb_array")), tmp_path, episode_trigger=lambda i: True)
    lengths = []
    for episode in range(2):
        env.reset(seed=episode)
        steps, _, stats = play(env, seed=episode)
        assert stats["l"] == steps
        lengths.append(steps)
    env.close()
    paths = [tmp_path / f"rl-video-episode-{i}.mp4" for i in range(2)]
    assert env.videos == paths
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in paths]  # no temporary files left
    for path, steps in zip(paths, lengths):
        frames = read_frames(path)
        assert len(frames) == steps + 1 >= 2  # the reset frame and one per step
        assert frames[0].shape == (400, 600, 3)


def test_capped_cubic_schedule():
    assert [i for i in range(2001) if capped_cubic_video_schedule(i)] == [0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000, 2000]


@needs_pygame
def test_default_trigger_records_the_schedule_s_episodes(tmp_path):
    env = VideoRecorder(EpisodeStats(gym.make("CartPole-v1", render_mode="rgb_array")), tmp_path, name_prefix="eval")
    env.reset(seed=0)
    for _ in range(3):  # episodes 0, 1, 2: only 0 and 1 are recorded
        play(env)
        env.reset()
    env.close()  # episode 3 was started (not recorded): nothing to finish
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval-episode-0.mp4", "eval-episode-1.mp4"]


@needs_pygame
def test_close_finishes_an_open_video(tmp_path):
    env = VideoRecorder(EpisodeStats(gym.make("CartPole-v1", render_mode="rgb_array")), tmp_path)
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    assert not list(tmp_path.glob("rl-video-*.mp4"))  # still recording: only the hidden temporary file
    env.close()
    assert len(read_frames(tmp_path / "rl-video-episode-0.mp4")) == 3


def test_one_atari_video_spans_every_life_of_a_game(tmp_path):
    from fleetrl.envs.atari import make_atari

    env = VideoRecorder(make_atari("BreakoutNoFrameskip-v4", training=True, render_mode="rgb_array"), tmp_path, episode_trigger=lambda i: i == 0)
    env.reset(seed=0)
    steps, life_ends, stats = play(env)
    env.close()
    assert life_ends >= 2  # episodic life ended the learner's episode (and reset the env) at each lost life
    assert env.videos == [tmp_path / "rl-video-episode-0.mp4"]  # ... yet only one video, of the whole game
    frames = read_frames(env.videos[0])
    assert len(frames) == steps + 1
    assert frames[0].shape == (210, 160, 3)


def test_needs_rgb_array_rendering(tmp_path):
    with pytest.raises(FleetError, match="rgb_array"):
        VideoRecorder(gym.make("CartPole-v1"), tmp_path)


def test_missing_imageio_ffmpeg_names_the_pip_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_ffmpeg(name, *args, **kwargs):
        if name == "imageio_ffmpeg":
            raise ImportError("No module named 'imageio_ffmpeg'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ffmpeg)
    with pytest.raises(FleetError, match="pip install imageio-ffmpeg"):
        VideoRecorder(gym.make("CartPole-v1", render_mode="rgb_array"), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sync", "async", "async-threads"])
def test_training_records_episodes_0_1_and_8_of_env_0_each_its_length_plus_one_frame(tmp_path, backend):
    from conftest import run_fleetrl_here

    # FixedStart-v0 episodes last 20 steps: env 0 plays 10 of them in 200 steps, and CleanRL's schedule records 0, 1 and 8;
    # with stepping threads env 0 renders in a worker's thread, beside env 1. The trainer runs in this process (its async
    # backends' workers are processes of their own still)
    threads = ["--env-workers", "1", "--env-threads", "2"] if backend == "async-threads" else []
    run_dir = tmp_path / "run"
    proc = run_fleetrl_here("train", "ppo", "--env-id", "fleetrl_test_envs:FixedStart-v0", "--env-backend", backend.split("-")[0], *threads,
                            "--num-envs", "2", "--num-steps", "100", "--total-timesteps", "400", "--capture-video", "--run-dir", str(run_dir),
                            "--no-cuda", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == [f"rl-video-episode-{i}.mp4" for i in (0, 1, 8)]
    for video in videos:
        assert len(read_frames(video)) == 20 + 1, video.name


@pytest.mark.parametrize("backend", ["ale", "envpool"])
def test_capture_video_on_a_native_backend_is_refused_with_the_fix(tmp_path, backend):
    require_module("ale_py", "atari")
    if backend == "envpool":
        require_module("envpool", "envpool")
    from fleetrl.envs import make_vector_env

    with pytest.raises(FleetError, match="Use --env-backend sync or async"):
        make_vector_env("BreakoutNoFrameskip-v4", 2, backend, video_dir=str(tmp_path))
    assert not list(tmp_path.iterdir()), "refused before anything was written"
