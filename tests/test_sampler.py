"""The sampler's modes: the zero-lag split gives the serial batch, first-ready batches keep per-env
trajectories, the policy-lag thread acts with whole versions of the weights, and the timer stays honest."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest
import torch

from conftest import require_module, run_fleetrl_in_process
from envs_for_tests import MakeEnv  # registers ShmCounting-v0 and ShmImage-v0
from fleetrl.algos.ppo import Agent, rollout
from fleetrl.envs import make_vector_env
from fleetrl.envs.shm import SharedMemoryVectorEnv
from fleetrl.envs.vector import SyncVectorEnv
from fleetrl.errors import FleetError
from fleetrl.monitor.timing import PhaseTimer
from fleetrl.sampling.normalize import ObsNormalizer
from fleetrl.sampling.sampler import Sampler
from test_gae import compute_gae, reference_gae

FIELDS_EXACT = ("obs", "actions", "rewards", "terminated", "dones")
FIELDS_ROUNDED = ("logprobs", "values", "final_values", "last_values")  # batch-size-dependent kernels round differently


def make_agent(envs) -> Agent:
    torch.manual_seed(0)
    return Agent(envs.single_observation_space.shape, envs.single_action_space)


def collect_rollouts(envs, split: bool | None, rollouts: int = 2, num_steps: int = 12, **kwargs) -> tuple[str, list[dict]]:
    sampler = Sampler(envs, make_agent(envs), num_steps, rollout=rollout, device=torch.device("cpu"), seed=7, env_seed=11, timer=PhaseTimer(),
                      split=split, **kwargs)
    out = []
    try:
        for _ in range(rollouts):
            buffer = sampler.collect()
            out.append({k: getattr(buffer, k).copy() for k in FIELDS_EXACT + FIELDS_ROUNDED} | {"episodes": list(buffer.episodes)})
            sampler.weights_updated()
    finally:
        sampler.close()
    return sampler.mode, out


def assert_same_batches(serial: list[dict], split: list[dict]) -> None:
    for a, b in zip(serial, split):
        for k in FIELDS_EXACT:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        for k in FIELDS_ROUNDED:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert a["episodes"] == b["episodes"]
    assert any(r["dones"].any() for r in serial) and any((r["final_values"] != 0).any() for r in serial), "episodes end and truncate"


def counting(n: int, **kwargs) -> list[MakeEnv]:
    return [MakeEnv("ShmCounting-v0", kwargs) for _ in range(n)]


@pytest.mark.parametrize("backend", ["sync", "async", "async-threads"])
def test_split_rollout_gives_the_serial_batch_for_the_same_seed_and_weights(backend):
    threads = 2 if backend == "async-threads" else 1  # envs that wait: each worker steps its 2 envs at once
    build = (lambda: SyncVectorEnv(counting(4))) if backend == "sync" else (
        lambda: SharedMemoryVectorEnv(counting(4), num_workers=2, threads=threads))
    mode_serial, serial = collect_rollouts(SyncVectorEnv(counting(4)), split=False)  # the in-process serial loop
    mode_split, split = collect_rollouts(build(), split=True if backend == "sync" else None)  # async splits by itself
    assert (mode_serial, mode_split) == ("serial", "split")
    assert_same_batches(serial, split)


def test_split_rollout_gives_the_serial_batch_through_a_cnn():
    """The torch actor: its batch of 2 rounds differently from a batch of 4, nothing more."""
    build = lambda: SyncVectorEnv([MakeEnv("ShmImage-v0", {"length": 5}) for _ in range(4)])  # noqa: E731
    _, serial = collect_rollouts(build(), split=False, rollouts=1, num_steps=6)
    _, split = collect_rollouts(build(), split=True, rollouts=1, num_steps=6)
    assert_same_batches(serial, split)


@pytest.mark.parametrize("backend", ["ale", "envpool"])
def test_split_rollout_gives_the_serial_batch_on_native_backends(backend):
    require_module(*{"ale": ("ale_py", "atari"), "envpool": ("envpool", "envpool")}[backend])
    build = lambda: make_vector_env("BreakoutNoFrameskip-v4", 4, backend)  # noqa: E731
    _, serial = collect_rollouts(build(), split=False, rollouts=1, num_steps=40)
    mode, split = collect_rollouts(build(), split=None, rollouts=1, num_steps=40)
    assert mode == "split"
    for k in FIELDS_EXACT:
        np.testing.assert_array_equal(serial[0][k], split[0][k], err_msg=k)
    np.testing.assert_allclose(serial[0]["logprobs"], split[0]["logprobs"], rtol=1e-5, atol=1e-6)


def test_envpool_split_rollout_gives_the_serial_batch_for_cartpole():
    require_module("envpool", "envpool")
    from fleetrl.envs.native import EnvPoolVectorEnv

    build = lambda: EnvPoolVectorEnv("CartPole-v1", 4, training=True, family="classic", max_episode_steps=20)  # noqa: E731
    _, serial = collect_rollouts(build(), split=False, num_steps=64)
    mode, split = collect_rollouts(build(), split=None, num_steps=64)
    assert mode == "split"
    assert_same_batches(serial, split)


# ------------------------------------------------------------------------------------------ first-ready


def test_gae_over_first_ready_batches_matches_each_envs_own_trajectory():
    rng = np.random.default_rng(0)
    num_envs, batch, rows = 5, 3, 40
    env_ids = np.stack([rng.choice(num_envs, batch, replace=False) for _ in range(rows)])
    rewards, values = rng.normal(size=(rows, batch)), rng.normal(size=(rows, batch))
    terminated = rng.random((rows, batch)) < 0.1
    truncated = (rng.random((rows, batch)) < 0.1) & ~terminated
    final_values = np.where(truncated, rng.normal(size=(rows, batch)), 0.0)
    last_values = rng.normal(size=num_envs)
    got = compute_gae(rewards, values, terminated, terminated | truncated, final_values, last_values, 0.99, 0.95, env_ids)
    for env in range(num_envs):
        mine = env_ids == env  # the env's transitions, in row order
        want = reference_gae(*(a[mine][:, None] for a in (rewards, values, terminated, truncated, final_values)),
                             last_values[env : env + 1], 0.99, 0.95)
        np.testing.assert_allclose(got[mine], want[:, 0], rtol=1e-10, atol=1e-10)


def test_first_ready_rollout_is_full_follows_each_env_and_a_slow_env_contributes_less(tmp_path):
    # env 0 is held in its first step (a gate file) until the test lets it through: first-ready batches must fill
    # rollouts from the others meanwhile, with no timing to race. One env per worker, batches of the first 2 ready.
    gate = tmp_path / "gate"
    fns = [MakeEnv("ShmCounting-v0", {"length": 6, **({"gate": str(gate)} if i == 0 else {})}) for i in range(4)]
    envs = SharedMemoryVectorEnv(fns, num_workers=4, async_batch=2)
    sampler = Sampler(envs, make_agent(envs), 16, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=100, timer=PhaseTimer(), async_batch=2)
    trajectories = {env: ([], []) for env in range(4)}  # each env's observations and dones, over every rollout in order

    def collect() -> np.ndarray:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a rollout that waits for the held env fails, not hangs
            try:
                buffer = pool.submit(sampler.collect).result(timeout=30)
            except concurrent.futures.TimeoutError:
                gate.touch()  # let it finish, so the pool's thread and the sampler close
                raise AssertionError("the rollout waited for the env held in its step: first-ready batches must not") from None
        assert buffer.env_ids.size == 4 * 16 and buffer.obs.shape[:2] == (32, 2)
        for env in range(4):
            trajectories[env][0].extend(buffer.obs[buffer.env_ids == env])
            trajectories[env][1].extend(buffer.dones[buffer.env_ids == env])
        sampler.weights_updated()
        return np.bincount(buffer.env_ids.ravel(), minlength=4)

    try:
        assert sampler.mode == "first-ready"
        for _ in range(2):  # env 0 still in its first step: the others fill both rollouts
            counts = collect()
            assert counts[0] == 0 and counts.sum() == 64 and (counts[1:] > 0).all(), counts
        gate.touch()  # env 0 returns, and from now on steps as fast as the others
        deadline = time.monotonic() + 60
        while not trajectories[0][0]:
            assert time.monotonic() < deadline, "env 0 never joined a rollout after it was let through"
            collect()
        for env in range(4):  # each env's transitions continue its own episodes across rollouts: obs [seed, episode, t, noise]
            obs, dones = np.array(trajectories[env][0]), np.array(trajectories[env][1])
            assert (obs[:, 0] == 100 + env).all() and (obs[0, 1:3] == 0).all()  # its reset observation comes first
            for k in range(1, len(obs)):
                assert obs[k, 2] == (0 if dones[k - 1] else obs[k - 1, 2] + 1), (env, k)
    finally:
        gate.touch()
        sampler.close()


def test_first_ready_policy_lag_chart_counts_the_transitions_acted_on_before_the_update():
    # every env holds an action in flight when a rollout ends, so an env's first transition in a rollout was acted on
    # by the weights of the last rollout it took part in: one update old, or more where the env missed whole rollouts
    # (which envs are ready first is up to the scheduler, and on a loaded host one can sit out a rollout)
    fns = [MakeEnv("ShmCounting-v0", {"length": 6}) for _ in range(4)]
    envs = SharedMemoryVectorEnv(fns, num_workers=4, async_batch=2)
    sampler = Sampler(envs, make_agent(envs), 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=1, timer=PhaseTimer(), async_batch=2)
    try:
        lags, expected = [], []
        last_acted = np.zeros(4, int)  # the rollout (= weights version) each env last acted in; all act in the first
        for version in range(4):
            buffer = sampler.collect()
            lags.append(sampler.policy_lag)
            present = np.unique(buffer.env_ids)
            expected.append(float((version - last_acted[present]).sum()) / buffer.env_ids.size)
            last_acted[present] = version
            sampler.weights_updated()
        assert lags == pytest.approx(expected) and lags[0] == 0 and min(lags[1:]) > 0, (lags, expected)
    finally:
        sampler.close()


def test_observations_are_normalised_without_reward_normalisation():
    envs = SyncVectorEnv(counting(2))
    obs_norm = ObsNormalizer(envs.single_observation_space.shape)
    sampler = Sampler(envs, make_agent(envs), 16, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=5, timer=PhaseTimer(), obs_norm=obs_norm)
    try:
        buffer = sampler.collect()
    finally:
        sampler.close()
    # the same envs replayed with the rollout's actions: each step's raw observations (the reset's first) update the
    # statistics, and are then stored normalised by them, as CleanRL's NormalizeObservation does
    replay, reference = SyncVectorEnv(counting(2)), ObsNormalizer(envs.single_observation_space.shape)
    raw, _ = replay.reset(seed=5)
    try:
        for t in range(16):
            np.testing.assert_array_equal(buffer.obs[t], reference(raw), err_msg=f"step {t}")
            raw, *_ = replay.step(buffer.actions[t].astype(np.int64))
    finally:
        replay.close()
    reference(raw)  # the observation the next rollout starts from was counted too
    assert obs_norm.rms.count == reference.rms.count == 1e-4 + 17 * 2
    np.testing.assert_array_equal(obs_norm.rms.mean, reference.rms.mean)
    np.testing.assert_array_equal(obs_norm.rms.var, reference.rms.var)


def test_close_leaves_the_envs_to_a_sampler_thread_that_did_not_stop(monkeypatch, capsys, tmp_path):
    import fleetrl.sampling.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "THREAD_JOIN_S", 0.2)
    gate = tmp_path / "gate"  # the envs' steps hang until the test opens it
    envs = SyncVectorEnv([MakeEnv("ShmCounting-v0", {"gate": str(gate)})] * 2)
    close_envs, closed = envs.close, []
    envs.close = lambda: closed.append(True)
    sampler = Sampler(envs, make_agent(envs), 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), policy_lag=1)
    try:
        sampler._start_thread()
        deadline = time.monotonic() + 30
        while not gate.with_name("gate.held").exists():  # the thread is inside the hanging step
            assert time.monotonic() < deadline, "the sampler thread never stepped"
            time.sleep(0.01)
        sampler.close()
        assert not closed and "did not stop within 0.2 s" in capsys.readouterr().err
    finally:  # the step returns and the thread stops: nothing is left running into the next test
        gate.touch()
        sampler._thread.join(timeout=30)
        close_envs()
    assert not sampler._thread.is_alive(), "the sampler thread stops once its step returns"


def test_first_ready_needs_a_backend_that_returns_the_first_envs_ready():
    envs = SyncVectorEnv(counting(4))
    with pytest.raises(FleetError, match="--env-backend async or envpool"):
        Sampler(envs, make_agent(envs), 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), async_batch=2)


def test_envpool_first_ready_keeps_same_step_autoreset_per_env():
    """Each env's results, returned a few at a time, equal stepping it alone with the same actions."""
    require_module("envpool", "envpool")
    from fleetrl.envs.native import EnvPoolVectorEnv

    def action(env: int, t: int) -> int:
        return (env * 7 + t * 3) % 5 % 2

    sync = EnvPoolVectorEnv("CartPole-v1", 4, training=True, family="classic", max_episode_steps=9)
    sync.reset(seed=5)
    want = {env: [] for env in range(4)}
    for t in range(40):
        obs, reward, terminated, truncated, info = sync.step(np.array([action(e, t) for e in range(4)]))
        for env in range(4):
            final = info["final_obs"][env] if info.get("_final_obs", np.zeros(4, bool))[env] else None
            want[env].append((obs[env], reward[env], terminated[env], truncated[env], final))
    sync.close()

    envs = EnvPoolVectorEnv("CartPole-v1", 4, training=True, family="classic", max_episode_steps=9, async_batch=2)
    envs.reset(seed=5)
    got = {env: [] for env in range(4)}
    envs.send(np.array([action(e, 0) for e in range(4)]), np.arange(4))
    while min(len(v) for v in got.values()) < 40:
        obs, reward, terminated, truncated, info, ids = envs.recv()
        for k, env in enumerate(ids):
            final = info["final_obs"][k] if info.get("_final_obs", np.zeros(len(ids), bool))[k] else None
            got[env].append((obs[k], reward[k], terminated[k], truncated[k], final))
        envs.send(np.array([action(e, len(got[e])) for e in ids]), ids)
    envs.close()
    for env in range(4):
        for (o, r, te, tr, f), (wo, wr, wte, wtr, wf) in zip(got[env][:40], want[env]):
            np.testing.assert_array_equal(o, wo)
            assert (r, te, tr) == (wr, wte, wtr)
            assert (f is None) == (wf is None) and (f is None or np.array_equal(f, wf))
    assert any(step[3] for step in want[0]), "episodes were truncated"


# ------------------------------------------------------------------------------------------ --policy-lag 1


def test_acting_copy_is_never_half_updated_and_lags_one_update():
    """The 'learner' rewrites its parameters one tensor at a time, slowly; the sampler thread must only
    ever act with every parameter from one published version, and rollout k+1 with the weights of k-1."""
    envs = SyncVectorEnv(counting(2))
    agent = make_agent(envs)
    with torch.no_grad():
        for p in agent.parameters():
            p.fill_(0.0)  # version 0
    sampler = Sampler(envs, agent, 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), policy_lag=1)
    seen: list[tuple[int, set[float]]] = []
    act = sampler.actor.act

    def checked_act(obs, noise=None):
        values = set(torch.cat([p.detach().flatten() for p in sampler.acting_agent.parameters()]).tolist())
        seen.append((sampler.acting_version, values))
        return act(obs, noise)

    sampler.actor.act = checked_act
    try:
        for iteration in range(6):
            buffer = sampler.collect()
            assert buffer.policy_version == max(0, iteration - 1)
            assert sampler.policy_lag == (0 if iteration == 0 else 1)
            with torch.no_grad():  # a slow optimiser step: the live weights are half-updated for a while
                for p in agent.parameters():
                    p.fill_(float(iteration + 1))
                    time.sleep(0.002)
            sampler.weights_updated()
    finally:
        sampler.close()
    assert seen and all(values == {float(version)} for version, values in seen), {v: sorted(s)[:3] for v, s in seen}


def test_policy_lag_merges_normalisation_statistics_once_an_iteration_on_the_learner_thread():
    envs = SyncVectorEnv(counting(2))
    agent = make_agent(envs)
    from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer

    calls: list[str] = []

    def allreduce(sums):
        calls.append(threading.current_thread().name)
        return sums

    obs_norm, reward_norm = ObsNormalizer((4,), allreduce), RewardNormalizer(2, 0.99, allreduce)
    sampler = Sampler(envs, agent, 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), policy_lag=1,
                      obs_norm=obs_norm, reward_norm=reward_norm)
    try:
        for _ in range(3):
            sampler.collect()
            sampler.weights_updated()
    finally:
        sampler.close()
    assert calls == [threading.main_thread().name] * 6, calls  # two statistics, once an iteration each
    assert obs_norm.rms.count == pytest.approx(1e-4 + 2 + 3 * 8 * 2)  # the reset and three rollouts' observations


def test_an_env_error_in_the_sampler_thread_reaches_the_learner_and_close_returns():
    envs = SyncVectorEnv(counting(2, raise_on_step=20))
    sampler = Sampler(envs, make_agent(envs), 8, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), policy_lag=1)
    with pytest.raises(RuntimeError, match="told to fail on step 20"):
        for _ in range(4):
            sampler.collect()
            sampler.weights_updated()
    sampler.close()
    assert not sampler._thread.is_alive()


# ------------------------------------------------------------------------------------------ phase timing


def test_timer_keeps_sampler_thread_phases_out_of_the_trainer_accounting(phase_clock):
    # a sampler thread steps envs for 0.75 s while the trainer learns 0.25 s, then waits 0.5 s for it; 0.25 s other
    timer = PhaseTimer()
    entered, release = threading.Event(), threading.Event()

    def sampler_thread():
        with timer.env:
            entered.set()
            assert release.wait(timeout=30)

    thread = threading.Thread(target=sampler_thread)
    thread.start()
    try:
        assert entered.wait(timeout=30)
        with timer.learn:
            phase_clock.advance(0.25)
        with timer.wait:
            phase_clock.advance(0.5)
            release.set()
            thread.join(timeout=30)
        phase_clock.advance(0.25)
    finally:
        release.set()
        thread.join(timeout=30)
    perf = timer.lap()
    assert (perf["perf/env_time"], perf["perf/env_share"]) == (0.75, 0.75)  # alongside the trainer's second
    assert (perf["perf/learn_time"], perf["perf/wait_time"], perf["perf/other_time"]) == (0.25, 0.5, 0.25)
    on_trainer = perf["perf/learn_share"] + perf["perf/wait_share"] + perf["perf/inference_share"] + perf["perf/other_share"]
    assert on_trainer == 1.0  # the env phase ran alongside, outside this sum


def test_async_batch_with_the_default_backend_picks_one_that_returns_the_first_envs_ready(tmp_path):
    # CartPole alone would run in-process (sync), which has no first-ready batches: auto takes async for --async-batch
    proc = run_fleetrl_in_process("train", "ppo", "--env-id", "CartPole-v1", "--no-cuda", "--num-envs", "4", "--async-batch", "2",
                                  "--num-steps", "16", "--total-timesteps", "128", "--run-dir", str(tmp_path / "ok"))
    assert proc.returncode == 0 and "env backend: async" in proc.stdout and "first-ready batches of 2" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("flags, needle", [
    (["--env-backend", "sync"], "--env-backend sync steps all 4 together"),
    (["--env-backend", "async", "--async-batch", "3"], "must divide --num-envs 4"),
    (["--env-backend", "async", "--env-workers", "1"], "multiple of the envs each of the 1 env workers steps (4)"),
])
def test_async_batch_is_refused_before_the_start_naming_the_fix(tmp_path, flags, needle):
    argv = ["train", "ppo", "--env-id", "CartPole-v1", "--no-cuda", "--num-envs", "4", "--run-dir", str(tmp_path / "r")]
    proc = run_fleetrl_in_process(*argv, *(["--async-batch", "2"] if "--async-batch" not in flags else []), *flags)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()
