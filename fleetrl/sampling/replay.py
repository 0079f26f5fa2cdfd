"""The replay buffer of DQN, SAC and TD3: preallocated ring storage in each process, each Atari frame stored once,
uniform batches on the learner's device.

Layout. Row ``r`` of the ring holds one vector-env step: slot ``r * num_envs + i`` is env ``i``'s transition. Vector
observations are stored twice (``obs`` and the true ``next_obs``: a few bytes). A frame stack (uint8 ``(4, 84, 84)``,
stacked on axis 0) is stored as single frames in one ring per env; a transition keeps where its two stacks end, and
stacks are rebuilt when sampled. How the env fills a stack is never assumed: each stack to store is compared with the
one before it, and

* a stack that shifts the previous one by a frame (the usual step) adds that one frame;
* the same stack again (ALE's lost life: the next "episode" starts from the final observation) adds nothing;
* any other stack (an episode's first, the true final observation of odd envs) starts a *segment*: its frames are
  stored, except that leading copies of its first frame are stored once, since rebuilding repeats a segment's first
  frame for positions before it (the gymnasium chain, ALE and EnvPool pad a reset stack that way; a stack padded
  otherwise, with zeros say, is stored in full).

So a stack is always rebuilt exactly as the env returned it, and never from frames of another segment. An episode of
``L`` steps takes about ``L + 1`` frames (its final observation's frame is kept for the time-limit bootstrap), so the
frame rings hold :data:`FRAME_MARGIN` more frames than transitions; a transition whose frames were overwritten anyway
(the oldest, with unusually short episodes) is never sampled.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import psutil
import torch

from fleetrl.errors import FleetError
from fleetrl.nets import network_obs_dtype

FRAME_MARGIN = 1 / 16  # extra frames per transition in a frame ring: one per episode of at least 16 steps
MEMORY_HEADROOM = 1 << 30  # bytes of available memory left for the networks, envs and the rest of the process
# what a --save-buffer checkpoint holds in memory besides the buffer: its shard is streamed from the buffer's arrays to a
# file and read back through a memory map, so never a copy of the buffer, only the pickled structure and I/O buffers
# (measured under 1 MB for a 760 MB buffer, where serialising it in memory took 765 MB to save and 1,529 MB to load)
CHECKPOINT_BYTES = 64 << 20
MAX_REDRAWS = 1000  # draws of indices that hit overwritten frames before sampling gives up (it needs a handful)


class ReplayBatch(NamedTuple):
    """A sampled batch on the learner's device; ``dones`` (terminated only) and ``rewards`` are float32 ``(B,)``."""

    obs: torch.Tensor
    actions: torch.Tensor
    next_obs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor


def stacks_frames(obs_space: gym.Space, frame_stack: bool | None = None) -> bool:
    """Whether observations are stored as single frames: ``frame_stack``, or by default (None) a uint8 3-D
    observation stacked on its first, shortest axis, like Atari's ``(4, 84, 84)``."""
    shape = tuple(obs_space.shape or ())
    if frame_stack is None:
        return len(shape) == 3 and np.dtype(obs_space.dtype) == np.uint8 and shape[0] < min(shape[1:])
    if frame_stack and len(shape) < 2:
        raise FleetError(f"frame_stack=True stores observations as frames stacked on their first axis, and the observation "
                         f"space {obs_space} has no frames; leave frame_stack at its default (None: auto).")
    return bool(frame_stack)


def required_bytes(capacity: int, obs_space: gym.Space, action_space: gym.Space, frame_stack: bool | None = None,
                   num_envs: int = 1) -> int:
    """The bytes a :class:`ReplayBuffer` of ``capacity`` transitions takes (all of its arrays, filled)."""
    layout = _Layout(capacity, num_envs, obs_space, action_space, frame_stack)
    return layout.nbytes()


def check_fits_in_memory(capacity: int, obs_space: gym.Space, action_space: gym.Space, frame_stack: bool | None = None,
                         num_envs: int = 1, processes: int = 1, buffer_size: int | None = None, save_buffer: bool = False) -> int:
    """Refuse, with a :class:`FleetError` naming the numbers and the fix, a buffer that would not fit in the memory
    available now (less :data:`MEMORY_HEADROOM`); else return the bytes it needs.

    ``processes``: how many such buffers this machine holds (the torchrun processes on it); ``buffer_size``: the
    ``--buffer-size`` flag these buffers share (default ``capacity * processes``), to say how far to lower it;
    ``save_buffer``: checkpoints hold the buffers (``--save-buffer``), which needs :data:`CHECKPOINT_BYTES` more each.
    """
    buffer_bytes = required_bytes(capacity, obs_space, action_space, frame_stack, num_envs)
    need = (buffer_bytes + (CHECKPOINT_BYTES if save_buffer else 0)) * processes
    available = psutil.virtual_memory().available
    usable = max(available - MEMORY_HEADROOM, 0)
    if need <= usable:
        return need
    buffer_size = capacity * processes if buffer_size is None else buffer_size
    fits = _round_down(buffer_size * max(usable - (need - buffer_bytes * processes), 0) / (buffer_bytes * processes))
    frames = stacks_frames(obs_space, frame_stack)
    how = ("each frame of the stacks stored once" if frames else "each observation and next observation stored")
    where = f" ({processes} processes on this machine, a buffer each)" if processes > 1 else ""
    saved = (f", plus {_gb(CHECKPOINT_BYTES * processes)} for --save-buffer's checkpoints (each process streams its buffer to a "
             f"file of its own and reads it back mapped, so never holds it twice)" if save_buffer else "")
    raise FleetError(
        f"The replay buffer does not fit in memory: --buffer-size {buffer_size:,} transitions of {obs_space.shape} "
        f"{np.dtype(obs_space.dtype).name} observations{where} need {_gb(need)} ({buffer_bytes / capacity:,.0f} "
        f"bytes per transition, {how}{saved}), and this machine has {_gb(available)} available, of which {_gb(MEMORY_HEADROOM)} "
        f"is kept for the networks and the envs. Lower --buffer-size to at most {fits:,}, or free memory (other programs, or fewer "
        f"training processes on this machine), or run on a machine with more memory."
    )


class ReplayBuffer:
    """Preallocated numpy ring storage of one process's transitions, interleaving its ``num_envs`` envs.

    ``capacity`` is rounded down to whole steps of ``num_envs``. ``frame_stack``: store single frames and rebuild
    stacks (default: auto, see :func:`stacks_frames`). ``check_memory``: run :func:`check_fits_in_memory` before
    allocating. Sampling uses numpy's global RNG, which the run seeds and checkpoints.
    """

    def __init__(self, capacity: int, num_envs: int, obs_space: gym.Space, action_space: gym.Space,
                 device: torch.device | str = "cpu", frame_stack: bool | None = None, check_memory: bool = True):
        if capacity < num_envs:
            raise FleetError(f"A replay buffer of {capacity} transitions cannot hold one step of {num_envs} envs: "
                             f"raise --buffer-size to at least {num_envs} per process.")
        if check_memory:
            check_fits_in_memory(capacity, obs_space, action_space, frame_stack, num_envs)
        layout = _Layout(capacity, num_envs, obs_space, action_space, frame_stack)
        self.num_envs, self.rows, self.capacity = num_envs, layout.rows, layout.rows * num_envs
        self.device = torch.device(device)
        self.frame_stack, self.obs_shape, self.action_shape = layout.frames, layout.obs_shape, layout.action_shape
        self.row = 0  # the next row to write
        self.filled = 0  # rows written
        slots = self.capacity
        self.actions = np.empty((slots, *layout.action_shape), layout.action_dtype)
        self.rewards = np.empty(slots, np.float32)
        self.dones = np.empty(slots, np.float32)
        if not self.frame_stack:
            self.obs = np.empty((slots, *layout.obs_shape), layout.obs_dtype)
            self.next_obs = np.empty((slots, *layout.obs_shape), layout.obs_dtype)
            return
        self.stack, self.frames_per_env = layout.obs_shape[0], layout.frames_per_env
        self.frames = np.empty((num_envs, self.frames_per_env, *layout.obs_shape[1:]), layout.obs_dtype)
        # per slot: the absolute frame positions where its obs and next obs stacks end and where their segments start
        self.obs_end, self.obs_start = np.empty(slots, np.int64), np.empty(slots, np.int64)
        self.next_end, self.next_start = np.empty(slots, np.int64), np.empty(slots, np.int64)
        # per env: frames written so far (the next one's absolute position), and the stack the next step acts on
        self.written = np.zeros(num_envs, np.int64)
        self.last_obs = np.zeros((num_envs, *layout.obs_shape), layout.obs_dtype)
        self.has_last = np.zeros(num_envs, bool)
        self.last_end, self.last_start = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64)
        self._offsets = np.arange(1 - self.stack, 1)

    def __len__(self) -> int:
        return self.filled * self.num_envs

    # ------------------------------------------------------------------------------------------------ writing
    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any] | None) -> None:
        """Store one step of every env, as ``envs.step`` returned it (same-step autoreset: where
        ``info["_final_obs"][i]``, the true next observation is ``info["final_obs"][i]``). ``dones`` is
        ``terminated``: a truncated transition bootstraps from its final observation."""
        n = self.num_envs
        ended = np.flatnonzero(info["_final_obs"]) if info and "_final_obs" in info else ()
        true_next = next_obs
        if len(ended):
            true_next = np.array(next_obs)
            for i in ended:
                true_next[i] = info["final_obs"][i]
        slots = slice(self.row * n, (self.row + 1) * n)
        if self.frame_stack:
            self._add_frames(slots, obs, true_next, next_obs, ended)
        else:
            self.obs[slots] = obs
            self.next_obs[slots] = true_next
        self.actions[slots] = np.asarray(actions).reshape(self.actions[slots].shape)
        self.rewards[slots] = rewards
        self.dones[slots] = terminated
        self.row = (self.row + 1) % self.rows
        self.filled = min(self.filled + 1, self.rows)

    def _add_frames(self, slots: slice, obs: np.ndarray, true_next: np.ndarray, next_obs: np.ndarray, ended) -> None:
        # the stack acted on is the one stored as the last step's next obs, unless the caller reset the envs or skipped steps
        stored = self.has_last & _rows_equal(obs, self.last_obs)
        for i in np.flatnonzero(~stored):
            self.last_end[i], self.last_start[i] = self._store_segment(i, obs[i])
        self.obs_end[slots], self.obs_start[slots] = self.last_end, self.last_start
        end, start = self._store_after(np.arange(self.num_envs), true_next, obs, self.last_end, self.last_start)
        self.next_end[slots], self.next_start[slots] = end, start
        if len(ended):  # the next episode's first stack follows the final one
            end[ended], start[ended] = self._store_after(ended, next_obs[ended], true_next[ended], end[ended], start[ended])
        self.last_end, self.last_start = end, start
        np.copyto(self.last_obs, next_obs)
        self.has_last[:] = True

    def _store_after(self, envs: np.ndarray, stacks: np.ndarray, before: np.ndarray, end: np.ndarray, start: np.ndarray):
        """Store ``stacks[k]`` of env ``envs[k]`` after ``before[k]``, its latest stack (ending at ``end[k]``): where
        the new frames end and where their segment starts."""
        end, start = end.copy(), start.copy()
        shifted = _rows_equal(stacks[:, :-1], before[:, 1:])
        if shifted.any():  # the usual step: one new frame
            ids = envs[shifted]
            end[shifted] = self.written[ids]
            self.frames[ids, end[shifted] % self.frames_per_env] = stacks[shifted, -1]
            self.written[ids] += 1
        for k in np.flatnonzero(~shifted):
            if not np.array_equal(stacks[k], before[k]):  # the same stack again needs no frame
                end[k], start[k] = self._store_segment(envs[k], stacks[k])
        return end, start

    def _store_segment(self, env: int, stack: np.ndarray) -> tuple[int, int]:
        """Store a stack that does not follow the one before; leading copies of its first frame are stored once."""
        first = 0
        while first + 1 < self.stack and np.array_equal(stack[first + 1], stack[0]):
            first += 1
        start = int(self.written[env])
        count = self.stack - first
        self.frames[env, (start + np.arange(count)) % self.frames_per_env] = stack[first:]
        self.written[env] += count
        return start + count - 1, start

    # ------------------------------------------------------------------------------------------------ reading
    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly (with replacement), on ``device``."""
        return self.get(self.sample_indices(batch_size))

    def sample_indices(self, batch_size: int) -> np.ndarray:
        """Uniform slot indices of sampleable transitions (numpy's global RNG)."""
        if not self.filled:
            raise FleetError("The replay buffer is empty: add transitions before sampling (sample after --learning-starts).")
        size = self.filled * self.num_envs
        indices = np.random.randint(0, size, batch_size)
        if self.frame_stack:
            for _ in range(MAX_REDRAWS):
                lost = ~self._sampleable(indices)
                if not lost.any():
                    break
                indices[lost] = np.random.randint(0, size, int(lost.sum()))
            else:
                raise FleetError(f"The replay buffer found no stored transition whose frames are still stored after {MAX_REDRAWS} "
                                 f"draws: the env starts a new frame stack at nearly every step. Store whole observations "
                                 f"(frame_stack=False).")
        return indices

    def get(self, indices: np.ndarray) -> ReplayBatch:
        """The transitions at slot ``indices`` (``row * num_envs + env``), on ``device``."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.frame_stack:
            envs = indices % self.num_envs
            obs = self._stacks(envs, self.obs_end[indices], self.obs_start[indices])
            next_obs = self._stacks(envs, self.next_end[indices], self.next_start[indices])
        else:
            obs, next_obs = self.obs[indices], self.next_obs[indices]
        arrays = (obs, self.actions[indices], next_obs, self.rewards[indices], self.dones[indices])
        return ReplayBatch(*(torch.from_numpy(a).to(self.device) for a in arrays))

    def sampleable(self) -> np.ndarray:
        """Every slot index :meth:`sample` may draw (all written slots, less those whose frames were overwritten)."""
        indices = np.arange(self.filled * self.num_envs)
        return indices[self._sampleable(indices)] if self.frame_stack else indices

    def _sampleable(self, indices: np.ndarray) -> np.ndarray:
        first = np.minimum(np.maximum(self.obs_end[indices] + 1 - self.stack, self.obs_start[indices]),
                           np.maximum(self.next_end[indices] + 1 - self.stack, self.next_start[indices]))
        return first >= self.written[indices % self.num_envs] - self.frames_per_env

    def _stacks(self, envs: np.ndarray, end: np.ndarray, start: np.ndarray) -> np.ndarray:
        # positions before a segment's start repeat its first frame
        positions = np.maximum(end[:, None] + self._offsets, start[:, None]) % self.frames_per_env
        return self.frames[envs[:, None], positions]

    # ------------------------------------------------------------------------------------------------ checkpoints
    def _array_names(self) -> tuple[list[str], list[str]]:
        """(arrays with a row per slot, whole arrays): what a checkpoint holds besides the cursor."""
        if not self.frame_stack:
            return ["actions", "rewards", "dones", "obs", "next_obs"], []
        return (["actions", "rewards", "dones", "obs_end", "obs_start", "next_end", "next_start"],
                ["written", "last_obs", "has_last", "last_end", "last_start"])

    def state_dict(self) -> dict[str, Any]:
        """The contents as torch tensors (``torch.load(weights_only=True)`` takes them) and the cursor: only the
        written part, so a checkpoint of a part-filled buffer is that much smaller."""
        state: dict[str, Any] = {"capacity": self.capacity, "num_envs": self.num_envs, "frame_stack": self.frame_stack,
                                 "row": self.row, "filled": self.filled}
        per_slot, whole = self._array_names()
        used = self.filled * self.num_envs
        for name in per_slot:
            state[name] = torch.from_numpy(getattr(self, name)[:used])
        for name in whole:
            state[name] = torch.from_numpy(getattr(self, name))
        if self.frame_stack:  # each env's ring up to what it wrote: a view, so a checkpoint streams it without a copy
            state["frames"] = [torch.from_numpy(self.frames[i, : min(self.frames_per_env, int(n))]) for i, n in enumerate(self.written)]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s contents into this buffer (same capacity, envs and layout), copying them."""
        per_slot, whole = self._array_names()
        mine = {"capacity": self.capacity, "num_envs": self.num_envs, "frame_stack": self.frame_stack,
                **{name: tuple(getattr(self, name).shape[1:]) for name in per_slot},
                **{name: tuple(getattr(self, name).shape) for name in whole}}
        theirs = {k: (tuple(state[k].shape[1:]) if k in per_slot else tuple(state[k].shape) if k in whole else state[k])
                  if k in state else None for k in mine}
        if self.frame_stack:  # a ring per env (a tensor of them, from checkpoints written before the list)
            rings = list(state.get("frames", []))
            mine["frames"], theirs["frames"] = {self.frames.shape[2:]}, {tuple(ring.shape[1:]) for ring in rings}
            mine["frame rings"], theirs["frame rings"] = self.num_envs, len(rings)
        if theirs != mine:
            differ = "; ".join(f"{k}: {theirs[k]} in the checkpoint, {mine[k]} here" for k in mine if theirs[k] != mine[k])
            raise FleetError(f"The checkpoint's replay buffer does not match this run's ({differ}): resume with the same "
                             f"--buffer-size, --num-envs and env, or without the saved buffer.")
        self.row, self.filled = int(state["row"]), int(state["filled"])
        for name in per_slot:
            getattr(self, name)[: len(state[name])] = state[name].numpy()
        for name in whole:
            np.copyto(getattr(self, name), state[name].numpy())
        if self.frame_stack:
            for i, ring in enumerate(rings):
                self.frames[i, : len(ring)] = ring.numpy()


class _Layout:
    """The shapes and dtypes of a buffer's arrays (shared by the buffer and the memory estimate)."""

    def __init__(self, capacity: int, num_envs: int, obs_space: gym.Space, action_space: gym.Space, frame_stack: bool | None):
        self.rows = max(capacity // num_envs, 1)
        self.num_envs = num_envs
        self.obs_shape = tuple(obs_space.shape)
        self.obs_dtype = network_obs_dtype(self.obs_shape, obs_space.dtype)
        self.frames = stacks_frames(obs_space, frame_stack)
        if isinstance(action_space, gym.spaces.Discrete):
            self.action_shape, self.action_dtype = (), np.dtype(np.int64)
        elif isinstance(action_space, gym.spaces.Box):
            self.action_shape, self.action_dtype = (int(np.prod(action_space.shape)),), np.dtype(np.float32)
        else:
            raise FleetError(f"The replay buffer stores Discrete or Box actions, and the env's action space is {action_space}.")
        # a step stores at most three segments per env (the obs acted on, the final obs, the next episode's first)
        self.frames_per_env = self.rows + int(self.rows * FRAME_MARGIN) + 3 * self.obs_shape[0] if self.frames else 0

    def nbytes(self) -> int:
        slots = self.rows * self.num_envs
        obs_bytes = int(np.prod(self.obs_shape)) * self.obs_dtype.itemsize
        per_slot = int(np.prod(self.action_shape)) * self.action_dtype.itemsize + 4 + 4  # actions, rewards, dones
        if not self.frames:
            return slots * (per_slot + 2 * obs_bytes)
        frame_bytes = obs_bytes // self.obs_shape[0]
        return slots * (per_slot + 4 * 8) + self.num_envs * (self.frames_per_env * frame_bytes + obs_bytes)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b).reshape(len(a), -1).all(axis=1)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _round_down(n: float) -> int:
    """Down to two significant digits: a flag value to suggest."""
    n = int(n)
    if n < 100:
        return max(n, 0)
    scale = 10 ** (len(str(n)) - 2)
    return n // scale * scale
