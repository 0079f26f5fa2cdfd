"""make_vec (fleetrl/envs/gym_vector.py) against gymnasium's own SyncVectorEnv, in NEXT_STEP mode (gymnasium's default,
and make_vec's) and SAME_STEP mode: the same env functions and seeds step identically on every backend that can take
the env, checked with gymnasium's data_equivalence on gymnasium's own test envs and spaces (tests/gymnasium_vendored/),
CartPole, Breakout and a MuJoCo env; a gymnasium 1.x script runs on make_vec with the one line changed."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import os
import runpy
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from fleetrl.envs import EnvFactory, make_vec
from fleetrl.envs.gym_vector import FleetVectorEnv
from fleetrl.errors import FleetError
from gymnasium_vendored.spaces_utils import TESTING_SPACES, TESTING_SPACES_IDS
from gymnasium_vendored.testing_env import GenericTestEnv
from gymnasium_vendored.vector_utils import count_reset, count_step, make_env

SAME_STEP, NEXT_STEP = AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP
MODES = [NEXT_STEP, SAME_STEP]
ARRAY_SPACES = (Box, Discrete, MultiBinary, MultiDiscrete)
ROOT = Path(__file__).resolve().parent.parent
FN_BACKENDS = ["sync", "async"]  # the backends that take env functions (auto picks one of them)


# ---- helpers -----------------------------------------------------------------------------------------------------


def info_step(self: GenericTestEnv, action):
    """Ends episodes at different steps per env (terminated every max_count steps, truncated at 7), with infos of
    every kind gymnasium batches: ints, floats, arrays, nested dicts, None and keys only some steps have."""
    self.count = getattr(self, "count", 0) + 1
    terminated, truncated = self.count % self.max_count == 0, self.count % 7 == 0
    info = {"count": self.count, "half": self.count / 2, "vec": np.full(2, self.count, np.int16), "nested": {"even": self.count % 2 == 0}}
    if self.count % 3 == 0:
        info["sometimes"] = None
    if terminated or truncated:
        self.count = 0
    return self.observation_space.sample(), float(self.count), terminated, truncated, info


def generic_env(space, max_count: int, action_space=None) -> GenericTestEnv:
    # a copy of the space for each env: GenericTestEnv samples its observations from it, so a shared one would make
    # every env (and both vectors compared) draw from one RNG
    env = GenericTestEnv(observation_space=copy.deepcopy(space), action_space=copy.deepcopy(action_space or Discrete(3)),
                         step_func=info_step)
    env.max_count = max_count
    return env


def generic_fns(space, n: int = 3, action_space=None) -> list:
    return [functools.partial(generic_env, space, 3 + i, action_space) for i in range(n)]


def same_steps(a: gym.vector.VectorEnv, b: gym.vector.VectorEnv, steps: int, seed: int = 0, drop=()) -> int:
    """Step both with the same actions; assert every output agrees (data_equivalence, exact). Returns the episodes
    that ended, so a test can check it saw some. ``drop``: keys of the episode statistics to leave out (times), in
    ``info["episode"]`` (NEXT_STEP) or ``info["final_info"]["episode"]`` (SAME_STEP)."""
    obs_a, info_a = a.reset(seed=seed)
    obs_b, info_b = b.reset(seed=seed)
    assert data_equivalence(obs_a, obs_b, exact=True) and data_equivalence(info_a, info_b, exact=True)
    a.action_space.seed(seed)
    ended = 0
    for t in range(steps):
        actions = a.action_space.sample()
        out_a, out_b = a.step(actions), b.step(actions)
        for info in (out_a[4], out_b[4]):
            for key in drop:
                info.get("final_info", {}).get("episode", {}).pop(key, None)
                info.get("episode", {}).pop(key, None)
        for name, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), out_a, out_b):
            assert data_equivalence(x, y, exact=True), f"step {t}: {name} differs:\n{x}\n{y}"
        ended += int(np.sum(out_a[2] | out_a[3]))
    return ended


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


MULTIPROCESSING_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def started_by_the_vector(before: set[int]) -> set[int]:
    """The processes that appeared since ``before``, less multiprocessing's own helpers (its forkserver and resource
    tracker start with the first process that needs them, whichever test that is, and outlive every vector env). The
    helpers are this process's own children; the forkserver's children (the workers) carry its command line too."""
    helpers = set()
    for proc in psutil.Process().children(recursive=False):
        try:
            if any(helper in " ".join(proc.cmdline()) for helper in MULTIPROCESSING_HELPERS):
                helpers.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return children() - before - helpers


def running(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


# ---- the vector env contract ---------------------------------------------------------------------------------


def test_make_vec_is_a_gymnasium_vector_env_in_gymnasiums_default_autoreset_mode():
    fns = generic_fns(Box(0, 1, (2,)))
    reference = SyncVectorEnv(fns)
    envs = make_vec(fns, backend="sync", verbose=False)
    try:
        assert isinstance(envs, gym.vector.VectorEnv)
        assert envs.metadata["autoreset_mode"] == reference.metadata["autoreset_mode"] == NEXT_STEP and envs.num_envs == 3
        assert envs.observation_space == gym.vector.utils.batch_space(Box(0, 1, (2,)), 3)
        assert envs.action_space == gym.vector.utils.batch_space(Discrete(3), 3)
    finally:
        envs.close()
        reference.close()
    for asked in (SAME_STEP, "SameStep"):  # the enum or its value, as SyncVectorEnv takes it
        envs = make_vec(fns, backend="sync", verbose=False, autoreset_mode=asked)
        assert envs.metadata["autoreset_mode"] == SAME_STEP
        envs.close()
    assert type(envs).metadata["autoreset_mode"] == SAME_STEP, "an instance's mode is its own, not the class's"
    for refused in (AutoresetMode.DISABLED, "sometimes"):
        with pytest.raises(FleetError, match=r"NEXT_STEP \(the default\) or SAME_STEP.*DISABLED.*SyncVectorEnv"):
            make_vec(fns, backend="sync", verbose=False, autoreset_mode=refused)


def same_info(info: dict, expected: dict) -> bool:
    """data_equivalence, but a final observation of a Discrete space compares by value: the backends keep observations
    in a numpy array, so the env's Python int 2 comes back as numpy's int64 2 (docs/backends.md, make_vec)."""
    final_obs, expected_obs = info.pop("final_obs"), expected.pop("final_obs")
    return list(final_obs) == list(expected_obs) and data_equivalence(info, expected)


def counter(max_count: int) -> GenericTestEnv:
    """gymnasium's counting env: the observation counts the episode's steps, the reward is the action."""
    env = GenericTestEnv(action_space=Discrete(5), observation_space=Discrete(5), reset_func=count_reset, step_func=count_step)
    env.max_count = max_count
    return env


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_autoreset_as_gymnasiums_own_next_step_test_expects(backend):
    # gymnasium's tests/vector/test_autoreset_mode.py::test_autoreset_next_step, with max_count set by the env functions:
    # the step after an end is the reset step (observation 0, reward 0 whatever the action, no flags); that the env was
    # not stepped there shows in the count that follows (1, not 2)
    envs = make_vec([functools.partial(counter, m) for m in (2, 3, 3)], backend=backend, verbose=False,
                    env_workers=1 if backend == "async" else None, env_threads=1 if backend == "async" else None)
    try:
        obs, info = envs.reset()
        assert np.all(obs == [0, 0, 0]) and info == {}
        expected = [([1, 1, 1], [1, 2, 3], [False, False, False]), ([2, 2, 2], [1, 2, 3], [True, False, False]),
                    ([0, 3, 3], [0, 2, 3], [False, True, True]), ([1, 0, 0], [1, 0, 0], [False, False, False]),
                    ([2, 1, 1], [1, 2, 3], [True, False, False])]
        for t, (want_obs, want_rewards, want_terminations) in enumerate(expected):
            obs, rewards, terminations, truncations, info = envs.step([1, 2, 3])
            assert np.all(obs == want_obs) and np.all(rewards == want_rewards), (t, obs, rewards)
            assert np.all(terminations == want_terminations) and not truncations.any() and info == {}, (t, terminations, info)
    finally:
        envs.close()


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_autoreset_as_gymnasiums_own_same_step_test_expects(backend):
    # gymnasium's tests/vector/test_autoreset_mode.py::test_autoreset_within_step, with max_count set by the env functions
    envs = make_vec([functools.partial(counter, m) for m in (2, 3, 3)], backend=backend, verbose=False, autoreset_mode=SAME_STEP,
                    env_workers=1 if backend == "async" else None, env_threads=1 if backend == "async" else None)
    try:
        obs, info = envs.reset()
        assert np.all(obs == [0, 0, 0]) and info == {}
        obs, rewards, terminations, truncations, info = envs.step([1, 2, 3])
        assert np.all(obs == [1, 1, 1]) and np.all(rewards == [1, 2, 3]) and not terminations.any() and info == {}
        obs, rewards, terminations, truncations, info = envs.step([1, 2, 3])
        assert np.all(obs == [0, 2, 2]) and np.all(terminations == [True, False, False]) and not truncations.any()
        assert same_info(info, {"final_obs": np.array([2, None, None], dtype=object), "final_info": {},
                                "_final_obs": np.array([True, False, False]), "_final_info": np.array([True, False, False])})
        obs, rewards, terminations, truncations, info = envs.step([1, 2, 3])
        assert np.all(obs == [1, 0, 0]) and np.all(terminations == [False, True, True])
        assert same_info(info, {"final_obs": np.array([None, 3, 3], dtype=object), "final_info": {},
                                "_final_obs": np.array([False, True, True]), "_final_info": np.array([False, True, True])})
    finally:
        envs.close()


ARRAY_TEST_SPACES = [(s, i) for s, i in zip(TESTING_SPACES, TESTING_SPACES_IDS) if isinstance(s, ARRAY_SPACES)]
OTHER_TEST_SPACES = [(s, i) for s, i in zip(TESTING_SPACES, TESTING_SPACES_IDS) if not isinstance(s, ARRAY_SPACES)]


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", FN_BACKENDS)
@pytest.mark.parametrize("space", [s for s, _ in ARRAY_TEST_SPACES], ids=[i for _, i in ARRAY_TEST_SPACES])
def test_steps_as_sync_vector_env_on_gymnasiums_test_spaces(space, backend, mode):
    fns = generic_fns(space)
    envs = make_vec(fns, backend=backend, verbose=False, env_workers=1 if backend == "async" else None,
                    env_threads=1 if backend == "async" else None, autoreset_mode=mode)
    reference = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert same_steps(envs, reference, steps=15, seed=7) > 3
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("action_space", [Box(-1, 1, (2,)), MultiDiscrete([2, 3]), MultiBinary(3)], ids=str)
def test_steps_as_sync_vector_env_with_other_action_spaces_on_async(action_space, mode):
    fns = generic_fns(Box(0, 1, (3,)), action_space=action_space)
    envs = make_vec(fns, backend="async", verbose=False, env_workers=1, env_threads=1, autoreset_mode=mode)
    reference = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert same_steps(envs, reference, steps=10) > 0
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("space", [s for s, _ in OTHER_TEST_SPACES], ids=[i for _, i in OTHER_TEST_SPACES])
def test_structured_observations_are_refused_with_the_fix(space):
    with pytest.raises(FleetError, match="FlattenObservation"):
        make_vec(generic_fns(space), backend="sync", verbose=False)


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", ["sync", "async", "auto"])
def test_cartpole_env_functions_step_as_sync_vector_env_with_episode_statistics(backend, mode, capsys):
    # gymnasium's own tests/vector/testing_utils.py make_env, with CleanRL's per-env RecordEpisodeStatistics
    fns = [lambda i=i: gym.wrappers.RecordEpisodeStatistics(make_env("CartPole-v1", i)()) for i in range(4)]
    envs = make_vec(fns, backend=backend, autoreset_mode=mode)
    reference = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        if backend == "auto":
            assert "env backend: " in capsys.readouterr().out and envs.backend_reason.startswith("auto: ")
        assert same_steps(envs, reference, steps=200, drop=("t", "_t")) >= 4  # episode times are wall clock
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_vector_episode_statistics_wrapper_reads_make_vec_as_it_reads_sync_vector_env(backend, mode):
    fns = [functools.partial(gym.make, "CartPole-v1") for _ in range(3)]
    envs = gym.wrappers.vector.RecordEpisodeStatistics(make_vec(fns, backend=backend, verbose=False, autoreset_mode=mode))
    reference = gym.wrappers.vector.RecordEpisodeStatistics(SyncVectorEnv(fns, autoreset_mode=mode))
    try:
        envs.reset(seed=1)
        reference.reset(seed=1)
        rng, seen = np.random.default_rng(0), 0
        for _ in range(150):
            actions = rng.integers(0, 2, 3)
            *_, info = envs.step(actions)
            *_, ref_info = reference.step(actions)
            assert ("_episode" in info) == ("_episode" in ref_info)
            if "_episode" in info:
                seen += int(info["_episode"].sum())
                assert np.array_equal(info["_episode"], ref_info["_episode"])
                for key in ("r", "l"):
                    assert np.array_equal(info["episode"][key], ref_info["episode"][key])
        assert seen >= 3
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", ["sync", "async", "auto"])
def test_env_id_steps_as_sync_vector_env_of_fleetrls_own_envs(backend, mode):
    envs = make_vec("CartPole-v1", 3, backend, verbose=False, autoreset_mode=mode)
    reference = SyncVectorEnv([EnvFactory("CartPole-v1", "classic") for _ in range(3)], autoreset_mode=mode)
    try:
        assert same_steps(envs, reference, steps=150, seed=3) >= 3
    finally:
        envs.close()
        reference.close()


@pytest.mark.needs("mujoco", "mujoco")
@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_mujoco_env_steps_as_sync_vector_env(backend, mode):
    envs = make_vec("InvertedPendulum-v5", 2, backend, verbose=False, autoreset_mode=mode)
    reference = SyncVectorEnv([EnvFactory("InvertedPendulum-v5", "mujoco") for _ in range(2)], autoreset_mode=mode)
    try:
        assert same_steps(envs, reference, steps=60, seed=5) >= 2
    finally:
        envs.close()
        reference.close()


@pytest.mark.needs("ale_py", "atari")
@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_atari_id_steps_as_sync_vector_env_with_fleetrls_atari_chain(backend, mode):
    envs = make_vec("BreakoutNoFrameskip-v4", 2, backend, verbose=False, autoreset_mode=mode)
    reference = SyncVectorEnv([EnvFactory("BreakoutNoFrameskip-v4", "atari") for _ in range(2)], autoreset_mode=mode)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        # a lost life ends a training episode: with this seed, at steps 22 and 45, so 60 steps cross two autoresets
        assert same_steps(envs, reference, steps=60, seed=2) >= 1
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("backend, env_id, needs", [("ale", "BreakoutNoFrameskip-v4", "ale_py"), ("envpool", "BreakoutNoFrameskip-v4", "envpool"),
                                                    ("envpool", "CartPole-v1", "envpool")])
def test_cpp_backends_keep_gymnasiums_same_step_conventions(backend, env_id, needs):
    # their C++ envs start episodes with their own RNG, so they are not step for step gymnasium's Python envs: this
    # checks the contract instead (same-step autoreset, final_obs / final_info with masks, episode statistics)
    from conftest import require_module

    require_module(needs, "atari" if needs == "ale_py" else "envpool")
    envs = make_vec(env_id, 4, backend, verbose=False, autoreset_mode=SAME_STEP)
    try:
        assert isinstance(envs, FleetVectorEnv) and envs.backend == backend
        obs, info = envs.reset(seed=0)
        assert obs.shape == (4, *envs.single_observation_space.shape) and info == {}
        envs.action_space.seed(0)
        finals = episodes = 0
        # 200 steps: with seed 0 lives are lost from step 20 and the first games end at steps 118 (ale) and 148 (envpool)
        for _ in range(200):
            obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
            assert obs in envs.observation_space and reward.shape == (4,) and terminated.dtype == bool
            done = terminated | truncated
            assert ("_final_obs" in info) == bool(done.any())
            if done.any():
                finals += 1
                assert np.array_equal(info["_final_obs"], done) and np.array_equal(info["_final_info"], done)
                assert info["final_obs"].dtype == object
                for i in range(4):
                    assert (info["final_obs"][i] is None) != bool(done[i])
                    if done[i]:
                        assert info["final_obs"][i] in envs.single_observation_space
                if "_episode" in info["final_info"]:
                    episodes += int(info["final_info"]["_episode"].sum())
                    assert not (info["final_info"]["_episode"] & ~done).any()
        assert finals > 0 and episodes > 0
    finally:
        envs.close()


PROCGEN = "BigfishEasy-v0"  # an EnvPool-only family with no no-op action


def need_cpp_backend(backend: str, env_id: str) -> None:
    """Skip (fail under CI) without the backend's module, or without the Qt 5 runtime EnvPool's Procgen loads."""
    import shutil

    from conftest import require_module, skip_unless_ci
    from fleetrl.envs.native import native_backend_support

    require_module("ale_py" if backend == "ale" else "envpool", "atari" if backend == "ale" else "envpool")
    if env_id == PROCGEN and not native_backend_support(PROCGEN, "procgen")["envpool"]:
        skip_unless_ci("EnvPool's Procgen does not load here (it needs the system Qt 5 runtime: apt-get install libqt5gui5)",
                       ci_provides=shutil.which("apt-get") is not None)


@pytest.mark.parametrize("backend, env_id", [("ale", "BreakoutNoFrameskip-v4"), ("envpool", "BreakoutNoFrameskip-v4"),
                                             ("envpool", PROCGEN), ("envpool", "CartPole-v1")])
def test_cpp_backends_in_next_step_mode_ignore_the_reset_steps_action_and_count_only_the_agents_steps(backend, env_id):
    # two vectors with one seed get the same actions but at reset steps, where one gets others: if a reset step took
    # the action, the two would part there. training=False: every Atari end is a game over, which the C++ env resets
    # itself (ale: a NOOP as the reset step; EnvPool, every family: its own next-step reset step)
    need_cpp_backend(backend, env_id)
    a = make_vec(env_id, 4, backend, verbose=False, training=False)
    b = make_vec(env_id, 4, backend, verbose=False, training=False)
    try:
        assert a.metadata["autoreset_mode"] == NEXT_STEP and a.backend == backend
        obs_a, _ = a.reset(seed=1)
        obs_b, _ = b.reset(seed=1)
        assert np.array_equal(obs_a, obs_b)
        rng, n = np.random.default_rng(0), a.single_action_space.n
        resetting, steps, reset_steps, lengths = np.zeros(4, bool), np.zeros(4, np.int64), 0, []
        # 300 steps: with these seeds each env's first game ends by step 170 (Bigfish: 164, CartPole: 20), so every env
        # takes a reset step and plays on for over 100 steps after it, where a reset step that took the action would show
        for _ in range(300):
            actions = rng.integers(0, n, 4)
            out_a = a.step(actions)
            out_b = b.step(np.where(resetting, (actions + 1) % n, actions))
            for x, y in zip(out_a[:4], out_b[:4]):
                assert np.array_equal(x, y)
            obs, reward, terminated, truncated, info = out_a
            assert not (reward[resetting].any() or terminated[resetting].any() or truncated[resetting].any())
            steps += ~resetting  # the steps the agent acted in
            done = terminated | truncated
            if "_episode" in info:
                assert np.array_equal(info["_episode"], done)
                lengths += [(int(info["episode"]["l"][i]), int(steps[i])) for i in np.flatnonzero(done)]
            reset_steps += int(resetting.sum())
            steps[done] = 0
            resetting = done
        assert reset_steps > 0 and lengths and all(l == acted for l, acted in lengths), lengths
    finally:
        a.close()
        b.close()


class ReplayedCartPole(gym.Wrapper):
    """gymnasium's own CartPole-v1 whose episodes start in the given states, one per reset (CartPole's observation is
    its whole state): EnvPool's episodes, stepped by gymnasium's physics."""

    def __init__(self, starts: list[np.ndarray]):
        super().__init__(gym.make("CartPole-v1"))
        self.starts = iter(starts)

    def reset(self, **kwargs):
        _, info = self.env.reset(**kwargs)
        self.env.unwrapped.state = np.array(next(self.starts), np.float64)
        return np.array(self.env.unwrapped.state, np.float32), info


def test_cartpole_on_envpool_in_next_step_mode_gives_the_episodes_of_gymnasiums_sync_vector_env():
    # EnvPool's CartPole draws its starts with its own RNG: gymnasium's SyncVectorEnv(NEXT_STEP) replays them (from the
    # first observation of each episode, make_vec's reset and reset steps) with the same actions, and its
    # RecordEpisodeStatistics counts the episodes; make_vec's flags, rewards, observations and info["episode"] agree
    need_cpp_backend("envpool", "CartPole-v1")
    n, steps = 3, 400
    envs = make_vec("CartPole-v1", n, "envpool", verbose=False)
    rng = np.random.default_rng(4)
    actions = rng.integers(0, 2, (steps, n))
    try:
        obs, info = envs.reset(seed=7)
        assert info == {}
        starts, outs, resetting = [[row] for row in obs], [], np.zeros(n, bool)
        for t in range(steps):
            out = envs.step(actions[t])
            for i in np.flatnonzero(resetting):
                starts[i].append(out[0][i])
            outs.append(out)
            resetting = out[2] | out[3]
    finally:
        envs.close()
    reference = gym.wrappers.vector.RecordEpisodeStatistics(
        SyncVectorEnv([functools.partial(ReplayedCartPole, starts[i]) for i in range(n)], autoreset_mode=NEXT_STEP))
    try:
        ref_obs, _ = reference.reset()
        assert np.array_equal(ref_obs, np.stack([s[0] for s in starts]))
        episodes = 0
        for t in range(steps):
            obs, reward, terminated, truncated, info = outs[t]
            ref_obs, ref_reward, ref_terminated, ref_truncated, ref_info = reference.step(actions[t])
            assert np.allclose(obs, ref_obs, atol=1e-5), t
            assert np.array_equal(reward, ref_reward) and np.array_equal(terminated, ref_terminated), t
            assert np.array_equal(truncated, ref_truncated), t
            # make_vec's statistics are where gymnasium's per-env RecordEpisodeStatistics puts them: the finished
            # step's info["episode"] (r, l), with the mask info["_episode"], and nothing on other steps
            assert set(info) == ({"episode", "_episode"} if "_episode" in ref_info else set()), (t, info)
            if "_episode" in ref_info:
                assert np.array_equal(info["_episode"], ref_info["_episode"])
                for i in np.flatnonzero(ref_info["_episode"]):
                    assert info["episode"]["l"][i] == ref_info["episode"]["l"][i], (t, i)
                    assert info["episode"]["r"][i] == ref_info["episode"]["r"][i], (t, i)
                episodes += int(ref_info["_episode"].sum())
        assert episodes >= 3 * n
    finally:
        reference.close()


def test_a_first_ready_envpool_cannot_run_next_step_and_says_what_to_do():
    # make_vec never builds a first-ready EnvPool (it takes no async_batch): the backend refuses the combination itself
    need_cpp_backend("envpool", "CartPole-v1")
    from fleetrl.envs.native import EnvPoolVectorEnv

    with pytest.raises(FleetError, match=r"first 2 of 4 envs ready \(async_batch=2\)\. Leave async_batch out.*next_step=False"):
        EnvPoolVectorEnv("CartPole-v1", 4, family="classic", training=True, async_batch=2, next_step=True)
    envs = EnvPoolVectorEnv("CartPole-v1", 4, family="classic", training=True, async_batch=2)
    try:
        with pytest.raises(FleetError, match=r"first 2 of 4 envs ready"):
            envs.next_step = True
    finally:
        envs.close()


LEAVE_EARLY = "fleetrl_test_games.leave_early"  # tests/fleetrl_test_games: the quitter leaves at step 3, the game ends at 8


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_a_pettingzoo_id_gives_the_live_rows_in_same_step_mode(backend):
    envs = make_vec(LEAVE_EARLY, 2, backend, verbose=False, autoreset_mode=SAME_STEP)  # rows: stayer, quitter
    try:
        envs.reset(seed=0)
        quitter, episodes = [], []
        for _ in range(16):  # two games
            obs, reward, terminated, truncated, info = envs.step(np.zeros(2, np.int64))
            assert ("live" in info) == ("_live" in info)
            live = info.get("live", np.ones(2, bool))
            assert live[0], "the stayer plays every step"
            quitter.append(bool(live[1]))
            if "_final_info" in info and "_episode" in info["final_info"]:
                done = info["final_info"]["_episode"]
                episodes += [(i, float(info["final_info"]["episode"]["r"][i]), int(info["final_info"]["episode"]["l"][i]))
                             for i in np.flatnonzero(done)]
        game = [True, True, False, False, False, False, False, True]  # leaves on step 3, back when the game restarts
        assert quitter == game * 2
        assert episodes == [(1, 3.0, 3), (0, 8.0, 8)] * 2
    finally:
        envs.close()


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_a_pettingzoo_id_in_next_step_mode_ends_a_game_then_takes_its_reset_step(backend):
    envs = make_vec(LEAVE_EARLY, 2, backend, verbose=False)  # rows: stayer, quitter; NEXT_STEP, gymnasium's default
    try:
        envs.reset(seed=0)
        lives, rewards, episodes, clocks = [], [], [], []
        for t in range(17):  # game steps 1-8, the reset step, game steps 1-8
            obs, reward, terminated, truncated, info = envs.step(np.zeros(2, np.int64))
            lives.append(info.get("live", np.ones(2, bool)).tolist())
            rewards.append(reward.tolist())
            clocks.append(obs[:, 0].tolist())  # the observation's first entry counts the game's steps (of 8)
            if "_episode" in info:
                episodes += [(t + 1, i, float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
                             for i in np.flatnonzero(info["_episode"])]
            if t == 7:  # the game's end: the stayer's last observation, the gone quitter's zeros; no agent acts next
                assert truncated.tolist() == [True, False] and not terminated.any()
                assert clocks[-1] == [1.0, 0.0] and lives[-1] == [False, False]
            if t == 8:  # the reset step: the game's first observations, no reward, no flags
                assert clocks[-1] == [0.0, 0.0] and rewards[-1] == [0.0, 0.0] and not (terminated | truncated).any()
        game = [[True, True]] * 2 + [[True, False]] * 5 + [[False, False]]
        assert lives == game + [[True, True]] + game
        assert episodes == [(3, 1, 3.0, 3), (8, 0, 8.0, 8), (12, 1, 3.0, 3), (17, 0, 8.0, 8)], "each agent's own steps"
    finally:
        envs.close()


# ---- a gymnasium 1.x script, changed in the line that builds its envs ------------------------------------------

# A replay-buffer loop as gymnasium 1.x's own docs write it for its default, NEXT_STEP (farama.org/Vector-Autoreset-Mode):
# the step after an episode ends is a reset, so it stores no transition there
GYMNASIUM_1X_SCRIPT = """
import gymnasium as gym
import numpy as np


def make_env():
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


def main(seed, steps):
    envs = gym.vector.SyncVectorEnv([make_env for _ in range(4)])
    obs, info = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    autoreset = np.zeros(envs.num_envs, dtype=bool)
    transitions, episodes = [], []
    for _ in range(steps):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        for j in range(envs.num_envs):
            if not autoreset[j]:
                transitions.append((obs[j].tolist(), int(actions[j]), float(rewards[j]), bool(terminations[j]), next_obs[j].tolist()))
        if "episode" in infos:
            for j in np.flatnonzero(infos["_episode"]):
                episodes.append((int(j), float(infos["episode"]["r"][j]), int(infos["episode"]["l"][j])))
        obs, autoreset = next_obs, np.logical_or(terminations, truncations)
    envs.close()
    return transitions, episodes
"""


def run_script(text: str, name: str):
    # a module of its own name that Python cannot import: cloudpickle sends its functions to async workers by value
    namespace = {"__name__": name}
    exec(compile(text, name, "exec"), namespace)  # noqa: S102 - the test's own script
    return namespace["main"](seed=5, steps=300)


@pytest.mark.parametrize("backend", ["auto", "async"])
def test_a_gymnasium_1x_script_runs_on_make_vec_changed_in_one_line_with_the_same_episodes(backend):
    line = "    envs = gym.vector.SyncVectorEnv([make_env for _ in range(4)])\n"
    ours = GYMNASIUM_1X_SCRIPT.replace(line, line.replace("gym.vector.SyncVectorEnv(", "make_vec(").replace(
        "range(4)]", f"range(4)], backend={backend!r}" if backend != "auto" else "range(4)]"))
    ours = ours.replace("import numpy as np\n", "import numpy as np\nfrom fleetrl.envs import make_vec\n")
    added = [x for x in ours.splitlines() if x not in GYMNASIUM_1X_SCRIPT.splitlines()]
    removed = [x for x in GYMNASIUM_1X_SCRIPT.splitlines() if x not in ours.splitlines()]
    assert removed == [line.rstrip("\n")] and added[0] == "from fleetrl.envs import make_vec" and len(added) == 2, (added, removed)
    transitions, episodes = run_script(GYMNASIUM_1X_SCRIPT, "gymnasium_1x_script")
    our_transitions, our_episodes = run_script(ours, "gymnasium_1x_script_on_make_vec")
    assert len(episodes) >= 20 and 0 < 4 * 300 - len(transitions) <= len(episodes), "a reset step stores no transition"
    assert our_episodes == episodes
    assert our_transitions == transitions


# ---- bad input and errors ---------------------------------------------------------------------------------------


def test_spaces_that_differ_are_one_fleet_error_naming_the_fix():
    fns = [functools.partial(generic_env, Box(0, 1, (2,)), 3), functools.partial(generic_env, Box(0, 1, (3,)), 3)]
    for backend in FN_BACKENDS:
        with pytest.raises(FleetError, match=r"(?s)Env 1 of the vector has observation space Box.*must share their spaces.*"
                                             r"same function and arguments"):
            make_vec(fns, backend=backend, verbose=False, env_workers=1 if backend == "async" else None,
                     env_threads=1 if backend == "async" else None)


def test_wrong_counts_and_backends_are_refused():
    fns = generic_fns(Box(0, 1, (2,)))
    with pytest.raises(FleetError, match="3 env functions and num_envs=4"):
        make_vec(fns, 4)
    with pytest.raises(FleetError, match="from an env id"):
        make_vec(fns, backend="ale")
    with pytest.raises(FleetError, match="no backend 'gym-sync'"):
        make_vec(fns, backend="gym-sync")
    with pytest.raises(FleetError, match="needs the number of envs"):
        make_vec("CartPole-v1")


def broken_step(self, action):
    self.count = getattr(self, "count", 0) + 1
    if self.count == 3:
        raise RuntimeError("the simulator fell over")
    return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_an_env_error_is_raised_in_the_caller_and_close_leaves_no_process(backend):
    before = children()
    fns = [functools.partial(GenericTestEnv, step_func=broken_step) for _ in range(2)]
    envs = make_vec(fns, backend=backend, verbose=False)
    started = started_by_the_vector(before)
    workers = set(envs.fleet_envs.worker_pids) if backend == "async" else set()
    assert started == workers and len(running(workers)) == len(workers), "the vector's processes are its workers"
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.step(envs.action_space.sample())
    with pytest.raises(Exception, match="the simulator fell over"):
        envs.step(envs.action_space.sample())
    envs.close()
    assert envs.closed
    assert not running(started), f"left running after close(): {running(started)}"


def test_close_stops_every_async_worker():
    before = children()
    envs = make_vec(generic_fns(Box(0, 1, (2,)), n=4), backend="async", verbose=False, env_workers=2, env_threads=1)
    envs.reset(seed=0)
    started = started_by_the_vector(before)
    assert started == set(envs.fleet_envs.worker_pids) and len(running(started)) == 2
    envs.close()
    assert not running(started), f"left running after close(): {running(started)}"


# ---- CleanRL's own scripts on make_vec ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cleanrl_scripts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cleanrl")
    runpy.run_path(str(ROOT / "benchmarks" / "cleanrl" / "patch.py"))["main"](out)  # its main, without a process of its own
    return out


def test_cleanrl_scripts_change_only_the_line_that_builds_envs(cleanrl_scripts):
    for name in ("ppo", "ppo_atari", "ppo_continuous_action"):
        port = (cleanrl_scripts / f"{name}_gym_sync.py").read_text().splitlines()[1:]  # after the variant's header line
        ours = (cleanrl_scripts / f"{name}_make_vec.py").read_text().splitlines()[1:]
        added = [line for line in ours if line not in port]
        removed = [line for line in port if line not in ours]
        assert len(added) == 2 and added[0] == "from fleetrl.envs import make_vec", added
        assert added[1].lstrip().startswith("envs = make_vec(")
        # what goes is the SyncVectorEnv statement: its first line, and for ppo_atari.py its argument lines
        assert removed[0] == "    envs = gym.vector.SyncVectorEnv(" and all(line.startswith(" " * 8) for line in removed[1:]), removed


def run_cleanrl(scripts: Path, script: str, *args: str) -> str:
    """Run CleanRL's ``script`` as ``python script ARGS`` would, but in this process (no process start and torch import
    per run: what is under test is the script's use of make_vec, not a process); returns what it printed."""
    import torch

    out, threads = io.StringIO(), torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.chdir(scripts):
            mp.setattr(sys, "argv", [str(scripts / script), *args])
            mp.syspath_prepend(str(scripts))  # its cleanrl_utils, as Python puts a script's folder first
            runpy.run_path(str(scripts / script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    return out.getvalue()


def tensorboard_scalars(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [e.value for e in events.Scalars(tag)]


@pytest.mark.slow
def test_cleanrls_ppo_trains_on_make_vec(cleanrl_scripts):
    out = run_cleanrl(cleanrl_scripts, "ppo_make_vec.py", "--total-timesteps", "1024", "--seed", "3")
    assert "env backend: sync (auto: " in out and "SPS:" in out and "episodic_return=" in out
    runs = sorted((cleanrl_scripts / "runs").glob("CartPole-v1__ppo_make_vec__3__*"))
    assert runs and len(tensorboard_scalars(runs[-1], "charts/SPS")) == 2  # 1024 / (4 envs x 128 steps) iterations
    assert tensorboard_scalars(runs[-1], "charts/episodic_return")


@pytest.mark.slow
@pytest.mark.needs("mujoco", "mujoco")
def test_cleanrls_ppo_continuous_action_learns_from_the_same_episodes_on_make_vec_as_on_sync_vector_env(cleanrl_scripts):
    # one seed on both: make_vec hands the script what SyncVectorEnv does, so with torch's deterministic CPU kernels the
    # learner's every episode is the same (printing "episodic_return=" alone would hold for any data)
    # 2 iterations of 2 epochs: the second iteration's episodes are played by a policy the first update changed
    args = ("--env-id", "InvertedPendulum-v5", "--total-timesteps", "512", "--num-steps", "256", "--update-epochs", "2", "--seed", "4")
    out = run_cleanrl(cleanrl_scripts, "ppo_continuous_action_make_vec.py", *args)
    run_cleanrl(cleanrl_scripts, "ppo_continuous_action_gym_sync.py", *args)
    assert "env backend: " in out and "SPS:" in out
    ours, theirs = (sorted((cleanrl_scripts / "runs").glob(f"InvertedPendulum-v5__ppo_continuous_action_{variant}__4__*"))[-1]
                    for variant in ("make_vec", "gym_sync"))
    for tag in ("charts/episodic_return", "charts/episodic_length", "losses/value_loss"):
        assert tensorboard_scalars(ours, tag) == tensorboard_scalars(theirs, tag), tag
    assert len(tensorboard_scalars(ours, "charts/episodic_return")) >= 10


@pytest.mark.slow
@pytest.mark.needs("ale_py", "atari")
def test_cleanrls_ppo_atari_logs_whole_games_on_make_vec_with_ale(cleanrl_scripts):
    # long enough for random Breakout games to end (120-200 agent steps each): the script's logging reads make_vec's
    # final_info, so a game over reaches its TensorBoard (256 steps of 8 envs, 2 iterations)
    out = run_cleanrl(cleanrl_scripts, "ppo_atari_make_vec.py", "--total-timesteps", "2048", "--num-envs", "8",
                      "--num-steps", "128", "--update-epochs", "1", "--seed", "2")
    assert "env backend: ale (auto: " in out and "SPS:" in out
    run = sorted((cleanrl_scripts / "runs").glob("BreakoutNoFrameskip-v4__ppo_atari_make_vec__2__*"))[-1]
    returns, lengths = tensorboard_scalars(run, "charts/episodic_return"), tensorboard_scalars(run, "charts/episodic_length")
    assert len(returns) == len(lengths) >= 4, (returns, lengths)
    # whole games, as fleetrl's statistics count them (5 lives), not the lives that episodic life ends in training
    assert all(length >= 50 for length in lengths) and all(r >= 0 and r == int(r) for r in returns), (returns, lengths)
    assert len(tensorboard_scalars(run, "charts/SPS")) == 2
