"""make_vec (fleetrl/envs/gym_vector.py) against gymnasium's own SyncVectorEnv in SAME_STEP mode: the same env functions
and seeds step identically on every backend that can take the env, checked with gymnasium's data_equivalence on
gymnasium's own test envs and spaces (tests/gymnasium_vendored/), CartPole, Breakout and a MuJoCo env."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from conftest import fleetrl_env
from fleetrl.envs import EnvFactory, make_vec
from fleetrl.envs.gym_vector import FleetVectorEnv
from fleetrl.errors import FleetError
from gymnasium_vendored.spaces_utils import TESTING_SPACES, TESTING_SPACES_IDS
from gymnasium_vendored.testing_env import GenericTestEnv
from gymnasium_vendored.vector_utils import count_reset, count_step, make_env

SAME_STEP = AutoresetMode.SAME_STEP
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
    that ended, so a test can check it saw some. ``drop``: info keys of final_info's episode to leave out (times)."""
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
        for name, x, y in zip(("obs", "reward", "terminated", "truncated", "info"), out_a, out_b):
            assert data_equivalence(x, y, exact=True), f"step {t}: {name} differs:\n{x}\n{y}"
        ended += int(np.sum(out_a[2] | out_a[3]))
    return ended


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_no_new_processes(before: set[int]) -> None:
    """close() left no process behind: only those from before (and multiprocessing's forkserver) remain."""
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
                and "forkserver" not in " ".join(p.cmdline())]
    assert not leftover, f"left running after close(): {[(p.pid, p.cmdline()) for p in leftover]}"


# ---- the vector env contract ---------------------------------------------------------------------------------


def test_make_vec_is_a_gymnasium_vector_env_in_same_step_mode():
    envs = make_vec(generic_fns(Box(0, 1, (2,))), backend="sync", verbose=False)
    try:
        assert isinstance(envs, gym.vector.VectorEnv)
        assert envs.metadata["autoreset_mode"] == SAME_STEP and envs.num_envs == 3
        assert envs.observation_space == gym.vector.utils.batch_space(Box(0, 1, (2,)), 3)
        assert envs.action_space == gym.vector.utils.batch_space(Discrete(3), 3)
    finally:
        envs.close()
    with pytest.raises(FleetError, match="SAME_STEP"):
        make_vec(generic_fns(Box(0, 1, (2,))), backend="sync", autoreset_mode=AutoresetMode.NEXT_STEP)


def same_info(info: dict, expected: dict) -> bool:
    """data_equivalence, but a final observation of a Discrete space compares by value: the backends keep observations
    in a numpy array, so the env's Python int 2 comes back as numpy's int64 2 (docs/backends.md, make_vec)."""
    final_obs, expected_obs = info.pop("final_obs"), expected.pop("final_obs")
    return list(final_obs) == list(expected_obs) and data_equivalence(info, expected)


@pytest.mark.parametrize("backend", FN_BACKENDS)
def test_autoreset_as_gymnasiums_own_same_step_test_expects(backend):
    # gymnasium's tests/vector/test_autoreset_mode.py::test_autoreset_within_step, with max_count set by the env functions
    def counter(max_count: int) -> GenericTestEnv:
        env = GenericTestEnv(action_space=Discrete(5), observation_space=Discrete(5), reset_func=count_reset, step_func=count_step)
        env.max_count = max_count
        return env

    envs = make_vec([functools.partial(counter, m) for m in (2, 3, 3)], backend=backend, verbose=False,
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


@pytest.mark.parametrize("backend", FN_BACKENDS)
@pytest.mark.parametrize("space", [s for s, _ in ARRAY_TEST_SPACES], ids=[i for _, i in ARRAY_TEST_SPACES])
def test_steps_as_sync_vector_env_on_gymnasiums_test_spaces(space, backend):
    fns = generic_fns(space)
    envs = make_vec(fns, backend=backend, verbose=False, env_workers=1 if backend == "async" else None,
                    env_threads=1 if backend == "async" else None)
    reference = SyncVectorEnv(fns, autoreset_mode=SAME_STEP)
    try:
        assert same_steps(envs, reference, steps=15, seed=7) > 3
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("action_space", [Box(-1, 1, (2,)), MultiDiscrete([2, 3]), MultiBinary(3)], ids=str)
def test_steps_as_sync_vector_env_with_other_action_spaces_on_async(action_space):
    fns = generic_fns(Box(0, 1, (3,)), action_space=action_space)
    envs = make_vec(fns, backend="async", verbose=False, env_workers=1, env_threads=1)
    reference = SyncVectorEnv(fns, autoreset_mode=SAME_STEP)
    try:
        assert same_steps(envs, reference, steps=10) > 0
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("space", [s for s, _ in OTHER_TEST_SPACES], ids=[i for _, i in OTHER_TEST_SPACES])
def test_structured_observations_are_refused_with_the_fix(space):
    with pytest.raises(FleetError, match="FlattenObservation"):
        make_vec(generic_fns(space), backend="sync", verbose=False)


@pytest.mark.parametrize("backend", ["sync", "async", "auto"])
def test_cartpole_env_functions_step_as_sync_vector_env_with_episode_statistics(backend, capsys):
    # gymnasium's own tests/vector/testing_utils.py make_env, with CleanRL's per-env RecordEpisodeStatistics
    fns = [lambda i=i: gym.wrappers.RecordEpisodeStatistics(make_env("CartPole-v1", i)()) for i in range(4)]
    envs = make_vec(fns, backend=backend)
    reference = SyncVectorEnv(fns, autoreset_mode=SAME_STEP)
    try:
        if backend == "auto":
            assert "env backend: " in capsys.readouterr().out and envs.backend_reason.startswith("auto: ")
        assert same_steps(envs, reference, steps=200, drop=("t", "_t")) >= 4  # episode times are wall clock
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_vector_episode_statistics_wrapper_reads_make_vec_as_it_reads_sync_vector_env(backend):
    fns = [functools.partial(gym.make, "CartPole-v1") for _ in range(3)]
    envs = gym.wrappers.vector.RecordEpisodeStatistics(make_vec(fns, backend=backend, verbose=False))
    reference = gym.wrappers.vector.RecordEpisodeStatistics(SyncVectorEnv(fns, autoreset_mode=SAME_STEP))
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


@pytest.mark.parametrize("backend", ["sync", "async", "auto"])
def test_env_id_steps_as_sync_vector_env_of_fleetrls_own_envs(backend):
    envs = make_vec("CartPole-v1", 3, backend, verbose=False)
    reference = SyncVectorEnv([EnvFactory("CartPole-v1", "classic") for _ in range(3)], autoreset_mode=SAME_STEP)
    try:
        assert same_steps(envs, reference, steps=150, seed=3) >= 3
    finally:
        envs.close()
        reference.close()


@pytest.mark.needs("mujoco", "mujoco")
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_mujoco_env_steps_as_sync_vector_env(backend):
    envs = make_vec("InvertedPendulum-v5", 2, backend, verbose=False)
    reference = SyncVectorEnv([EnvFactory("InvertedPendulum-v5", "mujoco") for _ in range(2)], autoreset_mode=SAME_STEP)
    try:
        assert same_steps(envs, reference, steps=60, seed=5) >= 2
    finally:
        envs.close()
        reference.close()


@pytest.mark.needs("ale_py", "atari")
@pytest.mark.parametrize("backend", ["sync", "async"])
def test_atari_id_steps_as_sync_vector_env_with_fleetrls_atari_chain(backend):
    envs = make_vec("BreakoutNoFrameskip-v4", 2, backend, verbose=False)
    reference = SyncVectorEnv([EnvFactory("BreakoutNoFrameskip-v4", "atari") for _ in range(2)], autoreset_mode=SAME_STEP)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        assert same_steps(envs, reference, steps=120, seed=2) >= 1  # a lost life ends a training episode
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
    envs = make_vec(env_id, 4, backend, verbose=False)
    try:
        assert isinstance(envs, FleetVectorEnv) and envs.backend == backend
        obs, info = envs.reset(seed=0)
        assert obs.shape == (4, *envs.single_observation_space.shape) and info == {}
        envs.action_space.seed(0)
        finals = episodes = 0
        for _ in range(400):
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
    workers = list(envs.fleet_envs.worker_pids) if backend == "async" else []
    assert all(psutil.pid_exists(pid) for pid in workers)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.step(envs.action_space.sample())
    with pytest.raises(Exception, match="the simulator fell over"):
        envs.step(envs.action_space.sample())
    envs.close()
    assert envs.closed
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in workers)
    assert_no_new_processes(before)


def test_close_stops_every_async_worker():
    before = children()
    envs = make_vec(generic_fns(Box(0, 1, (2,)), n=4), backend="async", verbose=False, env_workers=2, env_threads=1)
    envs.reset(seed=0)
    assert len(children() - before) >= 2
    envs.close()
    assert_no_new_processes(before)


# ---- CleanRL's own scripts on make_vec ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cleanrl_scripts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cleanrl")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cleanrl" / "patch.py"), str(out)], check=True)
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


def run_cleanrl(scripts: Path, script: str, *args: str, timeout: float = 300) -> str:
    env = fleetrl_env()
    proc = subprocess.run([sys.executable, str(scripts / script), *args], cwd=scripts, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def tensorboard_scalars(run_dir: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [e.value for e in events.Scalars(tag)]


@pytest.mark.slow
def test_cleanrls_ppo_trains_on_make_vec(cleanrl_scripts):
    out = run_cleanrl(cleanrl_scripts, "ppo_make_vec.py", "--total-timesteps", "2048", "--seed", "3")
    assert "env backend: sync (auto: " in out and "SPS:" in out and "episodic_return=" in out
    runs = sorted((cleanrl_scripts / "runs").glob("CartPole-v1__ppo_make_vec__3__*"))
    assert runs and len(tensorboard_scalars(runs[-1], "charts/SPS")) == 4  # 2048 / (4 envs x 128 steps) iterations
    assert tensorboard_scalars(runs[-1], "charts/episodic_return")


@pytest.mark.slow
@pytest.mark.needs("mujoco", "mujoco")
def test_cleanrls_ppo_continuous_action_trains_on_make_vec(cleanrl_scripts):
    out = run_cleanrl(cleanrl_scripts, "ppo_continuous_action_make_vec.py", "--env-id", "InvertedPendulum-v5", "--total-timesteps",
                      "2048", "--num-steps", "512")
    assert "env backend: " in out and "SPS:" in out and "episodic_return=" in out


@pytest.mark.slow
@pytest.mark.needs("ale_py", "atari")
def test_cleanrls_ppo_atari_trains_on_make_vec_with_ale(cleanrl_scripts):
    out = run_cleanrl(cleanrl_scripts, "ppo_atari_make_vec.py", "--total-timesteps", "1024", "--num-envs", "8",
                      "--num-steps", "128", "--update-epochs", "1")
    assert "env backend: ale (auto: " in out and "SPS:" in out
