"""Prioritised replay's costs (issue 35): fleetrl's numpy sum tree against CleanRL's SegmentTree (rainbow_atari.py,
verbatim in benchmarks/cleanrl_per.py), and the memory of a 1M-transition Atari prioritised buffer against DQN's.

    python benchmarks/prioritized_replay.py                       # 1M slots, medians of 2,000 (CleanRL: 300) calls
    python benchmarks/prioritized_replay.py --capacity 100000 --repeats 500 --markdown per.md

Timings (one process, one thread, medians of ``--repeats`` calls, each timed alone with perf_counter):
* *sample 32*: the tree part of a prioritised batch from ``--capacity`` slots with random priorities: the stratified
  draws, the search and the importance weights (fleetrl: ``Priorities.sample`` + ``weights``; CleanRL: the loop of
  ``retrieve`` calls, the priorities and the weights of its ``sample``);
* *update 32*: new priorities for a sampled batch (fleetrl: ``ReplayBuffer.update_priorities``'s tree update;
  CleanRL: ``update_priorities``, which updates its sum tree and its min tree);
* *insert 1*: a new transition at the highest priority (one env's step);
* *whole batch*: ``ReplayBuffer.sample(32)`` of a full 1M prioritised buffer of CartPole-sized transitions against
  CleanRL's ``PrioritizedReplayBuffer.sample(32)``, tensors included.
Both trees hold the same priorities (fleetrl's heap is CleanRL's), so both draw the same slots.

Memory: ``required_bytes`` of a 1M Atari (4x84x84 uint8) buffer, uniform (DQN) and prioritised with 3-step returns
(Rainbow), which equals the arrays' ``nbytes`` of such a buffer (checked here on the allocated, untouched arrays); the
resident memory (RSS) that writing every node of the tree and every slot of the n-step flags adds; and CleanRL's
PrioritizedReplayBuffer from its array shapes (obs and next obs apart, two float32 trees; not allocated).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

BATCH = 32
TARGET_SECONDS = 1e-3  # issue 35: a 32-transition batch from 1M transitions in at most 1 ms


def median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def tree_timings(capacity: int, repeats: int, cleanrl_repeats: int) -> list[tuple[str, float, float]]:
    import cleanrl_per
    import gymnasium as gym
    import torch

    from fleetrl.sampling.replay import ReplayBuffer

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    obs_space, actions = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    ours = ReplayBuffer(capacity, 1, obs_space, actions, alpha=0.5, gamma=0.99, check_memory=False)
    ours.obs[:] = rng.standard_normal((capacity, 4)).astype(np.float32)
    ours.next_obs[:] = ours.obs
    ours.actions[:], ours.rewards[:], ours.dones[:] = 0, 1.0, 0.0
    ours.filled, ours.row = ours.rows, 0
    ours.priorities.update(np.arange(capacity), rng.exponential(1.0, capacity).astype(np.float32))
    theirs = cleanrl_per.PrioritizedReplayBuffer(capacity, (4,), "cpu", 1, 0.99, alpha=0.5, beta=0.4)
    theirs.sum_tree.tree[:] = ours.priorities.tree.nodes  # the same heap, the same sums
    theirs.min_tree.tree[capacity - 1:] = ours.priorities.tree.leaves
    theirs.size, theirs.max_priority = capacity, ours.priorities.max_priority
    priorities = ours.priorities

    def ours_sample():
        slots = priorities.sample(BATCH)
        priorities.weights(slots, capacity, 0.4)

    def theirs_sample():  # CleanRL's sample, less its gathers of the arrays and tensors
        p_total = theirs.sum_tree.total()
        segment = p_total / BATCH
        indices = [theirs.sum_tree.retrieve(np.random.uniform(segment * i, segment * (i + 1))) for i in range(BATCH)]
        probs = np.array([theirs.sum_tree.tree[idx + theirs.capacity - 1] for idx in indices])
        weights = (theirs.size * probs / p_total) ** -theirs.beta
        return weights / weights.max()

    slots = priorities.sample(BATCH)
    errors = rng.standard_normal(BATCH).astype(np.float32)
    new = iter(range(10**9))
    rows = [
        ("sample 32 (draws, search, IS weights)", median_us(ours_sample, repeats), median_us(theirs_sample, cleanrl_repeats)),
        ("update 32 priorities", median_us(lambda: ours.update_priorities(slots, errors), repeats),
         median_us(lambda: theirs.update_priorities(slots, errors), cleanrl_repeats)),
        ("insert 1 transition (max priority)", median_us(lambda: priorities.insert([next(new) % capacity]), repeats),
         median_us(lambda: (theirs.sum_tree.update(next(new) % capacity, 1.0), theirs.min_tree.update(next(new) % capacity, 1.0)),
                   cleanrl_repeats)),
        ("whole batch: sample(32), tensors included", median_us(lambda: ours.sample(BATCH), repeats),
         median_us(lambda: theirs.sample(BATCH), cleanrl_repeats)),
    ]
    return rows


def memory_rows(capacity: int) -> list[tuple[str, str]]:
    import gymnasium as gym

    from fleetrl.sampling.replay import ReplayBuffer, required_bytes

    atari, actions = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4)
    uniform = required_bytes(capacity, atari, actions)
    rainbow = required_bytes(capacity, atari, actions, n_step=3, prioritized=True)
    buffer = ReplayBuffer(capacity, 1, atari, actions, n_step=3, gamma=0.99, alpha=0.5, check_memory=False)
    per_env = {"written", "has_last", "last_end", "last_start", "pending", "_offsets"}  # a few bytes an env: not estimated
    arrays = [a for name, a in vars(buffer).items() if isinstance(a, np.ndarray) and name not in per_env]
    allocated = sum(a.nbytes for a in arrays) + buffer.priorities.tree.nodes.nbytes
    before = psutil.Process().memory_info().rss
    buffer.priorities.tree.nodes[:] = 1.0  # what a full buffer holds resident beyond DQN's arrays
    buffer.ends[:] = False
    extra_rss = psutil.Process().memory_info().rss - before
    cleanrl = capacity * (2 * 4 * 84 * 84 + 8 + 4 + 1) + 2 * 4 * (2 * capacity - 1)
    mb = lambda n: f"{n / 1e6:,.1f} MB"  # noqa: E731
    gb = lambda n: f"{n / 1e9:,.3f} GB"  # noqa: E731
    return [
        (f"fleetrl DQN buffer (uniform), {capacity:,} Atari transitions", gb(uniform)),
        ("fleetrl Rainbow buffer (prioritised, 3-step)", f"{gb(rainbow)} (+{mb(rainbow - uniform)}, "
                                                         f"+{100 * (rainbow - uniform) / uniform:.2f}%)"),
        ("  its allocated arrays' nbytes (less the per-env state)", f"{gb(allocated)} ({'equal' if allocated == rainbow else 'DIFFERENT'})"),
        ("  RSS added by writing the whole tree and the n-step flags", mb(extra_rss)),
        ("CleanRL rainbow_atari.py PrioritizedReplayBuffer (from its shapes)", gb(cleanrl)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--cleanrl-repeats", type=int, default=300)
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    memory = memory_rows(args.capacity)  # first: memory the timings freed may stay resident and hide what is added
    timings = tree_timings(args.capacity, args.repeats, args.cleanrl_repeats)
    lines = [f"Prioritised replay, {args.capacity:,} slots, batch {BATCH}: medians of {args.repeats:,} calls "
             f"(CleanRL: {args.cleanrl_repeats:,}), one thread", "",
             "| operation | fleetrl | CleanRL | CleanRL / fleetrl |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {ours:,.0f} us | {theirs:,.0f} us | {theirs / ours:.1f}x |" for name, ours, theirs in timings]
    sample_us = timings[0][1]
    lines += ["", f"Target (issue 35): a 32-transition batch from 1M in at most 1 ms: sample 32 took {sample_us:,.0f} us "
                  f"({'met' if sample_us <= TARGET_SECONDS * 1e6 else 'NOT met'}).", "",
              "| memory | bytes |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in memory]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
