"""The native vector backends (ale-py's AtariVectorEnv, EnvPool) keep fleetrl's vector interface.

Each check runs on every backend that is installed here; the EnvPool ones skip without envpool.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys

import numpy as np
import pytest

from conftest import require_module, skip_unless_ci
from fleetrl.envs import native
from fleetrl.envs.native import AleVectorEnv, EnvPoolVectorEnv, native_backend_support
from fleetrl.errors import FleetError

pytestmark = pytest.mark.needs("ale_py", "atari")

BREAKOUT = "BreakoutNoFrameskip-v4"
SPACE_INVADERS = "ALE/SpaceInvaders-v5"


def _have_envpool() -> bool:
    try:
        import envpool  # noqa: F401
    except Exception:
        return False
    return True


def need_envpool() -> None:
    """Skip without a working envpool (not installed, or installed but failing to import here); fail under CI=true."""
    require_module("envpool", "envpool")


def make_atari_vec(backend: str, env_id: str, num_envs: int, training: bool, **kwargs):
    if backend == "ale":
        return AleVectorEnv(env_id, num_envs, training, **kwargs)
    need_envpool()
    return EnvPoolVectorEnv(env_id, num_envs, training=training, family="atari", **kwargs)


BACKENDS = ["ale", pytest.param("envpool", marks=pytest.mark.needs("envpool", "envpool"))]


def run_until_games_end(envs, policy, games: int, max_steps: int):
    """Step until `games` real episodes ended; returns per-step records and the finished episodes."""
    steps, episodes = [], []
    for _ in range(max_steps):
        actions = policy()
        obs, reward, terminated, truncated, info = envs.step(actions)
        steps.append((obs, reward, terminated, truncated, info))
        episodes += [(i, info["episode"]["r"][i], info["episode"]["l"][i]) for i in np.flatnonzero(info.get("_episode", []))]
        if len(episodes) >= games:
            break
    return steps, episodes


# ----------------------------------------------------------------------------------------------


def gymnasium_chain_screens(actions, noops: int) -> np.ndarray:
    """The newest frame of each step from the gymnasium chain's preprocessing (fleetrl's MaxAndSkip and Resize
    on ale-py's gymnasium env) after a start of ``noops`` NOOP frames and one FIRE frame, playing ``actions``."""
    import gymnasium as gym

    from fleetrl.envs import atari

    atari.register_ale()
    raw = gym.make(BREAKOUT, obs_type="grayscale", frameskip=1, repeat_action_probability=0.0, full_action_space=False)
    env = atari.Resize(atari.MaxAndSkip(raw))
    try:
        raw.reset(seed=0)
        for _ in range(noops):
            raw.step(0)
        screens = [env.observation(raw.step(1)[0])]
        screens += [env.step(int(a))[0] for a in actions]
        return np.stack(screens)
    finally:
        env.close()


# ALE's native reset starts Breakout's ball elsewhere (its own random start), so that backend's screens may differ
# from the chain's in the pixels of the two balls: at most this many of the 84x84, all else equal
ALE_BALL_PIXELS = 24


@pytest.mark.parametrize("backend", BACKENDS)
def test_atari_screens_equal_the_gymnasium_chains_pixel_for_pixel(backend):
    # 20 steps of the first life: after a lost life each backend serves the ball its own way (native.py's docstring)
    actions = np.random.default_rng(0).integers(0, 4, 20)
    envs = make_atari_vec(backend, BREAKOUT, 1, training=False)
    try:
        screens = [envs.reset(seed=0)[0][0, -1]]
        screens += [envs.step(np.array([a]))[0][0, -1] for a in actions]
        native_screens = np.stack(screens)
    finally:
        envs.close()
    differing = []
    # the noop start is random: align on the start that matches best (ALE's differs in its ball anyway: one start does)
    for noops in range(0, 31) if backend == "envpool" else [0]:
        diff = gymnasium_chain_screens(actions, noops) != native_screens
        differing.append(diff.reshape(len(diff), -1).sum(axis=1))
        if not differing[-1].any():
            break
    best = min(differing, key=lambda d: d.sum())
    if backend == "envpool":
        assert not best.any(), f"pixels differing per step: {best.tolist()}"
    else:
        assert best.max() <= ALE_BALL_PIXELS and native_screens.max() > 0, f"pixels differing per step: {best.tolist()}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_atari_observations_match_the_gymnasium_chain(backend):
    from fleetrl.envs.atari import make_atari

    ref = make_atari(BREAKOUT, training=True)
    envs = make_atari_vec(backend, BREAKOUT, 2, training=True)
    try:
        assert envs.num_envs == 2
        assert envs.single_observation_space.shape == ref.observation_space.shape == (4, 84, 84)
        assert envs.single_observation_space.dtype == ref.observation_space.dtype == np.uint8
        assert envs.single_action_space.n == ref.action_space.n
        obs, info = envs.reset(seed=0)
        assert info == {}
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        # as FrameStackObservation does, a new game's stack repeats its first frame (ALE pads zeros)
        ref_obs, _ = ref.reset(seed=0)
        for o in (*obs, ref_obs):
            assert all(np.array_equal(o[0], o[k]) for k in range(4))
        first = obs[:, 3].copy()
        obs, reward, terminated, truncated, info = envs.step(np.ones(2, np.int64))
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert all(np.array_equal(obs[:, k], first) for k in range(3))
        assert reward.shape == terminated.shape == truncated.shape == (2,)
        assert terminated.dtype == truncated.dtype == bool
        assert info == {}  # the keys appear only on steps where an env finished
        assert obs.max() > 0  # a real screen, not a blank
    finally:
        envs.close()
        ref.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeds_are_distinct_per_env_and_reproducible(backend):
    def rollout(seed):
        envs = make_atari_vec(backend, SPACE_INVADERS, 3, training=False)  # sticky 0.25: seeds matter
        try:
            rng = np.random.default_rng(0)
            frames = [envs.reset(seed=seed)[0]]
            for _ in range(60):
                frames.append(envs.step(rng.integers(0, envs.single_action_space.n, 3))[0])
            return np.stack(frames)  # (T, envs, 4, 84, 84)
        finally:
            envs.close()

    a, b, c = rollout(5), rollout(5), rollout(6)
    assert np.array_equal(a, b), "the same seed must give the same run"
    assert not np.array_equal(a, c), "another seed must give another run"
    # same actions, different per-env seeds: no two envs follow the same trajectory
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.array_equal(a[:, i], a[:, j])


def test_ale_truncation_at_the_frame_cap_and_final_obs():
    """NOOPs without FIRE after a lost life: Breakout never serves again after the first lost life, so the cap ends it."""
    envs = AleVectorEnv(BREAKOUT, 2, training=False, max_num_frames_per_episode=400, fire_on_life_loss=False)  # 100 agent steps
    try:
        envs.reset(seed=0)
        prev = None
        for t in range(100):
            obs, reward, terminated, truncated, info = envs.step(np.zeros(2, np.int64))
            if t < 99:
                assert not truncated.any() and not terminated.any() and "final_obs" not in info
                prev = obs
        assert truncated.all() and not terminated.any()
        assert info["_final_obs"].all() and info["_episode"].all()
        assert info["episode"]["l"].tolist() == [100, 100]
        # final_obs continues the last frames (stack shifts by one); obs is a fresh game's first stack
        assert np.array_equal(info["final_obs"][:, :3], prev[:, 1:])
        assert not np.array_equal(obs, info["final_obs"])
        assert all(np.array_equal(o[0], o[k]) for o in obs for k in range(1, 4)), "a reset stack repeats its frame"
    finally:
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_ends_episodes_on_life_loss_but_reports_the_full_game(backend):
    """NOOP policy in training: each lost life terminates for the learner, FIRE relaunches the ball,
    and info["episode"] comes once, at game over, with the length of the whole game."""
    envs = make_atari_vec(backend, BREAKOUT, 2, training=True)
    try:
        obs, _ = envs.reset(seed=3)
        terms = np.zeros(2, int)
        length = np.zeros(2, int)
        done_games = {}
        for _ in range(600):
            prev = obs
            obs, reward, terminated, truncated, info = envs.step(np.zeros(2, np.int64))
            length += 1
            assert not truncated.any()
            for i in np.flatnonzero(terminated):
                terms[i] += 1
                assert info["_final_obs"][i]
                assert np.array_equal(info["final_obs"][i, :3], prev[i, 1:]), "final_obs is the last obs of that life"
                if not info.get("_episode", np.zeros(2, bool))[i]:  # a lost life only: the game goes on
                    if backend == "ale":
                        assert np.array_equal(obs[i], info["final_obs"][i])
            for i in np.flatnonzero(info.get("_episode", [])):
                if i not in done_games:
                    done_games[i] = (terms[i], info["episode"]["l"][i], length[i], info["episode"]["r"][i])
            if len(done_games) == 2:
                break
        assert len(done_games) == 2, "the game stalled: FIRE was not pressed after a lost life"
        for i, (n_terms, ep_len, steps, ret) in done_games.items():
            assert n_terms == 5, "4 lost lives + game over, each a terminated step for the learner"
            assert ep_len == steps, "the episode length is the whole game in agent steps"
            assert ret == 0.0
    finally:
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_returns_are_the_unclipped_game_score(backend):
    rng = np.random.default_rng(0)
    n = 3

    def policy():
        return rng.integers(0, 6, n)

    # evaluation: rewards are raw, and the statistics are their sum and the step count
    envs = make_atari_vec(backend, SPACE_INVADERS, n, training=False)
    try:
        envs.reset(seed=0)
        steps, episodes = run_until_games_end(envs, policy, games=1, max_steps=3000)
        assert episodes, "no game ended"
        i, ret, length = episodes[0]
        rewards = [s[1][i] for s in steps]
        assert any(r > 1 for r in rewards), "SpaceInvaders scores 5-30 per invader"
        assert ret == pytest.approx(sum(rewards)) and length == len(steps)
        assert sum(s[2][i] for s in steps) == 1, "evaluation: only game over terminates"
    finally:
        envs.close()

    # training: clipped rewards, but the reported return is still the raw score of the full game
    envs = make_atari_vec(backend, SPACE_INVADERS, n, training=True)
    try:
        envs.reset(seed=0)
        steps, episodes = run_until_games_end(envs, policy, games=1, max_steps=3000)
        assert episodes
        i, ret, length = episodes[0]
        rewards = np.array([s[1][i] for s in steps])
        assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
        assert length == len(steps)
        assert ret > rewards.sum() > 0, "the reported return must be the unclipped score"
        assert sum(s[2][i] for s in steps) > 1, "training: lost lives terminate too"
    finally:
        envs.close()


def test_envpool_cartpole_terminated_and_truncated_apart():
    need_envpool()
    envs = EnvPoolVectorEnv("CartPole-v1", 4, training=True, family="classic", max_episode_steps=20)
    try:
        envs.reset(seed=0)
        rng = np.random.default_rng(0)
        seen = {"terminated": 0, "truncated": 0}
        lengths = np.zeros(4, int)
        for _ in range(300):
            obs, reward, terminated, truncated, info = envs.step(rng.integers(0, 2, 4))
            lengths += 1
            assert not (terminated & truncated).any()
            ended = terminated | truncated
            if not ended.any():
                assert info == {}
                continue
            assert np.array_equal(info["_final_obs"], ended) and np.array_equal(info["_episode"], ended)
            for i in np.flatnonzero(ended):
                final = info["final_obs"][i]
                assert np.abs(obs[i]).max() <= 0.05, "obs is already the next episode's first obs"
                assert info["episode"]["l"][i] == lengths[i]
                assert info["episode"]["r"][i] == lengths[i]  # CartPole pays 1 per step
                if terminated[i]:
                    seen["terminated"] += 1
                    assert abs(final[0]) > 2.4 or abs(final[2]) > 0.2095, "final_obs is the failing state"
                else:
                    seen["truncated"] += 1
                    assert lengths[i] == 20
                lengths[i] = 0
        assert seen["terminated"] > 0 and seen["truncated"] > 0
        assert np.array_equal(envs.reset(seed=0)[0], EnvPoolVectorEnv("CartPole-v1", 4, training=True, family="classic").reset(seed=0)[0])
    finally:
        envs.close()


def test_envpool_procgen():
    need_envpool()
    if not native_backend_support("BigfishEasy-v0", "procgen")["envpool"]:
        skip_unless_ci("EnvPool's Procgen does not load here (it needs the system Qt 5 runtime: apt-get install libqt5gui5)",
                       ci_provides=shutil.which("apt-get") is not None)  # .ci/run installs it where apt is
    envs = EnvPoolVectorEnv("BigfishEasy-v0", 2, training=True, family="procgen")
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, *envs.single_observation_space.shape) == (2, 3, 64, 64) and obs.dtype == np.uint8
        for _ in range(20):
            obs, *_ = envs.step(np.zeros(2, np.int64))
        assert obs.shape == (2, 3, 64, 64)
    finally:
        envs.close()


def _threads_and_children() -> tuple[int, int]:
    import psutil

    proc = psutil.Process()
    return len(os.listdir("/proc/self/task")), len(proc.children(recursive=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_leaves_no_threads_or_processes(backend):
    gc.collect()
    before = _threads_and_children()
    # two envs: the pool's threads are started all the same, at half the emulators' start-up cost of four
    envs = make_atari_vec(backend, BREAKOUT, 2, training=True)
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    assert _threads_and_children()[0] > before[0], "the vector runs threads of its own, which close must end"
    envs.close()
    gc.collect()
    assert _threads_and_children() == before


def test_native_backend_support():
    assert native_backend_support(BREAKOUT, "atari")["ale"]
    assert native_backend_support("ALE/Breakout-v5", "atari")["ale"]
    assert not native_backend_support("CartPole-v1", "classic")["ale"]
    assert native_backend_support("NoSuchGameNoFrameskip-v4", "atari") == {"ale": False, "envpool": False}
    assert native_backend_support("CartPole-v1", "classic")["envpool"] == _have_envpool()
    assert native_backend_support(SPACE_INVADERS, "atari")["envpool"] == _have_envpool()


def test_atari_id_mapping():
    assert native.atari_game_name(BREAKOUT) == "breakout"
    assert native.atari_game_name("ALE/SpaceInvaders-v5") == "space_invaders"
    assert native.atari_game_name("MsPacmanNoFrameskip-v4") == "ms_pacman"
    assert native.envpool_task_id("SpaceInvadersNoFrameskip-v4", "atari") == "SpaceInvaders-v5"
    assert native.envpool_task_id("ALE/TicTacToe3D-v5", "atari") == "TicTacToe3d-v5"
    assert native.envpool_task_id("Bigfish-v0", "procgen") == "BigfishHard-v0"
    assert native.envpool_task_id("CoinrunEasy-v0", "procgen") == "CoinrunEasy-v0"
    assert native.envpool_task_id("HalfCheetah-v5", "mujoco") == "HalfCheetah-v5"


def test_missing_envpool_is_a_clear_fleet_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # makes `import envpool` raise ImportError
    with pytest.raises(FleetError, match="pip install"):
        EnvPoolVectorEnv("CartPole-v1", 2, training=True, family="classic")


@pytest.mark.parametrize("env_id,family", [("CartPole-v1", "classic"), ("InvertedPendulum-v5", "mujoco")])
def test_envpool_spaces_match_gymnasium(env_id, family):
    need_envpool()
    if family == "mujoco":
        require_module("mujoco", "mujoco")
    import gymnasium as gym

    ref = gym.make(env_id)
    envs = EnvPoolVectorEnv(env_id, 2, training=True, family=family)
    try:
        assert envs.single_observation_space.shape == ref.observation_space.shape
        assert envs.single_observation_space.dtype == ref.observation_space.dtype
        assert type(envs.single_action_space) is type(ref.action_space)
        assert envs.single_action_space.shape == ref.action_space.shape
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, *ref.observation_space.shape) and obs.dtype == ref.observation_space.dtype
        actions = np.stack([ref.action_space.sample() for _ in range(2)]).astype(np.float32 if family == "mujoco" else np.int64)
        obs, reward, terminated, truncated, info = envs.step(actions)
        assert obs.shape == (2, *ref.observation_space.shape) and reward.dtype == np.float64
    finally:
        envs.close()
        ref.close()
