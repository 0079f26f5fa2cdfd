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

Rainbow's two options (issue 35), both off by default, when nothing changes, bit for bit:

* ``n_step=n, gamma=g``: a sampled transition is the n-step one. Its reward is ``r_t + g r_{t+1} + ... + g^(k-1)
  r_{t+k-1}`` (computed in float64 from the stored float32 rewards, then rounded), its ``next_obs`` the true
  observation ``k`` steps later, ``dones`` whether the episode terminated within them, and ``discounts`` the ``g^k``
  to bootstrap with. ``k = n``, or fewer where the episode ended first: at a termination (no bootstrap), at a time
  limit (bootstrapped from the true final observation, which the buffer keeps), or where a step does not continue its
  env's last one (the caller reset the envs, or a resumed run). Storage is unchanged: the n-step transition is put
  together from the one-step ones when sampled, so Atari frames are still stored once. A transition waits until its
  n steps (or its episode's end) are stored before it can be sampled: the newest ``n - 1`` steps of a running episode
  cannot.
* ``alpha=a``: prioritised replay (fleetrl/sampling/priorities.py): slots are drawn with probability proportional to
  ``priority ** a``, new transitions at the highest priority seen; :meth:`ReplayBuffer.sample` returns the slots
  (``indices``) and importance ``weights`` for ``beta``, which the caller sets (``rb.beta = ...``, annealed to 1 as
  CleanRL), and :meth:`ReplayBuffer.update_priorities` takes the new errors. The tree adds 8 bytes per transition.

An algorithm makes such a buffer through :func:`fleetrl.offpolicy.make_replay`, and uses it in three lines::

    rb = offpolicy.make_replay(run, envs, n_step=args.n_step, gamma=args.gamma, alpha=args.prioritized_replay_alpha,
                               beta=args.prioritized_replay_beta, priority_eps=args.prioritized_replay_eps)
    ...
    rb.beta = min(1.0, rb.beta_start + global_step * (1.0 - rb.beta_start) / args.total_timesteps)
    data = rb.sample(local_batch_size)          # a PrioritizedBatch: obs, actions, next_obs, rewards, dones,
                                                # discounts (B,), weights (B,), indices (numpy, this rank's slots)
    loss = (loss_per_sample * data.weights).mean()
    td_target = data.rewards + data.discounts * next_value * (1 - data.dones)
    rb.update_priorities(data.indices, loss_per_sample.detach())   # |error| + eps, as CleanRL

Under torchrun each rank's shard has its own tree and samples its own share of the batch; ``state_dict`` holds the
priorities, so a ``--save-buffer`` resume samples exactly as the run would have.

Differences from CleanRL's PrioritizedReplayBuffer, each on purpose: the last ``n - 1`` transitions of each episode
are stored, with their shorter returns (CleanRL clears its n-step queue at a termination and never stores them); a
time limit ends the n-step return and bootstraps from the final observation (CleanRL's queue runs on into the next
episode); ``discounts`` carries ``g^k`` for the steps actually taken (CleanRL uses ``g^n``); several envs. The tree,
priorities, sampled slots and weights are CleanRL's, bit for bit, on the same transitions and draws.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import psutil
import torch

from fleetrl.errors import FleetError
from fleetrl.nets import network_obs_dtype
from fleetrl.sampling.priorities import Priorities

FRAME_MARGIN = 1 / 16  # extra frames per transition in a frame ring: one per episode of at least 16 steps
MEMORY_HEADROOM = 1 << 30  # bytes of available memory left for the networks, envs and the rest of the process
# what a --save-buffer checkpoint holds in memory besides the buffer: its shard is streamed from the buffer's arrays to a
# file and read back through a memory map, so never a copy of the buffer, only the pickled structure and I/O buffers
# (measured under 1 MB for a 760 MB buffer, where serialising it in memory took 765 MB to save and 1,529 MB to load)
CHECKPOINT_BYTES = 64 << 20
MAX_REDRAWS = 1000  # draws of indices that hit overwritten frames before sampling gives up (it needs a handful)


class ReplayBatch(NamedTuple):
    """A sampled batch on the learner's device; ``dones`` (terminated only) and ``rewards`` are float32 ``(B,)``.
    A plain buffer's: one-step transitions, uniform, so ``discounts``, ``weights`` and ``indices`` are None (a loss can
    be written once for both kinds of batch)."""

    obs: torch.Tensor
    actions: torch.Tensor
    next_obs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor

    @property
    def discounts(self) -> None:
        return None

    @property
    def weights(self) -> None:
        return None

    @property
    def indices(self) -> None:
        return None


class PrioritizedBatch(NamedTuple):
    """What a prioritised or n-step buffer samples: ReplayBatch's five fields (n-step rewards, the observation ``k``
    steps later, terminated within them), then ``discounts`` float32 ``(B,)``: ``gamma ** k`` to bootstrap with (None
    without ``gamma``); ``weights`` float32 ``(B,)``: importance weights (None when uniform); ``indices`` int64 numpy
    ``(B,)``: the slots, for :meth:`ReplayBuffer.update_priorities`."""

    obs: torch.Tensor
    actions: torch.Tensor
    next_obs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    discounts: torch.Tensor | None
    weights: torch.Tensor | None
    indices: np.ndarray


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
                   num_envs: int = 1, n_step: int = 1, prioritized: bool = False) -> int:
    """The bytes a :class:`ReplayBuffer` of ``capacity`` transitions takes (all of its arrays, filled)."""
    layout = _Layout(capacity, num_envs, obs_space, action_space, frame_stack, n_step, prioritized)
    return layout.nbytes()


def check_fits_in_memory(capacity: int, obs_space: gym.Space, action_space: gym.Space, frame_stack: bool | None = None,
                         num_envs: int = 1, processes: int = 1, buffer_size: int | None = None, save_buffer: bool = False,
                         n_step: int = 1, prioritized: bool = False) -> int:
    """Refuse, with a :class:`FleetError` naming the numbers and the fix, a buffer that would not fit in the memory
    available now (less :data:`MEMORY_HEADROOM`); else return the bytes it needs.

    ``processes``: how many such buffers this machine holds (the torchrun processes on it); ``buffer_size``: the
    ``--buffer-size`` flag these buffers share (default ``capacity * processes``), to say how far to lower it;
    ``save_buffer``: checkpoints hold the buffers (``--save-buffer``), which needs :data:`CHECKPOINT_BYTES` more each.
    """
    buffer_bytes = required_bytes(capacity, obs_space, action_space, frame_stack, num_envs, n_step, prioritized)
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

    ``n_step`` (default 1) and ``gamma`` (required with ``n_step > 1``): sample n-step transitions; ``alpha`` (default
    None: uniform): prioritised replay with that exponent, ``beta`` the importance-sampling exponent of the next
    :meth:`sample` (an attribute the caller anneals from ``beta_start``), ``priority_eps`` added to every ``|error|`` (see the module's
    docstring).
    """

    def __init__(self, capacity: int, num_envs: int, obs_space: gym.Space, action_space: gym.Space,
                 device: torch.device | str = "cpu", frame_stack: bool | None = None, check_memory: bool = True,
                 n_step: int = 1, gamma: float | None = None, alpha: float | None = None, beta: float = 0.4,
                 priority_eps: float = 1e-6):
        if capacity < num_envs:
            raise FleetError(f"A replay buffer of {capacity} transitions cannot hold one step of {num_envs} envs: "
                             f"raise --buffer-size to at least {num_envs} per process.")
        _check_n_step(n_step, gamma, capacity // num_envs)
        if check_memory:
            check_fits_in_memory(capacity, obs_space, action_space, frame_stack, num_envs, n_step=n_step, prioritized=alpha is not None)
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
        self.n_step, self.gamma, self.beta = n_step, gamma, beta
        self.beta_start = beta  # where an annealed beta starts (Rainbow anneals it to 1 over the run)
        self.priorities = Priorities(slots, alpha, priority_eps) if alpha is not None else None
        if n_step > 1:
            self.ends = np.empty(slots, bool)  # the episode's n-step returns stop after this slot (terminated, truncated or cut)
        # per env: the newest rows whose transitions wait for their n steps (1 per row stored with n_step=1, for a moment)
        self.pending = np.zeros(num_envs, np.int64)
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

    @property
    def complete(self) -> int:
        """How many stored transitions can be sampled (their n steps, or their episode's end, are stored)."""
        return self.filled * self.num_envs - int(self.pending.sum())

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
        # whether each env's obs is the stack it was left at (else the caller reset it, or a resumed run started)
        continues = self.has_last & _rows_equal(obs, self.last_obs) if self.frame_stack else None
        if self.n_step > 1 and self.filled:
            if continues is None:
                before = (self.row - 1) % self.rows * n + np.arange(n)
                continues = _rows_equal(np.asarray(obs, self.obs.dtype), self.next_obs[before])
            self._cut(np.flatnonzero(~continues & (self.pending > 0)))
        if self.frame_stack:
            self._add_frames(slots, obs, true_next, next_obs, ended, continues)
        else:
            self.obs[slots] = obs
            self.next_obs[slots] = true_next
        self.actions[slots] = np.asarray(actions).reshape(self.actions[slots].shape)
        self.rewards[slots] = rewards
        self.dones[slots] = terminated
        if self.n_step > 1:
            self.ends[slots] = np.logical_or(terminated, truncated)
        self.row = (self.row + 1) % self.rows
        self.filled = min(self.filled + 1, self.rows)
        self._complete(slots)

    def _complete(self, slots: slice) -> None:
        """The row just written: the transitions whose n steps are now stored become sampleable (at the highest
        priority); the row's own wait, unless complete already."""
        if self.n_step == 1:
            if self.priorities is not None:
                self.priorities.insert(np.arange(slots.start, slots.stop))
            return
        self.pending += 1
        ended = self.ends[slots]
        full = ~ended & (self.pending >= self.n_step)
        done = [np.flatnonzero(full) + (self.row - self.n_step) % self.rows * self.num_envs]  # the row n - 1 before
        self.pending[full] -= 1
        if ended.any():
            done.append(self._pending_slots(np.flatnonzero(ended)))
            self.pending[ended] = 0
        if self.priorities is not None:  # this row's slots (they held older transitions) wait; the completed go in last
            completed = np.concatenate(done)
            values = np.zeros(self.num_envs + len(completed), np.float32)
            values[self.num_envs:] = self.priorities.max_priority ** self.priorities.alpha
            self.priorities.tree.update(np.concatenate([np.arange(slots.start, slots.stop), completed]), values)

    def _cut(self, envs: np.ndarray) -> None:
        """These envs' steps do not continue their last ones: their n-step returns stop there (bootstrapped)."""
        if not len(envs):
            return
        self.ends[(self.row - 1) % self.rows * self.num_envs + envs] = True
        completed = self._pending_slots(envs)
        self.pending[envs] = 0
        if self.priorities is not None:
            self.priorities.insert(completed)

    def _pending_slots(self, envs: np.ndarray) -> np.ndarray:
        """The slots of ``envs`` whose transitions wait (the newest ``pending`` rows of each)."""
        ages = [np.arange(count) for count in self.pending[envs]]
        rows = (self.row - 1 - np.concatenate(ages)) % self.rows if ages else np.zeros(0, np.int64)
        return rows * self.num_envs + np.repeat(envs, self.pending[envs])

    def _add_frames(self, slots: slice, obs: np.ndarray, true_next: np.ndarray, next_obs: np.ndarray, ended,
                    stored: np.ndarray) -> None:
        # the stack acted on is the one stored as the last step's next obs (``stored``), unless the caller reset the envs
        # or skipped steps
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
    def sample(self, batch_size: int) -> ReplayBatch | PrioritizedBatch:
        """``batch_size`` transitions on ``device``, drawn with replacement: uniformly, or with ``alpha`` by priority,
        with their importance weights for ``self.beta``."""
        indices = self.sample_indices(batch_size)
        batch = self.get(indices)
        if self.priorities is None:
            return batch
        weights = self.priorities.weights(indices, self.complete, self.beta)
        return batch._replace(weights=torch.from_numpy(weights).to(self.device))

    def sample_indices(self, batch_size: int) -> np.ndarray:
        """Slot indices of sampleable transitions, uniform or by priority (numpy's global RNG)."""
        if not self.complete:
            raise FleetError("The replay buffer has no transition to sample yet: add transitions before sampling (sample "
                             "after --learning-starts, and with n-step returns after more than --n-step steps).")
        if self.priorities is not None:
            return self._sample_prioritized(batch_size)
        size = self.filled * self.num_envs
        indices = np.random.randint(0, size, batch_size)
        if self.frame_stack or self.n_step > 1:
            for _ in range(MAX_REDRAWS):
                lost = ~self._sampleable(indices)
                if not lost.any():
                    break
                indices[lost] = np.random.randint(0, size, int(lost.sum()))
            else:
                raise self._nothing_sampleable()
        return indices

    def _sample_prioritized(self, batch_size: int) -> np.ndarray:
        for _ in range(MAX_REDRAWS):
            indices = self.priorities.sample(batch_size)
            lost = ~self._sampleable(indices)
            if not lost.any():
                return indices
            # their frames were overwritten (for good, until the slot is written again): out of the tree, and a new
            # stratified draw of the whole batch
            self.priorities.remove(indices[lost])
        raise self._nothing_sampleable()

    def _nothing_sampleable(self) -> FleetError:
        return FleetError(f"The replay buffer found no stored transition whose frames are still stored after {MAX_REDRAWS} "
                          f"draws: the env starts a new frame stack at nearly every step. Store whole observations "
                          f"(frame_stack=False).")

    def get(self, indices: np.ndarray) -> ReplayBatch | PrioritizedBatch:
        """The transitions at slot ``indices`` (``row * num_envs + env``), on ``device``: n-step ones with ``n_step``."""
        indices = np.asarray(indices, dtype=np.int64)
        last, rewards, steps = self._n_step(indices) if self.n_step > 1 else (indices, self.rewards[indices], None)
        if self.frame_stack:
            envs = indices % self.num_envs
            obs = self._stacks(envs, self.obs_end[indices], self.obs_start[indices])
            next_obs = self._stacks(envs, self.next_end[last], self.next_start[last])
        else:
            obs, next_obs = self.obs[indices], self.next_obs[last]
        arrays = (obs, self.actions[indices], next_obs, rewards, self.dones[last])
        tensors = [torch.from_numpy(a).to(self.device) for a in arrays]
        if self.n_step == 1 and self.priorities is None:
            return ReplayBatch(*tensors)
        discounts = None
        if self.gamma is not None:  # gamma ** k as Python computes it (CleanRL's gamma ** n_step), in float32
            table = np.array([self.gamma ** k for k in range(self.n_step + 1)], np.float32)
            discounts = torch.from_numpy(table[np.ones(len(indices), np.int64) if steps is None else steps]).to(self.device)
        return PrioritizedBatch(*tensors, discounts=discounts, weights=None, indices=indices)

    def _n_step(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the n-step transitions that start at ``indices``: the slots of their last steps, their rewards
        ``sum gamma^j r_j`` (float64 in the order of CleanRL's loop, then float32) and their steps ``k``."""
        last = indices.copy()
        rewards = self.rewards[indices].astype(np.float64)
        steps = np.ones(len(indices), np.int64)
        going = ~self.ends[indices]
        for k in range(1, self.n_step):
            if not going.any():
                break
            following = np.where(going, (last + self.num_envs) % self.capacity, last)  # the env's next step
            rewards += np.where(going, self.gamma ** k * self.rewards[following].astype(np.float64), 0.0)
            last, steps = following, steps + going
            going &= ~self.ends[following]
        return last, rewards.astype(np.float32), steps

    def update_priorities(self, indices: np.ndarray | torch.Tensor, errors: np.ndarray | torch.Tensor) -> None:
        """New priorities ``|errors| + priority_eps`` for the slots ``indices`` of a sampled batch (``batch.indices``);
        CleanRL's Rainbow passes each sample's loss. A slot written again since it was sampled (its transition waiting
        for its n steps) is left alone."""
        if self.priorities is None:
            raise FleetError("update_priorities needs a prioritised replay buffer: create it with alpha (make_replay(..., "
                             "alpha=args.prioritized_replay_alpha)).")
        indices = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices, np.int64)
        if isinstance(errors, torch.Tensor):
            errors = errors.detach().cpu().numpy()
        if self.n_step > 1:
            keep = self._waited(indices)
            indices, errors = indices[keep], np.asarray(errors).reshape(-1)[keep]
        self.priorities.update(indices, errors)

    def sampleable(self) -> np.ndarray:
        """Every slot index :meth:`sample` may draw (written slots, less those whose frames were overwritten, whose n
        steps are not stored yet, or whose priority is 0)."""
        indices = np.arange(self.filled * self.num_envs)
        if not (self.frame_stack or self.n_step > 1 or self.priorities is not None):
            return indices
        return indices[self._sampleable(indices)]

    def _waited(self, indices: np.ndarray) -> np.ndarray:
        """Whether each slot's transition has its n steps (or its episode's end) stored."""
        age = (self.row - 1 - indices // self.num_envs) % self.rows
        return age >= self.pending[indices % self.num_envs]

    def _sampleable(self, indices: np.ndarray) -> np.ndarray:
        ok = np.ones(len(indices), bool)
        if self.priorities is not None:
            ok &= self.priorities.tree[indices] > 0  # (a mass on a sum's rounding edge can reach a leaf of 0)
        if self.n_step > 1:
            ok &= self._waited(indices)
        if self.frame_stack:
            last = self._n_step(indices)[0] if self.n_step > 1 else indices
            first = np.minimum(np.maximum(self.obs_end[indices] + 1 - self.stack, self.obs_start[indices]),
                               np.maximum(self.next_end[last] + 1 - self.stack, self.next_start[last]))
            ok &= first >= self.written[indices % self.num_envs] - self.frames_per_env
        return ok

    def _stacks(self, envs: np.ndarray, end: np.ndarray, start: np.ndarray) -> np.ndarray:
        # positions before a segment's start repeat its first frame
        positions = np.maximum(end[:, None] + self._offsets, start[:, None]) % self.frames_per_env
        return self.frames[envs[:, None], positions]

    # ------------------------------------------------------------------------------------------------ checkpoints
    def _array_names(self) -> tuple[list[str], list[str]]:
        """(arrays with a row per slot, whole arrays): what a checkpoint holds besides the cursor."""
        n_step = (["ends"], ["pending"]) if self.n_step > 1 else ([], [])
        if not self.frame_stack:
            return ["actions", "rewards", "dones", "obs", "next_obs", *n_step[0]], n_step[1]
        return (["actions", "rewards", "dones", "obs_end", "obs_start", "next_end", "next_start", *n_step[0]],
                ["written", "last_obs", "has_last", "last_end", "last_start", *n_step[1]])

    def state_dict(self) -> dict[str, Any]:
        """The contents as torch tensors (``torch.load(weights_only=True)`` takes them) and the cursor: only the
        written part, so a checkpoint of a part-filled buffer is that much smaller."""
        state: dict[str, Any] = {"capacity": self.capacity, "num_envs": self.num_envs, "frame_stack": self.frame_stack,
                                 "row": self.row, "filled": self.filled, **self._options()}
        per_slot, whole = self._array_names()
        used = self.filled * self.num_envs
        if self.priorities is not None:  # the written slots' priorities (the tree is rebuilt from them) and the highest
            state.update(self.priorities.state_dict(used))
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
        state = {"n_step": 1, "prioritized": False, **state}  # checkpoints written before these options
        mine = {"capacity": self.capacity, "num_envs": self.num_envs, "frame_stack": self.frame_stack, **self._options(),
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
                             f"--buffer-size, --num-envs, env, --n-step and prioritised replay, or without the saved "
                             f"buffer.")
        self.row, self.filled = int(state["row"]), int(state["filled"])
        for name in per_slot:
            getattr(self, name)[: len(state[name])] = state[name].numpy()
        for name in whole:
            np.copyto(getattr(self, name), state[name].numpy())
        if self.frame_stack:
            for i, ring in enumerate(rings):
                self.frames[i, : len(ring)] = ring.numpy()
        if self.priorities is not None:
            self.priorities.load_state_dict(state)

    def _options(self) -> dict[str, Any]:
        return {"n_step": self.n_step, "prioritized": self.priorities is not None}


class _Layout:
    """The shapes and dtypes of a buffer's arrays (shared by the buffer and the memory estimate)."""

    def __init__(self, capacity: int, num_envs: int, obs_space: gym.Space, action_space: gym.Space, frame_stack: bool | None,
                 n_step: int = 1, prioritized: bool = False):
        self.n_step, self.prioritized = n_step, prioritized
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
        # the sum tree: 2 * slots - 1 float32 nodes; n-step: where each slot's returns stop
        options = (4 * (2 * slots - 1) if self.prioritized else 0) + (slots if self.n_step > 1 else 0)
        if not self.frames:
            return slots * (per_slot + 2 * obs_bytes) + options
        frame_bytes = obs_bytes // self.obs_shape[0]
        return slots * (per_slot + 4 * 8) + self.num_envs * (self.frames_per_env * frame_bytes + obs_bytes) + options


def _check_n_step(n_step: int, gamma: float | None, rows: int) -> None:
    if not (isinstance(n_step, (int, np.integer)) and n_step >= 1):
        raise FleetError(f"--n-step is the number of steps of each return and must be a whole number of at least 1 (1: "
                         f"one-step returns; CleanRL's Rainbow uses 3), and it is {n_step!r}.")
    if n_step > 1 and (gamma is None or not 0 <= gamma <= 1):
        raise FleetError(f"n-step returns discount each step by gamma, which must lie in [0, 1]; it is {gamma!r}: pass "
                         f"gamma=args.gamma with n_step={n_step}.")
    if n_step > rows:
        raise FleetError(f"A replay buffer of {rows} steps per env cannot hold the {n_step} steps of an n-step return: raise "
                         f"--buffer-size or lower --n-step.")


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
