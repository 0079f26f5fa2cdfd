"""Running statistics for observation/reward normalisation."""

import numpy as np
import pytest

from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer, RunningMeanStd


def test_running_mean_std_matches_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3,))
    batches = [rng.normal(loc=5, scale=3, size=(rng.integers(1, 50), 3)) for _ in range(30)]
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-3)


def test_allreduce_hook_sums_the_batch_statistics_of_every_rank():
    """Two 'ranks' each see half the data; with a summing all-reduce both hold the full statistics."""
    rng = np.random.default_rng(1)
    halves = [rng.normal(size=(40, 2)), rng.normal(loc=3, size=(40, 2))]
    sums = [np.concatenate([[len(h)], h.sum(0), np.square(h).sum(0)]) for h in halves]
    total = sums[0] + sums[1]
    rank0 = RunningMeanStd((2,))
    rank0.update(halves[0], allreduce=lambda _local: total)
    single = RunningMeanStd((2,))
    single.update(np.concatenate(halves))
    np.testing.assert_allclose(rank0.mean, single.mean)
    np.testing.assert_allclose(rank0.var, single.var)


def test_frozen_normalizer_does_not_change_and_state_round_trips():
    norm = ObsNormalizer((2,))
    norm(np.array([[1.0, 2.0], [3.0, 6.0]]))
    state = norm.rms.state_dict()
    norm.frozen = True
    norm(np.array([[100.0, 100.0]]))
    np.testing.assert_allclose(norm.rms.mean, state["mean"].numpy())
    other = ObsNormalizer((2,))
    other.rms.load_state_dict(state)
    x = np.array([[2.0, 4.0]])
    np.testing.assert_allclose(other.normalize(x), norm.normalize(x))
    assert np.abs(norm.normalize(np.array([[1e9, -1e9]]))).max() == 10.0


def test_reward_normalizer_resets_the_discounted_return_at_episode_end():
    norm = RewardNormalizer(2, gamma=0.9)
    norm(np.array([1.0, 1.0]), np.array([True, False]))
    np.testing.assert_allclose(norm.returns, [0.0, 1.0])
    norm(np.array([1.0, 1.0]), np.array([False, False]))
    np.testing.assert_allclose(norm.returns, [1.0, 1.9])


def test_scalar_statistics_survive_a_safe_checkpoint_round_trip(tmp_path):
    import torch

    norm = RewardNormalizer(3, gamma=0.99)
    for _ in range(5):
        norm(np.array([1.0, 2.0, 3.0]), np.array([False, False, True]))
    torch.save(norm.rms.state_dict(), tmp_path / "rms.pt")
    other = RunningMeanStd(())
    other.load_state_dict(torch.load(tmp_path / "rms.pt", weights_only=True))
    assert other.var == pytest.approx(float(norm.rms.var)) and other.count == pytest.approx(norm.rms.count)


def test_blank_rows_leave_the_observation_statistics_unchanged():
    """Rows of PettingZoo agents that have left a game are zeros: with ``live`` they count for nothing, so the statistics
    are those of the live rows alone, batch by batch (and every row is still normalised)."""
    rng = np.random.default_rng(2)
    masked, reference = ObsNormalizer((3,)), ObsNormalizer((3,))
    for _ in range(20):
        obs = rng.normal(loc=4.0, scale=2.0, size=(6, 3))
        live = rng.random(6) < 0.5
        obs[~live] = 0.0
        out = masked(obs, live=live)
        reference(obs[live])
        assert out.shape == obs.shape
    np.testing.assert_array_equal(masked.rms.mean, reference.rms.mean)
    np.testing.assert_array_equal(masked.rms.var, reference.rms.var)
    assert masked.rms.count == reference.rms.count
    unmasked = ObsNormalizer((3,))
    unmasked(np.zeros((6, 3)))
    assert unmasked.rms.mean[0] == 0.0 and masked.rms.mean[0] > 3.0, "the zeros would have pulled the mean down"


def test_blank_rows_leave_the_reward_statistics_unchanged():
    """Env 1's agent plays 2 steps and leaves (done), then its row is blank (reward 0): the statistics hold the returns
    of live steps only: env 0's 1, 1.9, 2.71, 3.439 and env 1's 1, 1.9."""
    norm = RewardNormalizer(2, gamma=0.9)
    steps = [([True, True], [False, False]), ([True, True], [False, True]), ([True, False], [False, False]),
             ([True, False], [False, False])]
    for live, done in steps:
        live = np.array(live)
        norm(np.where(live, 1.0, 0.0), np.array(done), live=live)
    reference = RunningMeanStd(())
    for returns in ([1.0, 1.0], [1.9, 1.9], [2.71], [3.439]):  # merged step by step, as the normaliser merges
        reference.update(np.array(returns))
    assert norm.rms.count == reference.count
    np.testing.assert_allclose(norm.rms.mean, reference.mean, rtol=1e-12)
    np.testing.assert_allclose(norm.rms.var, reference.var, rtol=1e-12)
