"""The shared-memory block of the async backend: every per-step array, laid out once, mapped as numpy views by the
trainer and by every worker process from the same (name -> offset, shape, dtype) table."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.errors import FleetError

ALIGN = 64  # byte alignment of each shared array (a cache line)
# Room for one env's infos of one step, pickled (make_vec hands gymnasium's users every env's infos; training keeps
# them off, and pages never written cost no memory). ALE's infos of a step that ends an episode take about 400 bytes.
INFO_SLOT_BYTES = 4096

Layout = dict[str, tuple[int, tuple[int, ...], str]]


def fixed_shape_and_dtype(space: gym.Space, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """The per-env shape and dtype a space's batched array has (Box, Discrete, MultiDiscrete, MultiBinary)."""
    batched = gym.vector.utils.batch_space(space, 1)
    if batched.shape is None or batched.dtype is None:
        raise FleetError(
            f"SharedMemoryVectorEnv needs fixed-shape array {what}s (Box, Discrete, MultiDiscrete or "
            f"MultiBinary); got {space}. Flatten the space (gymnasium.wrappers.FlattenObservation) or use "
            f"the 'sync' backend."
        )
    return tuple(batched.shape[1:]), np.dtype(batched.dtype)


def make_layout(num_envs: int, num_workers: int, obs_space: gym.Space, act_space: gym.Space, rows: int | None = None) -> tuple[Layout, int]:
    """The arrays of ``num_envs`` envs stepped by ``num_workers`` processes, and the block's size in bytes. ``rows``: the
    agents of a multi-agent game (fleetrl/envs/multiagent.py), each with its own reward and flags."""
    obs_shape, obs_dtype = fixed_shape_and_dtype(obs_space, "observation")
    act_shape, act_dtype = fixed_shape_and_dtype(act_space, "action")
    n = num_envs
    flags = (n,) if rows is None else (n, rows)
    fields = [
        ("obs", (n, *obs_shape), obs_dtype),
        ("final_obs", (n, *obs_shape), obs_dtype),
        ("actions", (n, *act_shape), act_dtype),
        ("reward", flags, np.dtype(np.float64)),
        ("terminated", flags, np.dtype(np.bool_)),
        ("truncated", flags, np.dtype(np.bool_)),
        ("final_mask", (n,), np.dtype(np.bool_)),
        ("episode_r", (n,), np.dtype(np.float64)),
        ("episode_l", (n,), np.dtype(np.int64)),
        ("episode_mask", (n,), np.dtype(np.bool_)),
        ("seeds", (n,), np.dtype(np.int64)),
        ("seeded", (n,), np.dtype(np.bool_)),
        # the envs that finished the current command (the trainer clears a worker's envs when it sends one): after a
        # failure it says whose results stand, whichever of the worker's stepping threads got how far
        ("stepped", (n,), np.dtype(np.bool_)),
        ("status", (num_workers,), np.dtype(np.int8)),
        # the envs' own infos, for make_vec only (fleetrl/envs/gym_vector.py): the trainer sets keep_infos, then each
        # worker writes an env's (step info, reset info) pickled into its slot, or length 0 when both are empty
        ("keep_infos", (1,), np.dtype(np.bool_)),
        ("info_len", (n,), np.dtype(np.int32)),
        ("info_bytes", (n, INFO_SLOT_BYTES), np.dtype(np.uint8)),
    ]
    layout: Layout = {}
    offset = 0
    for name, shape, dtype in fields:
        layout[name] = (offset, shape, dtype.str)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // ALIGN) * ALIGN
    return layout, max(offset, ALIGN)


def map_views(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    """Numpy views of every array of ``layout`` in ``buffer`` (a ``RawArray``), without copying."""
    base = np.frombuffer(buffer, dtype=np.uint8)
    views = {}
    for name, (offset, shape, dtype) in layout.items():
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        views[name] = base[offset : offset + nbytes].view(dt).reshape(shape)
    return views
