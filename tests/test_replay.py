"""The replay buffer: exact frame stacks across episode ends and the ring's wrap, the true final observation at a
time limit, its memory estimate and check, checkpoint round trips, and batch dtypes."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import require_module
from fleetrl.envs import make_vector_env
from fleetrl.envs.vector import SyncVectorEnv
from fleetrl.errors import FleetError
from fleetrl.sampling import replay
from fleetrl.sampling.replay import CHECKPOINT_BYTES, ReplayBuffer, check_fits_in_memory, required_bytes

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def fill(rb, envs, steps, seed=0, truth=None, check_every=None):
    """Step ``envs`` with random actions into ``rb``, keeping each slot's true transition in ``truth``; every
    ``check_every`` steps, check every sampleable slot against it. Returns (truth, terminations, truncations)."""
    truth = {} if truth is None else truth
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    space = envs.single_action_space
    ends = np.zeros(2, int)
    for t in range(steps):
        if isinstance(space, gym.spaces.Discrete):
            actions = rng.integers(0, space.n, envs.num_envs)
        else:
            actions = rng.uniform(space.low, space.high, (envs.num_envs, *space.shape)).astype(np.float32)
        next_obs, rewards, terminated, truncated, info = envs.step(actions)
        row = rb.row
        rb.add(obs, next_obs, actions, rewards, terminated, truncated, info)
        for i in range(envs.num_envs):
            true_next = info["final_obs"][i] if "_final_obs" in info and info["_final_obs"][i] else next_obs[i]
            truth[row * envs.num_envs + i] = (obs[i].copy(), np.array(true_next), actions[i], rewards[i], terminated[i], truncated[i])
        ends += terminated.sum(), truncated.sum()
        obs = next_obs
        if check_every and (t + 1) % check_every == 0:
            check_against_truth(rb, truth)
    return truth, ends[0], ends[1]


def check_against_truth(rb, truth, indices=None):
    indices = rb.sampleable() if indices is None else indices
    batch = rb.get(indices)
    for k, slot in enumerate(indices):
        obs, next_obs, action, reward, terminated, _ = truth[int(slot)]
        np.testing.assert_array_equal(batch.obs[k].numpy(), obs, err_msg=f"obs of slot {slot}")
        np.testing.assert_array_equal(batch.next_obs[k].numpy(), next_obs, err_msg=f"next obs of slot {slot}")
        np.testing.assert_array_equal(batch.actions[k].numpy(), action)
        assert batch.rewards[k].item() == np.float32(reward) and batch.dones[k].item() == float(terminated)
    return batch


def check_sampling_draws_only_exact_transitions(rb, truth):
    np.random.seed(3)
    indices = rb.sample_indices(512)
    np.random.seed(3)
    batch = rb.sample(512)
    assert set(indices.tolist()) <= set(rb.sampleable().tolist())
    expected = check_against_truth(rb, truth, indices)
    for got, want in zip(batch, expected):
        assert torch.equal(got, want)


ATARI_BACKENDS = ["sync", "ale", "envpool"]


@pytest.mark.parametrize("backend", ATARI_BACKENDS)
def test_frame_stacks_are_rebuilt_exactly_across_episode_ends_and_the_ring_wrap(backend):
    require_module("ale_py", "atari")
    if backend == "envpool":
        require_module("envpool", "envpool")
    envs = make_vector_env("BreakoutNoFrameskip-v4", 2, backend, training=True)
    rb = ReplayBuffer(300, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    assert rb.frame_stack, "a uint8 (4, 84, 84) observation is stored as frames by default"
    truth, lives_lost, truncations = fill(rb, envs, 450, check_every=90)
    envs.close()
    assert lives_lost >= 8 and len(rb) == 300, "several episode ends, and the ring of 150 steps wrapped twice"
    batch = check_against_truth(rb, truth)
    assert batch.obs.dtype == torch.uint8 and batch.obs.shape[1:] == (4, 84, 84)
    # a frame per step, and one per episode end: every transition of the ring still has its frames
    assert len(rb.sampleable()) == len(rb)
    assert rb.frames.nbytes < 0.3 * 2 * len(rb) * 4 * 84 * 84
    check_sampling_draws_only_exact_transitions(rb, truth)


class OddStacksEnv(gym.Env):
    """Frame stacks built every way an env might: shifted by one new frame, the same stack again (ALE's lost life),
    a brand-new stack, a reset padded with copies of its first frame or with zeros; short episodes ending in
    termination or truncation."""

    observation_space = ATARI_OBS.__class__(0, 255, (4, 6, 6), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._new_stack(), {}

    def step(self, action):
        kind = self.np_random.integers(0, 5)
        if kind <= 1:
            self.stack = np.concatenate([self.stack[1:], self._frame()[None]])
        elif kind == 2:
            pass  # the same stack
        else:
            self._new_stack()
        end = self.np_random.random()
        return self.stack.copy(), 1.0, bool(end < 0.1), bool(0.1 <= end < 0.2), {}

    def _frame(self):
        return self.np_random.integers(0, 256, (6, 6), dtype=np.uint8)

    def _new_stack(self):
        kind = self.np_random.integers(0, 3)
        frames = [self._frame() for _ in range(4)]
        if kind == 0:
            frames = [frames[3]] * 4
        elif kind == 1:
            frames[:2] = [np.zeros((6, 6), np.uint8)] * 2
        self.stack = np.stack(frames)
        return self.stack.copy()


def test_stacks_whose_frames_were_overwritten_are_never_sampled():
    envs = SyncVectorEnv([OddStacksEnv, OddStacksEnv])
    rb = ReplayBuffer(60, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    truth, terminations, truncations = fill(rb, envs, 200, check_every=7)
    assert terminations > 5 and truncations > 5
    fill(rb, envs, 20, seed=1, truth=truth, check_every=5)  # the caller reset the envs: their obs is no stored stack
    sampleable = len(rb.sampleable())
    assert 0 < sampleable < len(rb), "new stacks take up to 4 frames: the oldest transitions lost theirs"
    check_sampling_draws_only_exact_transitions(rb, truth)


def test_truncation_stores_the_final_observation_and_bootstraps():
    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=12) for _ in range(2)])
    rb = ReplayBuffer(1000, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    assert not rb.frame_stack
    truth, terminations, truncations = fill(rb, envs, 300)
    assert terminations > 5 and truncations > 5
    check_against_truth(rb, truth, np.arange(len(rb)))  # next obs: the final one where an episode ended
    truncated = [slot for slot, (*_, was_terminated, was_truncated) in truth.items()
                 if was_truncated and not was_terminated and slot + 2 in truth]
    batch = rb.get(np.array(truncated))
    assert not batch.dones.any(), "done is terminated only: a time limit bootstraps"
    for k, slot in enumerate(truncated):  # not the next episode's first obs, which the env returned as next_obs
        assert not np.array_equal(batch.next_obs[k].numpy(), truth[slot + 2][0])
    terminated = [slot for slot, (*_, was_terminated, _) in truth.items() if was_terminated]
    assert rb.get(np.array(terminated)).dones.all()


def test_1m_atari_buffer_takes_under_8_gb_and_a_buffer_too_big_is_refused(monkeypatch):
    need = required_bytes(1_000_000, ATARI_OBS, gym.spaces.Discrete(4))
    assert 7.06e9 < need <= 8e9, need  # a frame per transition (7,056 bytes), 1/16 spare for episode ends
    assert need < 0.3 * 2 * 1_000_000 * 4 * 84 * 84, "CleanRL stores two 4-frame stacks per transition"
    assert required_bytes(1_000_000, gym.spaces.Box(-1, 1, (17,), np.float64), gym.spaces.Box(-1, 1, (6,))) < 2e8

    class Memory:
        available = 20 * 10**9

    monkeypatch.setattr(replay.psutil, "virtual_memory", lambda: Memory)
    assert check_fits_in_memory(1_000_000, ATARI_OBS, gym.spaces.Discrete(4)) == need
    with pytest.raises(FleetError) as error:
        check_fits_in_memory(1_000_000, ATARI_OBS, gym.spaces.Discrete(4), processes=4, buffer_size=4_000_000)
    message = str(error.value)
    assert "--buffer-size 4,000,000" in message and f"need {need * 4 / 1e9:.1f} GB" in message
    assert "20.0 GB available" in message and "Lower --buffer-size to at most 2,500,000" in message, message
    with pytest.raises(FleetError, match="does not fit in memory"):  # refused before anything is allocated
        ReplayBuffer(10**9, 1, ATARI_OBS, gym.spaces.Discrete(4), "cpu")


def test_the_memory_check_counts_what_save_buffer_checkpoints_need_and_says_so(monkeypatch):
    need = required_bytes(1_000_000, ATARI_OBS, gym.spaces.Discrete(4))

    class Memory:
        available = 2 * need + (1 << 30) + CHECKPOINT_BYTES  # two buffers fit, with the headroom: their checkpoints do not

    monkeypatch.setattr(replay.psutil, "virtual_memory", lambda: Memory)
    assert check_fits_in_memory(1_000_000, ATARI_OBS, gym.spaces.Discrete(4), processes=2) == 2 * need
    assert check_fits_in_memory(1_000_000, ATARI_OBS, gym.spaces.Discrete(4), save_buffer=True) == need + CHECKPOINT_BYTES
    with pytest.raises(FleetError) as error:
        check_fits_in_memory(1_000_000, ATARI_OBS, gym.spaces.Discrete(4), processes=2, buffer_size=2_000_000, save_buffer=True)
    message = str(error.value)
    assert f"need {(2 * need + 2 * CHECKPOINT_BYTES) / 1e9:.1f} GB" in message and "for --save-buffer's checkpoints" in message, message
    assert "Lower --buffer-size to at most 1,900,000" in message, message


@pytest.mark.parametrize("env", ["odd-stacks", "CartPole-v1"])
def test_state_dict_round_trip_samples_the_same(tmp_path, env):
    def make():
        if env == "odd-stacks":
            return SyncVectorEnv([OddStacksEnv, OddStacksEnv])
        return SyncVectorEnv([lambda: gym.make(env) for _ in range(2)])

    envs = make()
    rb = ReplayBuffer(60, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    fill(rb, envs, 45)  # part-filled: the checkpoint holds the written part only
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    restored = ReplayBuffer(60, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    restored.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    assert len(restored) == len(rb) == 2 * 30
    for steps in (0, 40):  # and both go on alike after more steps
        if steps:
            fill(rb, envs, steps, seed=5)
            fill(restored, envs, steps, seed=5)
        np.random.seed(7)
        a = rb.sample(64)
        np.random.seed(7)
        b = restored.sample(64)
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    envs.close()
    other = ReplayBuffer(80, 2, envs.single_observation_space, envs.single_action_space, "cpu")
    with pytest.raises(FleetError, match="same --buffer-size"):
        other.load_state_dict(rb.state_dict())


@pytest.mark.parametrize("env_id, action_dtype, action_shape", [("CartPole-v1", torch.int64, ()), ("Pendulum-v1", torch.float32, (1,))])
def test_batch_dtypes_and_shapes_for_discrete_and_box_actions(env_id, action_dtype, action_shape):
    envs = SyncVectorEnv([lambda: gym.make(env_id) for _ in range(3)])
    rb = ReplayBuffer(100, 3, envs.single_observation_space, envs.single_action_space, "cpu")
    fill(rb, envs, 20)
    batch = rb.sample(32)
    obs_dim = envs.single_observation_space.shape[0]
    assert batch.obs.dtype == batch.next_obs.dtype == torch.float32 and batch.obs.shape == batch.next_obs.shape == (32, obs_dim)
    assert batch.actions.dtype == action_dtype and batch.actions.shape == (32, *action_shape)
    assert batch.rewards.dtype == batch.dones.dtype == torch.float32 and batch.rewards.shape == batch.dones.shape == (32,)
    assert len(rb) == 60 and rb.capacity == 99
