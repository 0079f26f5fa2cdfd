"""Prioritised replay's sum tree (Schaul et al. 2016, as CleanRL's rainbow_atari.py): the priorities of a replay buffer's
slots in a binary heap of float32 partial sums, updated and searched a whole batch at a time with numpy.

Two objects, one job each:

* :class:`SumTree`: ``capacity`` leaves (one per slot) and their partial sums. ``update(slots, values)`` sets leaves and
  recomputes their ancestors one tree level at a time for the whole batch; ``find(masses)`` walks every mass of a batch
  down the tree at once to the leaf whose prefix sum holds it. Both take about ``log2(capacity)`` numpy steps (21 for
  1M slots), never a Python step per sample (benchmarks/costs.py per: a 32-sample batch from 1M slots in
  well under a millisecond).
* :class:`Priorities`: proportional prioritisation over the tree: new transitions at the highest priority seen,
  stratified sampling, importance weights, ``update(slots, errors)``, and a checkpoint of it.

The tree is the heap of openai/baselines and CleanRL (``2 * capacity - 1`` float32 nodes, node ``k``'s children at
``2k + 1`` and ``2k + 2``, slot ``s`` at node ``capacity - 1 + s``), and every number is computed as CleanRL computes it
(its dtypes under NumPy 2, its order of operations, its float32 search). So the same inserts, updates and random draws give CleanRL's
sampled slots, priorities and weights bit for bit, for any capacity (tests/test_prioritized_replay.py compares them with
CleanRL's own classes, benchmarks/cleanrl/rainbow_atari.py). The memory is the tree's: two float32 numbers per slot (8 MB for 1M).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fleetrl.errors import FleetError


class SumTree:
    """Partial sums of ``capacity`` non-negative float32 leaves in a heap of ``2 * capacity - 1`` nodes."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise FleetError(f"A sum tree needs at least one leaf, and was asked for {capacity}.")
        self.capacity = capacity
        self.nodes = np.zeros(2 * capacity - 1, np.float32)
        self.first_leaf = capacity - 1
        # node k's children are the pair k of nodes[1:]: one gather reads both
        self._children = self.nodes[1:].reshape(-1, 2)
        self.depth = (2 * capacity - 1).bit_length() - 1  # of the deepest leaf; leaves lie at depth-1 or depth

    @property
    def total(self) -> np.float32:
        """The sum of all leaves (the root)."""
        return self.nodes[0]

    @property
    def leaves(self) -> np.ndarray:
        """The leaves, slot by slot (a view)."""
        return self.nodes[self.first_leaf:]

    def __getitem__(self, slots: np.ndarray) -> np.ndarray:
        return self.nodes[np.asarray(slots, np.int64) + self.first_leaf]

    def update(self, slots: np.ndarray, values: np.ndarray | float) -> None:
        """Set the leaves of ``slots`` to ``values`` (where a slot repeats, its last value wins, as when updating one at
        a time) and recompute their ancestors, level by level for the whole batch."""
        slots = np.asarray(slots, np.int64).reshape(-1)
        if len(slots) == 1:  # one env's step: a walk of Python ints is 10x faster than numpy's per-call overhead
            node, tree = int(slots[0]) + self.first_leaf, self.nodes
            tree[node] = np.asarray(values, np.float32).reshape(-1)[0]
            while node:
                node = (node - 1) >> 1
                tree[node] = tree[2 * node + 1] + tree[2 * node + 2]
            return
        values = np.broadcast_to(np.asarray(values, np.float32), slots.shape)
        last = len(slots) - 1 - np.unique(slots[::-1], return_index=True)[1]  # the last occurrence of each slot
        nodes = slots[last] + self.first_leaf
        self.nodes[nodes] = values[last]
        # every node is left + right of its children, as a tree updated one leaf at a time ends up; a node reached
        # again from a deeper leaf is recomputed again, after its children
        for _ in range(self.depth):
            nodes -= 1
            nodes >>= 1
            np.maximum(nodes, 0, out=nodes)  # a shallower leaf's walk waits at the root
            pair = self._children[nodes]
            self.nodes[nodes] = pair[:, 0] + pair[:, 1]

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass in ``[0, total]`` the slot whose leaf holds it: the first slot (in heap order) whose prefix sum
        reaches it. The walk is float32, as CleanRL's ``retrieve`` runs under NumPy 2: its mass, a Python float, meets
        the tree's float32 sums, which NEP 50 makes float32 arithmetic (the mass rounded to float32 for each comparison
        and subtraction; NumPy 1's value-based casting kept float64, which parts from it on a sum's rounding edge)."""
        masses = np.array(masses, np.float32).reshape(-1)
        nodes = np.zeros(len(masses), np.int64)
        # the levels whose nodes all have children: five numpy calls a level, in place
        for _ in range(self.capacity.bit_length() - 1):
            nodes *= 2
            nodes += 1
            left_mass = self.nodes[nodes]
            right = masses > left_mass
            np.subtract(masses, left_mass, out=masses, where=right)
            nodes += right
        if self.depth > self.capacity.bit_length() - 1:  # the last level, where only some nodes have children
            inner = nodes < self.first_leaf
            left = np.where(inner, 2 * nodes + 1, 0)
            right = inner & (masses > self.nodes[left])
            nodes = np.where(inner, left + right, nodes)
        return nodes - self.first_leaf

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves (after setting them directly), a level at a time."""
        for level in range(self.depth - 1, -1, -1):
            first, last = (1 << level) - 1, min((2 << level) - 2, self.first_leaf - 1)
            if first > last:
                continue
            pairs = self._children[first: last + 1]
            self.nodes[first: last + 1] = pairs[:, 0] + pairs[:, 1]


class Priorities:
    """Proportional prioritised sampling over ``capacity`` slots (Schaul et al.; CleanRL's PrioritizedReplayBuffer).

    * a slot's sampling probability is ``p ** alpha / sum(p ** alpha)``, its priority ``p`` being ``|error| + eps``
      from :meth:`update` (the tree keeps ``p ** alpha``); ``alpha=0`` samples uniformly;
    * :meth:`insert` gives new transitions the highest priority seen so far (1 at first), so each is sampled soon;
    * :meth:`sample` draws stratified masses: one uniform draw in each of ``batch_size`` equal parts of the total, from
      numpy's global RNG (the run seeds and checkpoints it);
    * :meth:`weights`: the importance weights ``(size * P(slot)) ** -beta``, divided by the batch's largest, as CleanRL
      (Schaul et al. divide by the largest weight of the whole buffer instead; the batch's keeps the tree to one array).
    """

    def __init__(self, capacity: int, alpha: float, eps: float = 1e-6):
        if not alpha >= 0:
            raise FleetError(f"The prioritised replay exponent alpha (--prioritized-replay-alpha) must be at least 0 (0 samples "
                             f"uniformly, CleanRL's Rainbow uses 0.5), and it is {alpha}.")
        if not eps > 0:
            raise FleetError(f"The prioritised replay epsilon (--prioritized-replay-eps) must be above 0, so that every "
                             f"transition keeps a chance of being sampled, and it is {eps}.")
        self.tree = SumTree(capacity)
        self.alpha, self.eps = float(alpha), float(eps)
        self.max_priority = np.float32(1.0)  # the highest |error| + eps seen: new transitions' priority

    def insert(self, slots: np.ndarray) -> None:
        """New transitions at ``slots``: the highest priority so far."""
        self.tree.update(slots, self.max_priority ** self.alpha)

    def remove(self, slots: np.ndarray) -> None:
        """Slots that must not be sampled (not written yet, or their transition is incomplete or lost): priority 0."""
        self.tree.update(slots, 0.0)

    def sample(self, batch_size: int) -> np.ndarray:
        """``batch_size`` slots, one drawn in each equal part of the total priority (stratified, with numpy's global RNG)."""
        total = self.tree.total
        if not total > 0:
            raise FleetError("The prioritised replay buffer has no complete transition to sample yet: add more steps before "
                             "sampling (sample after --learning-starts, which must exceed --n-step).")
        segment = total / batch_size  # float32, as CleanRL's p_total / batch_size
        bounds = segment * np.arange(batch_size + 1, dtype=np.float32)
        return self.tree.find(np.random.uniform(bounds[:-1], bounds[1:]))

    def weights(self, slots: np.ndarray, size: int, beta: float) -> np.ndarray:
        """Importance weights (float32) of sampled ``slots`` when ``size`` transitions can be sampled: CleanRL's
        ``(size * p / total) ** -beta / max``."""
        probs = self.tree[slots]
        weights = (int(size) * probs / self.tree.total) ** -beta
        return weights / weights.max()

    def update(self, slots: np.ndarray, errors: np.ndarray | torch.Tensor) -> None:
        """New priorities ``|errors| + eps`` for ``slots`` (a repeated slot takes its last), as CleanRL's update_priorities."""
        if isinstance(errors, torch.Tensor):
            errors = errors.detach().cpu().numpy()
        if isinstance(slots, torch.Tensor):
            slots = slots.cpu().numpy()
        priorities = np.abs(np.asarray(errors)).reshape(-1) + self.eps
        if not len(priorities):
            return
        self.max_priority = max(self.max_priority, priorities.max())
        # one scalar power each, as CleanRL's loop: numpy's array power takes other paths (x ** 0.5 is a sqrt, and SIMD
        # kernels on some CPUs), which round differently in the last bit
        values = np.fromiter((p ** self.alpha for p in priorities), np.float32, len(priorities))
        self.tree.update(slots, values)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self, used: int) -> dict[str, Any]:
        """The leaves of the first ``used`` slots (the rest are 0) and the highest priority, as tensors."""
        return {"priorities": torch.from_numpy(self.tree.leaves[:used]),
                "max_priority": torch.from_numpy(np.array(self.max_priority))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        leaves = state["priorities"].numpy()
        self.tree.leaves[:] = 0
        self.tree.leaves[: len(leaves)] = leaves
        self.tree.rebuild()  # each sum is left + right, as it was: the same tree, bit for bit
        self.max_priority = state["max_priority"].numpy()[()]
