"""The vector interface: same-step autoreset, final observations, done flags and episode statistics."""

import numpy as np
import pytest

from fleetrl.envs import EnvFactory, env_family, make_vector_env
from fleetrl.envs.vector import GymSyncVectorEnv, SyncVectorEnv, episode_stats
from fleetrl.errors import FleetError

COUNTING = "fleetrl_test_envs:Counting-v0"


@pytest.mark.parametrize("backend", ["sync", "gym-sync"])
def test_same_step_autoreset_final_obs_and_done_flags(backend):
    envs = make_vector_env(COUNTING, 3, backend)
    obs, _ = envs.reset(seed=10)
    starts = obs[:, 1].copy()
    assert len(set(starts.tolist())) == 3, "each env gets its own seed"
    # env 0 never presses 1 (truncates at step 7), env 1 presses 1 at step 4 (terminates), env 2 never
    for t in range(1, 8):
        actions = np.array([0, 1 if t == 4 else 0, 0])
        obs, reward, terminated, truncated, info = envs.step(actions)
        np.testing.assert_array_equal(reward, [t, t, t] if t <= 4 else [t, t - 4, t])
        if t == 4:
            assert terminated.tolist() == [False, True, False] and not truncated.any()
            assert info["_final_obs"].tolist() == [False, True, False]
            assert info["final_obs"][1].tolist() == [4.0, starts[1]]  # the last obs of the finished episode
            assert obs[1, 0] == 0.0 and obs[1, 1] != starts[1]  # obs is already the next episode's first
            assert episode_stats(info) == [(1 + 2 + 3 + 4, 4)]
        elif t == 7:
            assert truncated.tolist() == [True, False, True] and not terminated.any()
            assert info["final_obs"][0].tolist() == [7.0, starts[0]]
            assert sorted(episode_stats(info)) == [(28.0, 7), (28.0, 7)]
        else:
            assert not terminated.any() and not truncated.any() and "_final_obs" not in info and episode_stats(info) == []
    envs.close()


def test_fleetrl_sync_matches_gymnasium_sync_vector_env_step_for_step():
    factories = [EnvFactory("CartPole-v1", "classic") for _ in range(4)]
    ours, theirs = SyncVectorEnv(factories), GymSyncVectorEnv(factories)
    obs_a, _ = ours.reset(seed=3)
    obs_b, _ = theirs.reset(seed=3)
    np.testing.assert_array_equal(obs_a, obs_b)
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(600):
        actions = rng.integers(0, 2, 4)
        a, b = ours.step(actions), theirs.step(actions)
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_array_equal(x, y)
        assert episode_stats(a[4]) == episode_stats(b[4])
        if "_final_obs" in b[4]:
            mask = b[4]["_final_obs"]
            np.testing.assert_array_equal(a[4]["final_obs"][mask], b[4]["final_obs"][mask])
            finished += int(mask.sum())
    assert finished > 10


def test_same_seed_gives_the_same_run():
    def run():
        envs = make_vector_env("CartPole-v1", 2)
        obs, _ = envs.reset(seed=5)
        out = [obs]
        for t in range(50):
            out.append(envs.step(np.array([t % 2, (t // 3) % 2]))[0])
        return np.stack(out)

    np.testing.assert_array_equal(run(), run())


def test_family_detection():
    assert env_family("CartPole-v1").name == "classic"
    assert env_family("Pendulum-v1").name == "mujoco" and env_family("Pendulum-v1").continuous
    assert env_family("InvertedPendulum-v5").name == "mujoco"
    assert env_family("BreakoutNoFrameskip-v4").name == "atari"
    assert env_family("ALE/Pong-v5").name == "atari"
    assert env_family(COUNTING).name == "classic"


def test_unknown_env_id_names_the_closest_registered_ids():
    with pytest.raises(FleetError, match="CartPole-v1"):
        env_family("CartPol-v1")
    with pytest.raises(FleetError, match="no_such_module"):
        env_family("no_such_module:Foo-v0")


def test_gym_async_workers_start_as_every_child_does_never_forked_from_the_trainer():
    """gymnasium's AsyncVectorEnv forks by default: a fork of the trainer, which runs threads by then, with its signal
    handlers. fleetrl's children come from the forkserver (fleetrl/processes.py) and ignore SIGTERM from birth."""
    import os
    import signal

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a trainer's handler, as fleetrl.run installs one
    envs = None
    try:
        envs = make_vector_env("fleetrl_test_envs:ProcessProbe-v0", 2, "gym-async")
        obs, _ = envs.reset(seed=0)
        pids, parents, ignores_sigterm = obs.T
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert os.getpid() not in parents, "the workers were forked from this process"
        assert ignores_sigterm.tolist() == [1.0, 1.0]
    finally:
        if envs is not None:
            envs.close()
        signal.signal(signal.SIGTERM, previous)
