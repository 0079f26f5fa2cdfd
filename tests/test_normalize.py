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
