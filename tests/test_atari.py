"""Atari on gymnasium + ale-py: preprocessing, and episode returns that are the unclipped game score."""

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.envs import atari, make_vector_env
from fleetrl.envs.vector import episode_stats

from conftest import require_module, run_fleetrl_in_process

pytestmark = pytest.mark.needs("ale_py", "atari")


class RawGameScore(gym.Wrapper):
    """Observes the raw game under all of fleetrl's wrappers: its real score and frame count per game."""

    games: list = []

    def reset(self, **kwargs):
        self.score, self.frames = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += reward
        self.frames += 1
        if terminated or truncated:
            RawGameScore.games.append((self, self.score, self.frames))
        return obs, reward, terminated, truncated, info


def test_reported_return_is_the_unclipped_full_game_score(monkeypatch):
    real_make = gym.make
    monkeypatch.setattr(atari.gym, "make", lambda *a, **k: RawGameScore(real_make(*a, **k)))
    RawGameScore.games = []
    envs = make_vector_env("SpaceInvadersNoFrameskip-v4", 2, training=True)
    envs.reset(seed=1)
    rng = np.random.default_rng(0)
    reported, clipped_sums, lost_lives = [], np.zeros(2), 0
    while len(reported) < 2:
        _, reward, terminated, _, info = envs.step(rng.integers(0, envs.single_action_space.n, 2))
        assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}, "training rewards are clipped"
        clipped_sums += reward
        lost_lives += int(terminated.sum())
        reported += episode_stats(info)
    envs.close()
    raw = {round(score, 3): frames for _, score, frames in RawGameScore.games}
    for episode_return, length in reported:
        assert round(episode_return, 3) in raw, (episode_return, raw)
        # the length is in agent steps: the raw game ran 4 frames per step (fewer only on the last)
        assert 0 <= raw[round(episode_return, 3)] - atari.FRAME_SKIP * length < atari.FRAME_SKIP + atari.NOOP_MAX + 2
    assert max(r for r, _ in reported) > 30, "Space Invaders scores 5-30 per alien: clipping would show"
    assert lost_lives > len(reported), "episodic life ends a training episode at every lost life"


def test_preprocessing_shape_sticky_actions_and_frame_cap():
    env = atari.make_atari("BreakoutNoFrameskip-v4", training=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.unwrapped._frameskip == 1
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == atari.MAX_FRAMES_PER_EPISODE
    env.close()
    v5 = atari.make_atari("ALE/Breakout-v5", training=False)
    assert v5.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    chain = []
    e = v5
    while isinstance(e, gym.Wrapper):
        chain.append(type(e).__name__)
        e = e.env
    assert "EpisodicLife" not in chain and "ClipReward" not in chain, "evaluation plays real games"
    assert atari.make_atari("ALE/Breakout-v5", training=True, sticky_actions=0.0).unwrapped.ale.getFloat("repeat_action_probability") == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["async", "ale", "envpool"])
def test_ppo_trains_breakout_end_to_end_on_each_backend(tmp_path, backend):
    """Two iterations on each backend through the CLI's entry point, in this process (the run is under test, not its
    process); ale is the default's pick (auto), and eval plays that run's checkpoint."""
    if backend == "envpool":
        require_module("envpool", "envpool")
    run_dir = tmp_path / backend
    chosen = [] if backend == "ale" else ["--env-backend", backend]
    # one epoch of 2 minibatches: what is under test is the backend's data reaching the update, not the update (CleanRL's
    # 4 x 4 made it most of the test's time)
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "BreakoutNoFrameskip-v4", *chosen, "--num-envs", "4",
                                  "--num-steps", "32", "--update-epochs", "1", "--num-minibatches", "2", "--total-timesteps", "256",
                                  "--run-dir", str(run_dir), "--no-cuda")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"env backend: {backend}" in proc.stdout
    assert (run_dir / "checkpoints" / "ckpt_000000000256.pt").exists()
    if backend == "ale":
        evaluated = run_fleetrl_in_process("eval", str(run_dir), "--episodes", "1", "--stochastic", "--json")
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
