"""GAE (the recurrence in fleetrl/algos/ppo.py) against a plain per-env, per-step reference, including time-limit
bootstrapping; the rollout buffer's flat views."""

from types import SimpleNamespace

import numpy as np

from fleetrl.algos.ppo import gae
from fleetrl.sampling.rollout import RolloutBuffer


def compute_gae(rewards, values, terminated, dones, final_values, last_values, gamma, lam, env_ids=None):
    """ppo.gae over arrays, as a rollout buffer holds them."""
    buffer = SimpleNamespace(rewards=rewards, values=values, terminated=terminated, dones=dones, final_values=final_values,
                             last_values=last_values, env_ids=env_ids)
    return gae(buffer, gamma, lam)


def reference_gae(rewards, values, terminated, truncated, final_values, last_values, gamma, lam):
    """Written the obvious way: one env at a time, walking backwards, one case per line."""
    steps, envs = rewards.shape
    adv = np.zeros((steps, envs))
    for i in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if terminated[t, i]:
                next_value = 0.0
            elif truncated[t, i]:
                next_value = final_values[t, i]  # the episode was cut by a time limit: bootstrap
            elif t == steps - 1:
                next_value = last_values[i]
            else:
                next_value = values[t + 1, i]
            delta = rewards[t, i] + gamma * next_value - values[t, i]
            episode_ends = terminated[t, i] or truncated[t, i]
            running = delta if episode_ends else delta + gamma * lam * running
            adv[t, i] = running
    return adv


def random_rollout(rng, steps=64, envs=5):
    terminated = rng.random((steps, envs)) < 0.05
    truncated = (rng.random((steps, envs)) < 0.05) & ~terminated
    final_values = np.where(truncated, rng.normal(size=(steps, envs)), 0.0)
    return (rng.normal(size=(steps, envs)), rng.normal(size=(steps, envs)), terminated, truncated, final_values, rng.normal(size=envs))


def test_gae_matches_plain_loop_reference_with_terminations_and_truncations():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rewards, values, terminated, truncated, final_values, last = random_rollout(rng)
        assert terminated.any() and truncated.any()
        got = compute_gae(rewards, values, terminated, terminated | truncated, final_values, last, 0.99, 0.95)
        want = reference_gae(rewards, values, terminated, truncated, final_values, last, 0.99, 0.95)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_truncation_bootstraps_from_final_observation_value():
    # one env, 3 steps, reward 1 each, truncated at the last step; lambda=1 gives Monte Carlo returns
    rewards = np.ones((3, 1))
    values = np.zeros((3, 1))
    terminated = np.zeros((3, 1), bool)
    truncated = np.array([[False], [False], [True]])
    final_values = np.array([[0.0], [0.0], [10.0]])
    adv = compute_gae(rewards, values, terminated, truncated, final_values, np.array([99.0]), 0.5, 1.0)
    # the value after the truncation is V(final_obs) = 10, not 0 and not the next episode's value 99
    assert adv[2, 0] == 1 + 0.5 * 10
    assert adv[0, 0] == 1 + 0.5 * (1 + 0.5 * (1 + 0.5 * 10))
    # treating the truncation as a termination (CleanRL's behaviour) would give a different answer
    as_termination = compute_gae(rewards, values, truncated, truncated, final_values, np.array([99.0]), 0.5, 1.0)
    assert as_termination[2, 0] == 1.0


def test_termination_never_bootstraps_and_cuts_the_trace():
    rewards = np.array([[1.0], [2.0]])
    values = np.array([[0.5], [0.25]])
    terminated = np.array([[True], [False]])
    adv = compute_gae(rewards, values, terminated, terminated, np.zeros((2, 1)), np.array([4.0]), 0.9, 0.8)
    assert adv[0, 0] == 1.0 - 0.5  # nothing from the next episode leaks back
    assert adv[1, 0] == 2.0 + 0.9 * 4.0 - 0.25


def test_rollout_buffer_flat_views_share_memory():
    buf = RolloutBuffer(16, 3, (4,), np.float32, (), np.int64)
    flat = buf.flat()
    assert flat["obs"].shape == (48, 4) and flat["advantages"].shape == (48,)
    buf.advantages[0, 0] = 123.0
    assert flat["advantages"][0].item() == 123.0
