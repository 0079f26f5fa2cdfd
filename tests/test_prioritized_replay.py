"""Prioritised replay and n-step returns (issue 35): the sum tree against brute force and CleanRL's segment tree, sampling
frequencies, importance weights, n-step returns cut at episode ends, time limits and resets against a brute-force
reference, checkpoints, memory, and priorities, slots and weights equal to CleanRL's PrioritizedReplayBuffer."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from scipy import stats

from fleetrl.envs.vector import SyncVectorEnv
from fleetrl.errors import FleetError
from fleetrl.sampling.priorities import Priorities, SumTree
from fleetrl.sampling.replay import PrioritizedBatch, ReplayBatch, ReplayBuffer, required_bytes
from test_replay import ATARI_OBS, OddStacksEnv, fill

VECTOR_OBS = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(4)


@pytest.fixture
def cleanrl(monkeypatch):
    """CleanRL's rainbow_atari.py, its classes verbatim (benchmarks/cleanrl/rainbow_atari.py)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks" / "cleanrl"))
    import rainbow_atari

    return rainbow_atari


# ------------------------------------------------------------------------------------------------ the sum tree
def heap_leaf_order(capacity):
    """The slots in the order the tree's search sees them (left to right), by walking the heap."""
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        if node >= capacity - 1:
            order.append(node - (capacity - 1))
        else:
            stack += [2 * node + 2, 2 * node + 1]
    return np.array(order)


@pytest.mark.parametrize("capacity", [1, 2, 5, 64, 1000, 4097])
def test_sum_tree_sums_and_prefix_search_match_brute_force_after_batched_updates(capacity):
    rng = np.random.default_rng(capacity)
    tree, leaves = SumTree(capacity), np.zeros(capacity)
    order = heap_leaf_order(capacity)
    for _ in range(30):
        slots = rng.integers(0, capacity, rng.integers(1, 64))  # repeats: the last value wins
        values = (rng.random(len(slots)) * 10 ** rng.uniform(-3, 3)) * (rng.random(len(slots)) < 0.8)
        tree.update(slots, values)
        for slot, value in zip(slots, values):
            leaves[slot] = np.float32(value)
        np.testing.assert_array_equal(tree.leaves, leaves.astype(np.float32))
        sums = np.concatenate([np.zeros(capacity - 1), leaves.astype(np.float32).astype(np.float64)])
        for node in range(capacity - 2, -1, -1):  # every inner node is the sum of the leaves below it (float64)
            sums[node] = sums[2 * node + 1] + sums[2 * node + 2]
        np.testing.assert_allclose(tree.nodes, sums, rtol=1e-5, atol=1e-30)
        prefix = np.cumsum(leaves[order])
        if prefix[-1] == 0:
            continue
        masses = rng.uniform(0, prefix[-1], 200)
        clear = np.abs(masses[:, None] - prefix[None, :]).min(axis=1) > 1e-4 * prefix[-1]  # not on a float32 boundary
        expected = order[np.searchsorted(prefix, masses[clear])]
        np.testing.assert_array_equal(tree.find(masses[clear]), expected)
        assert (tree.leaves[tree.find(masses)] > 0).all()


@pytest.mark.parametrize("capacity", [7, 1000, 1024])
def test_sum_tree_is_cleanrls_segment_tree_bit_for_bit(cleanrl, capacity):
    rng = np.random.default_rng(0)
    ours, theirs = SumTree(capacity), cleanrl.SumSegmentTree(capacity)
    for _ in range(20):
        slots = rng.integers(0, capacity, 32)
        values = rng.random(32).astype(np.float32)
        ours.update(slots, values)
        for slot, value in zip(slots, values):
            theirs.update(slot, value)
        np.testing.assert_array_equal(ours.nodes, theirs.tree)
        # Python floats, as CleanRL's sample draws them (np.random.uniform of two scalars), and masses on the edges of
        # the leaves' prefix sums, where float32 and float64 walks part (NumPy 2 makes CleanRL's walk float32)
        edges = np.cumsum(theirs.tree[capacity - 1:].astype(np.float64))[:-1]
        masses = [float(m) for m in np.concatenate([rng.uniform(0, float(theirs.total()), 2000), edges, np.nextafter(edges, np.inf)])]
        np.testing.assert_array_equal(ours.find(np.array(masses)), [theirs.retrieve(m) for m in masses])
    rebuilt = SumTree(capacity)
    rebuilt.leaves[:] = ours.leaves
    rebuilt.rebuild()
    np.testing.assert_array_equal(rebuilt.nodes, ours.nodes)


def test_sampling_frequencies_match_the_priorities_to_the_power_alpha():
    np.random.seed(0)
    priorities = Priorities(50, alpha=0.6)
    errors = np.random.default_rng(1).exponential(1.0, 50).astype(np.float32)
    errors[[3, 17]] = 0.0  # still sampled: |error| + eps
    priorities.update(np.arange(50), errors)
    priorities.remove([40, 41])  # never sampled
    counts = np.bincount(np.concatenate([priorities.sample(32) for _ in range(8000)]), minlength=50)
    expected_p = (np.abs(errors) + 1e-6) ** 0.6
    expected_p[[40, 41]] = 0
    expected = expected_p / expected_p.sum() * counts.sum()
    assert counts[40] == counts[41] == 0
    assert counts[3] + counts[17] < 20, "|0| + 1e-6 to the 0.6: about 1.5 draws of 256,000 each"
    keep = expected > 5  # the chi-square approximation needs a few expected draws a cell
    # stratified draws vary less than independent ones, so the multinomial chi-square test is conservative
    assert stats.chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue > 0.01


def test_importance_weights_are_cleanrls_formula():
    priorities = Priorities(100, alpha=0.5)
    priorities.update(np.arange(100), np.random.default_rng(2).exponential(1.0, 100).astype(np.float32))
    np.random.seed(3)
    slots = priorities.sample(32)
    for beta in (0.4, 0.7, 1.0):
        p = priorities.tree.leaves[slots].astype(np.float64)
        w = (100 * p / priorities.tree.leaves.astype(np.float64).sum()) ** -beta
        np.testing.assert_allclose(priorities.weights(slots, 100, beta), w / w.max(), rtol=1e-5)


# ------------------------------------------------------------------------------------------------ CleanRL's buffer
def cleanrl_alongside(cleanrl, capacity, n_step, steps, seed=0, batch=32):
    """CleanRL's PrioritizedReplayBuffer and fleetrl's, one env, the same stream (no episode end) and the same draws;
    assert every sample and tree is the same."""
    theirs = cleanrl.PrioritizedReplayBuffer(capacity, (3,), "cpu", n_step, 0.99, alpha=0.5, beta=0.4)
    ours = ReplayBuffer(capacity, 1, VECTOR_OBS, ACTIONS, n_step=n_step, gamma=0.99, alpha=0.5, beta=0.4)
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 256, 3).astype(np.float32)  # CleanRL stores uint8 observations
    for step in range(steps):
        next_obs, action, reward = rng.integers(0, 256, 3).astype(np.float32), int(rng.integers(4)), float(rng.integers(-1, 2))
        theirs.add(obs, action, reward, next_obs, False)
        ours.add(obs[None], next_obs[None], np.array([action]), np.array([reward]), np.array([False]), np.array([False]), {})
        obs = next_obs
        theirs.beta = ours.beta = min(1.0, 0.4 + step * 0.6 / steps)
        if step >= 60 and step % 4 == 0:
            state = np.random.get_state()
            expected = theirs.sample(batch)
            after = np.random.get_state()
            np.random.set_state(state)
            got = ours.sample(batch)
            assert np.array_equal(np.random.get_state()[1], after[1]), "the same draws"
            np.testing.assert_array_equal(got.indices, expected.indices)
            np.testing.assert_array_equal(got.weights.numpy(), expected.weights.numpy()[:, 0])
            np.testing.assert_array_equal(got.rewards.numpy(), expected.rewards.numpy()[:, 0])
            np.testing.assert_array_equal(got.next_obs.numpy(), expected.next_observations.numpy().astype(np.float32))
            np.testing.assert_array_equal(got.obs.numpy(), expected.observations.numpy().astype(np.float32))
            assert (got.discounts == np.float32(0.99 ** n_step)).all() and not got.dones.any()
            errors = (rng.standard_normal(batch) * rng.uniform(0.1, 5)).astype(np.float32)  # a loss per sample
            theirs.update_priorities(expected.indices, errors)
            ours.update_priorities(got.indices, torch.from_numpy(errors))
            np.testing.assert_array_equal(ours.priorities.tree.nodes, theirs.sum_tree.tree)
            assert ours.priorities.max_priority == theirs.max_priority
    return ours


@pytest.mark.parametrize("capacity", [256, 300])
def test_priorities_slots_and_weights_equal_cleanrls_prioritized_replay_buffer_bit_for_bit(cleanrl, capacity):
    cleanrl_alongside(cleanrl, capacity, n_step=1, steps=700)  # the ring wraps twice


def test_n_step_transitions_equal_cleanrls_on_a_stream_without_episode_ends(cleanrl):
    # (no wrap: CleanRL writes each transition n - 1 steps late, so its ring overwrites other slots than fleetrl's)
    ours = cleanrl_alongside(cleanrl, 300, n_step=3, steps=290)
    assert ours.complete == len(ours) - 2, "the newest two steps wait for their third"


# ------------------------------------------------------------------------------------------------ n-step returns
def scripted_stream(num_envs, steps, seed, reset_at=()):
    """Episodes of random lengths per env, each ending in termination or a time limit, rewards drawn at random, obs
    that name (env, step); at the steps in ``reset_at`` the caller resets every env (a new obs, no episode end).
    Yields what ``envs.step`` and the loop hand to ``rb.add``."""
    rng = np.random.default_rng(seed)
    counter = iter(range(1, 10**9))

    def new_obs(i):
        return np.array([i, next(counter), 0], np.float32)

    obs = np.stack([new_obs(i) for i in range(num_envs)])
    left = rng.integers(1, 7, num_envs)
    for t in range(steps):
        if t in reset_at:
            obs = np.stack([new_obs(i) for i in range(num_envs)])
        next_obs = np.stack([new_obs(i) for i in range(num_envs)])
        rewards = rng.integers(-3, 4, num_envs).astype(np.float64) * 0.5
        left -= 1
        ended = left == 0
        terminated = ended & (rng.random(num_envs) < 0.5)
        truncated = ended & ~terminated
        info = {}
        if ended.any():
            final_obs = np.empty(num_envs, object)
            for i in np.flatnonzero(ended):
                final_obs[i] = next_obs[i].copy()
            info = {"_final_obs": ended, "final_obs": final_obs}
            next_obs = next_obs.copy()
            for i in np.flatnonzero(ended):
                next_obs[i] = new_obs(i)  # the next episode's first obs, as same-step autoreset returns it
            left[ended] = rng.integers(1, 7, int(ended.sum()))
        yield obs, next_obs, rng.integers(0, 4, num_envs), rewards, terminated, truncated, info
        obs = next_obs


def brute_force_n_step(records, n, gamma):
    """records: each env's list of (obs, true next obs, action, reward, terminated, truncated), in order. For each
    step, the expected n-step transition, or None while it waits for later steps."""
    expected = []
    for env, steps in enumerate(records):
        out = []
        for t in range(len(steps)):
            reward, k, result = 0.0, 0, None
            while True:
                obs, true_next, _, r, terminated, truncated = steps[t + k]
                reward += gamma ** k * np.float64(np.float32(r))
                k += 1
                following = steps[t + k] if t + k < len(steps) else None
                cut = following is not None and not np.array_equal(following[0], true_next)  # the caller reset it
                if terminated or truncated or cut or k == n:
                    result = (steps[t][0], steps[t][2], true_next, np.float32(reward), float(terminated), np.float32(gamma ** k))
                    break
                if following is None:
                    break
            out.append(result)
        expected.append(out)
    return expected


@pytest.mark.parametrize("n_step, num_envs, capacity, alpha", [(3, 3, 3 * 200, None), (3, 3, 3 * 40, 0.5), (5, 2, 2 * 23, 0.6),
                                                              (1, 2, 2 * 50, 0.5)])
def test_n_step_returns_are_cut_at_terminations_time_limits_and_resets_against_brute_force(n_step, num_envs, capacity, alpha):
    gamma = 0.9
    rb = ReplayBuffer(capacity, num_envs, VECTOR_OBS, ACTIONS, n_step=n_step, gamma=gamma, alpha=alpha)
    records = [[] for _ in range(num_envs)]
    slot_of = {}  # (env, step) -> slot, for the steps still in the ring
    for t, (obs, next_obs, actions, rewards, terminated, truncated, info) in enumerate(
            scripted_stream(num_envs, 150, seed=n_step, reset_at=(40, 41, 97))):
        row = rb.row
        rb.add(obs, next_obs, actions, rewards, terminated, truncated, info)
        for i in range(num_envs):
            true_next = info["final_obs"][i] if info and info["_final_obs"][i] else next_obs[i]
            records[i].append((obs[i], true_next, actions[i], rewards[i], terminated[i], truncated[i]))
            slot_of[(i, t)] = row * num_envs + i
        if t % 10 and t != 149:
            continue
        expected = brute_force_n_step(records, n_step, gamma)
        live = {slot: key for key, slot in slot_of.items()}  # the latest step written to each slot
        want = {slot: expected[i][step] for slot, (i, step) in live.items()}
        sampleable = set(rb.sampleable().tolist())
        assert sampleable == {slot for slot, e in want.items() if e is not None}, f"step {t}: the complete transitions"
        assert rb.complete == len(sampleable)
        indices = np.array(sorted(sampleable))
        batch = rb.get(indices)
        for k, slot in enumerate(indices):
            obs, action, next_obs, reward, done, discount = want[slot]
            np.testing.assert_array_equal(batch.obs[k].numpy(), obs)
            np.testing.assert_array_equal(batch.next_obs[k].numpy(), next_obs, err_msg=f"next obs of slot {slot}")
            assert batch.actions[k].item() == action and batch.rewards[k].item() == reward, slot
            assert batch.dones[k].item() == done and batch.discounts[k].item() == discount, slot
    terminated_early = [e for out in expected for e in out if e and e[4] and e[5] > gamma ** n_step]
    truncated_early = [e for out in expected for e in out if e and not e[4] and e[5] > gamma ** n_step]
    assert n_step == 1 or (terminated_early and truncated_early), "the stream has returns cut both ways"
    if alpha is not None:
        np.random.seed(0)
        assert set(rb.sample(256).indices.tolist()) <= sampleable, "waiting transitions have priority 0"


def test_truncated_n_step_return_bootstraps_from_the_final_observation_not_the_reset():
    rb = ReplayBuffer(30, 1, VECTOR_OBS, ACTIONS, n_step=3, gamma=0.5)
    one = np.ones(1)
    stream = [([0, 1, 0], [0, 2, 0], 1.0, False, False), ([0, 2, 0], [0, 3, 0], 2.0, False, True)]  # a time limit
    for obs, next_obs, reward, terminated, truncated in stream:
        info = {"_final_obs": np.array([True]), "final_obs": np.array([np.array(next_obs, np.float32)], object)} if truncated else {}
        shown = [9, 9, 9] if truncated else next_obs  # the reset obs the env returns
        rb.add(np.array([obs], np.float32), np.array([shown], np.float32), 0 * one, reward * one, np.array([terminated]),
               np.array([truncated]), info)
    batch = rb.get(np.array([0, 1]))
    assert batch.rewards.tolist() == [1.0 + 0.5 * 2.0, 2.0] and batch.discounts.tolist() == [0.25, 0.5]
    assert batch.next_obs.tolist() == [[0, 3, 0], [0, 3, 0]] and not batch.dones.any(), "bootstrapped from the final obs"


def test_n_step_with_atari_frames_stored_once_rebuilds_each_window_exactly():
    envs = SyncVectorEnv([OddStacksEnv, OddStacksEnv])
    rb = ReplayBuffer(80, 2, envs.single_observation_space, envs.single_action_space, n_step=3, gamma=0.9, alpha=0.5)
    assert rb.frame_stack
    truth, terminations, truncations = fill(rb, envs, 150)
    assert terminations > 5 and truncations > 5
    indices = rb.sampleable()
    assert 0 < len(indices) < len(rb)
    batch = rb.get(indices)
    for k, slot in enumerate(indices.tolist()):
        reward, steps, last = 0.0, 0, slot
        while True:
            _, true_next, _, r, terminated, truncated = truth[last]
            reward += 0.9 ** steps * np.float64(np.float32(r))
            steps += 1
            following = truth.get((last + 2) % rb.capacity)
            if terminated or truncated or steps == 3 or not np.array_equal(following[0], true_next):
                break
            last = (last + 2) % rb.capacity
        np.testing.assert_array_equal(batch.obs[k].numpy(), truth[slot][0])
        np.testing.assert_array_equal(batch.next_obs[k].numpy(), true_next)
        assert batch.rewards[k].item() == np.float32(reward) and batch.discounts[k].item() == np.float32(0.9 ** steps)
    np.random.seed(1)
    assert set(rb.sample(128).indices.tolist()) <= set(indices.tolist())


# ------------------------------------------------------------------------------------------------ the API around it
def test_plain_buffers_still_sample_a_five_field_replay_batch():
    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    plain = ReplayBuffer(100, 2, envs.single_observation_space, envs.single_action_space)
    prioritized = ReplayBuffer(100, 2, envs.single_observation_space, envs.single_action_space, alpha=0.5, gamma=0.99)
    fill(plain, envs, 30)
    fill(prioritized, envs, 30)
    batch = plain.sample(16)
    assert type(batch) is ReplayBatch and len(batch) == 5
    assert batch.weights is None and batch.indices is None and batch.discounts is None
    indices = np.arange(0, 60, 4)
    per = prioritized.get(indices)
    assert type(per) is PrioritizedBatch and np.array_equal(per.indices, indices) and per.weights is None
    for got, want in zip(per[:5], plain.get(indices)):
        assert torch.equal(got, want)
    assert torch.equal(per.discounts, torch.full((15,), 0.99))


def test_update_priorities_leaves_alone_a_slot_written_again_while_its_transition_waits():
    # one env whose episode never ends: after each step the newest n - 1 = 2 transitions wait for their returns
    rb = ReplayBuffer(10, 1, VECTOR_OBS, ACTIONS, n_step=3, gamma=0.9, alpha=1.0)

    def step(t: int) -> None:
        rb.add(np.array([[t, 0, 0]], np.float32), np.array([[t + 1, 0, 0]], np.float32), np.array([t % 4]), np.array([1.0]),
               np.array([False]), np.array([False]), {})

    for t in range(10):
        step(t)
    sampled = np.array([0, 1, 5])  # a batch drawn now: slot 0 holds the oldest transition, complete
    assert rb.row == 0 and rb.pending[0] == 2 and (rb.priorities.tree.leaves[sampled] > 0).all()
    step(10)  # the ring wraps: slot 0 is written again, its new transition waits while the batch's loss is computed
    assert rb.pending[0] == 2 and rb.priorities.tree.leaves[0] == 0
    rb.update_priorities(sampled, np.array([5.0, 6.0, 7.0]))
    assert rb.priorities.tree.leaves[0] == 0, "the waiting transition stays unsampleable: the old one's loss is not its priority"
    assert rb.priorities.tree.leaves[1] == np.float32(6.0 + 1e-6) and rb.priorities.tree.leaves[5] == np.float32(7.0 + 1e-6)
    assert 0 not in rb.sampleable() and {1, 5} <= set(rb.sampleable().tolist())


def test_state_dict_round_trip_keeps_priorities_and_waiting_transitions(tmp_path):
    def make():
        return ReplayBuffer(3 * 50, 3, VECTOR_OBS, ACTIONS, n_step=3, gamma=0.99, alpha=0.5)

    rb = make()
    stream = scripted_stream(3, 200, seed=4)
    for _ in range(70):
        rb.add(*next(stream))
    np.random.seed(5)
    for _ in range(10):
        rb.beta = 0.5
        batch = rb.sample(16)
        rb.update_priorities(batch.indices, np.random.standard_normal(16))
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    restored = make()
    restored.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    np.testing.assert_array_equal(restored.priorities.tree.nodes, rb.priorities.tree.nodes)
    assert restored.priorities.max_priority == rb.priorities.max_priority
    assert np.array_equal(restored.pending, rb.pending) and restored.complete == rb.complete
    later = list(stream)[:40]
    for buffer in (rb, restored):  # both go on alike: same inserts, samples, weights and updates
        np.random.seed(6)
        for step in later:
            buffer.add(*step)
            buffer.beta = 0.7
            batch = buffer.sample(8)
            buffer.update_priorities(batch.indices, batch.rewards)
        buffer.last = batch
    np.testing.assert_array_equal(restored.priorities.tree.nodes, rb.priorities.tree.nodes)
    for got, want in zip(restored.last, rb.last):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(FleetError, match="n_step: 3 in the checkpoint, 1 here"):
        ReplayBuffer(3 * 50, 3, VECTOR_OBS, ACTIONS, alpha=0.5).load_state_dict(rb.state_dict())


def test_a_1m_atari_prioritized_n_step_buffer_takes_dqns_memory_plus_9_bytes_a_transition():
    plain = required_bytes(1_000_000, ATARI_OBS, ACTIONS)
    rainbow = required_bytes(1_000_000, ATARI_OBS, ACTIONS, n_step=3, prioritized=True)
    assert rainbow - plain == 4 * (2 * 1_000_000 - 1) + 1_000_000, "the tree (2 float32 a slot), where returns stop"
    assert rainbow < 1.002 * plain < 8e9
    small = ReplayBuffer(1000, 2, ATARI_OBS, ACTIONS, n_step=3, gamma=0.99, alpha=0.5)
    base = ReplayBuffer(1000, 2, ATARI_OBS, ACTIONS)
    extra = sum(a.nbytes for a in vars(small).values() if isinstance(a, np.ndarray)) - sum(
        a.nbytes for a in vars(base).values() if isinstance(a, np.ndarray))
    assert extra + small.priorities.tree.nodes.nbytes == required_bytes(1000, ATARI_OBS, ACTIONS, num_envs=2, n_step=3,
                                                                         prioritized=True) - required_bytes(1000, ATARI_OBS, ACTIONS, num_envs=2)
    assert small.frames.nbytes == base.frames.nbytes, "frames stored once, as DQN's"


@pytest.mark.parametrize("kwargs, message", [
    (dict(alpha=-0.1), "alpha .* at least 0"),
    (dict(alpha=0.5, priority_eps=0.0), "epsilon .* above 0"),
    (dict(n_step=0, gamma=0.9), "--n-step .* at least 1"),
    (dict(n_step=3), "gamma"),
    (dict(n_step=3, gamma=1.5), "gamma"),
    (dict(n_step=11, gamma=0.9), "cannot hold the 11 steps"),
])
def test_bad_options_are_refused_with_a_clear_error(kwargs, message):
    with pytest.raises(FleetError, match=message):
        ReplayBuffer(10, 1, VECTOR_OBS, ACTIONS, **kwargs)
    with pytest.raises(FleetError, match="needs a prioritised replay buffer"):
        ReplayBuffer(10, 1, VECTOR_OBS, ACTIONS).update_priorities(np.arange(2), np.ones(2))
