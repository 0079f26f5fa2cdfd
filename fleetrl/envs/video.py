"""`--capture-video`: record whole episodes of one env to MP4.

    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env = VideoRecorder(EpisodeStats(env), "runs/RUN/videos")   # videos/rl-video-episode-0.mp4, -1, -8, ...

An episode here is a *real* episode: it ends on the step whose info has the key ``"episode"``, which
fleetrl's innermost :class:`~fleetrl.envs.wrappers.EpisodeStats` adds only at the real end (for
Atari: game over, not a lost life). With Atari's episodic-life wrapper the learner's episode ends
at every lost life and the env is reset, but the game goes on underneath; such a reset does not
start a new video, so one video shows one whole game. (An env with neither fleetrl's
``EpisodeStats`` nor gymnasium's ``RecordEpisodeStatistics`` in its wrapper chain has no such key:
there an episode ends at ``terminated or truncated``.)

Frames are ``env.render()`` after the reset that starts an episode and after every step, so a
video of an episode of N steps has N + 1 frames. A reset in the middle of a real episode adds no
frame. The file is written under a hidden temporary name and renamed when the episode ends, so a
crash never leaves a half-written file under the final name; ``close()`` finishes an open video.

Needs ``render_mode="rgb_array"`` and the ``imageio-ffmpeg`` package (``pip install imageio-ffmpeg``),
which ships its own ffmpeg binary. MuJoCo on a machine without a display also needs an off-screen
OpenGL: set ``MUJOCO_GL=egl`` (or ``MUJOCO_GL=osmesa`` where libOSMesa is installed) before the
process starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np

from fleetrl.envs.wrappers import EpisodeStats, game_over
from fleetrl.errors import FleetError
from fleetrl.files import move_into_place, temporary_path

DEFAULT_FPS = 30


def capped_cubic_video_schedule(episode_id: int) -> bool:
    """CleanRL's and gymnasium's default: episodes 0, 1, 8, 27, ..., 729, 1000, then every 1000th."""
    if episode_id < 1000:
        return int(round(episode_id ** (1.0 / 3))) ** 3 == episode_id
    return episode_id % 1000 == 0


def _has_episode_stats(env: gym.Env) -> bool:
    """Whether a wrapper in the chain adds ``info["episode"]`` at the real end of an episode."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, (EpisodeStats, gym.wrappers.RecordEpisodeStatistics)):
            return True
        env = env.env
    return False


def _require_ffmpeg() -> None:
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError as exc:
        raise FleetError(
            f"Recording videos (--capture-video) writes MP4 through imageio's ffmpeg plugin, which is not installed ({exc}). "
            f"Install it with: pip install imageio-ffmpeg imageio"
        ) from None


class VideoRecorder(gym.Wrapper):
    """Records the real episodes that ``episode_trigger(episode_id)`` selects to
    ``{video_dir}/{name_prefix}-episode-{episode_id}.mp4``.

    ``episode_trigger``: episode id (0, 1, 2, ... counting real episodes) -> record it? Default:
    :func:`capped_cubic_video_schedule`. ``fps``: default the env's ``metadata["render_fps"]``, else 30.
    ``videos``: the paths written so far.
    """

    def __init__(
        self,
        env: gym.Env,
        video_dir: str | os.PathLike,
        name_prefix: str = "rl-video",
        episode_trigger: Callable[[int], bool] | None = None,
        fps: float | None = None,
    ):
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise FleetError(
                f"VideoRecorder records frames from env.render(), which needs an env made with render_mode='rgb_array' "
                f"(this one has render_mode={env.render_mode!r}): gym.make(env_id, render_mode='rgb_array')."
            )
        _require_ffmpeg()
        self.video_dir = Path(video_dir)
        self.name_prefix = name_prefix
        self.episode_trigger = episode_trigger or capped_cubic_video_schedule
        self.fps = float(fps or env.metadata.get("render_fps") or DEFAULT_FPS)
        self.videos: list[Path] = []
        self.episode_id = -1  # the current real episode (-1: none started yet)
        self._real_end_key = _has_episode_stats(env)
        self._in_episode = False  # a real episode has started and not ended
        self._writer = None
        self._frames = 0
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._rendered_once = False

    @property
    def recording(self) -> bool:
        return self._final_path is not None

    # ---- gym.Env ------------------------------------------------------------------------------

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if not self._in_episode:  # a new real episode (not the same game after a lost life)
            self._in_episode = True
            self.episode_id += 1
            if self.episode_trigger(self.episode_id):
                self._start(f"{self.name_prefix}-episode-{self.episode_id}")
                self._capture()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.recording:
            self._capture()
        ended = "episode" in info if self._real_end_key else game_over(terminated, truncated)  # a game: every agent
        if ended:
            self._in_episode = False
            self._finish()
        return obs, reward, terminated, truncated, info

    def close(self):
        try:
            self._finish()
        finally:
            super().close()

    # ---- recording ----------------------------------------------------------------------------

    def _start(self, name: str) -> None:
        self._finish()  # never two at once
        self.video_dir.mkdir(parents=True, exist_ok=True)
        self._final_path = self.video_dir / f"{name}.mp4"
        self._tmp_path = temporary_path(self._final_path, suffix=".mp4")  # ffmpeg picks the container from the ending
        self._frames = 0

    def _capture(self) -> None:
        frame = self._render()
        if self._writer is None:
            import imageio.v2 as imageio

            self._writer = imageio.get_writer(
                self._tmp_path, fps=self.fps, codec="libx264", macro_block_size=1, ffmpeg_log_level="error"
            )
        self._writer.append_data(frame)
        self._frames += 1

    def _render(self) -> np.ndarray:
        try:
            frame = self.env.render()
        except gym.error.DependencyNotInstalled as exc:  # e.g. classic control renders with pygame
            raise FleetError(f"Recording videos of {self.env.spec.id if self.env.spec else 'this env'} needs a package that is not installed: {exc}") from None
        except Exception as exc:
            if self._rendered_once or "mujoco" not in type(self.env.unwrapped).__module__:
                raise
            raise FleetError(
                f"Rendering the MuJoCo env failed ({type(exc).__name__}: {exc}). Without a display MuJoCo needs an "
                f"off-screen OpenGL: start the process with MUJOCO_GL=egl (or MUJOCO_GL=osmesa where libOSMesa is installed)."
            ) from None
        self._rendered_once = True
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] not in (3, 4) or frame.dtype != np.uint8:
            raise FleetError(f"VideoRecorder needs RGB uint8 frames (H, W, 3) from env.render(); got {frame.dtype} {frame.shape}.")
        h, w = frame.shape[:2]
        if h % 2 or w % 2:  # H.264 in yuv420p needs even sides: repeat the last row / column
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        return frame

    def _finish(self) -> None:
        """Close the open video (if any) and move it to its final name."""
        if not self.recording:
            return
        writer, tmp, final = self._writer, self._tmp_path, self._final_path
        self._writer, self._tmp_path, self._final_path = None, None, None
        try:
            if writer is not None:
                writer.close()
                move_into_place(tmp, final)
                self.videos.append(final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
