"""What every algorithm's description shares: the description itself, and the lockstep's pieces (fleetrl's loop
recorded at its engine calls, a short fleetrl run, the comparison of two traces)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CLEANRL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cleanrl")


def cleanrl_on_path() -> None:
    """CleanRL's files and loops importable (benchmarks/cleanrl/), again if a test's monkeypatch restored sys.path."""
    if CLEANRL not in sys.path:
        sys.path.insert(0, CLEANRL)


cleanrl_on_path()


@dataclass(frozen=True)
class Side:
    """A side beyond CleanRL's script and ``fleetrl train``: fleetrl with more flags (or another algorithm), or a loop
    run in a process of its own by ``Algo.in_process``."""

    flags: tuple[str, ...] = ()
    algo: str | None = None  # fleetrl train ALGO in place of the description's
    lag_cpus: bool = False  # pinned to --lag-cpus (its learner process takes a core)
    in_process: bool = False


@dataclass(frozen=True)
class Algo:
    """One algorithm against CleanRL: its CleanRL script, the flags both sides get, and its lockstep."""

    name: str  # fleetrl train NAME
    script: str | Callable[[str], str]  # CleanRL's script under benchmarks/cleanrl/ (or one per env id)
    env_id: str
    steps: dict[str, int]  # the default --steps of each mode
    learning_starts: dict[str, int] = field(default_factory=dict)  # and its --learning-starts (0 if not named)
    flags: Callable[[str, argparse.Namespace], list[str]] = lambda env_id, opts: []  # both sides, after the budget
    backend: str = "sync"  # fleetrl's --env-backend
    their_env_id: Callable[[str], str] = lambda env_id: env_id  # CleanRL's script's name for the env
    lockstep: Callable[[argparse.Namespace], dict[str, str]] | None = None
    lockstep_seed: int = 1
    options: tuple[tuple[tuple[str, ...], dict], ...] = ()  # more argparse flags: (names, keyword arguments)
    sides: dict[str, Side] = field(default_factory=dict)
    speed_sides: str = "cleanrl,fleetrl"
    learn_sides: str = "cleanrl,fleetrl"
    fleetrl_command: tuple[str, ...] = ()  # in place of `python -m fleetrl train NAME` (a user's file)
    in_process: Callable[[str, str, int, argparse.Namespace], dict] | None = None  # a Side(in_process=True)'s run
    score_bounds: dict[str, str] = field(default_factory=dict)  # for fleetrl compare
    bar: float | None = None  # the learning table counts the runs scoring this or more
    modes: tuple[str, ...] = ("lockstep", "speed", "learn")


# ============================================================================ fleetrl's side of a lockstep
@contextmanager
def patched(owner: Any, **replacements: Any):
    """While open, ``owner``'s attributes replaced (a recording wrapper of an engine call), restored however it ends."""
    real = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in real.items():
            setattr(owner, name, value)


def fleetrl_run(module: Any, **kwargs: Any) -> tuple[Any, dict]:
    """``module.train`` on one thread, CPU, the sync backend, in a temporary folder: what it returned, its last checkpoint."""
    from fleetrl import checkpoint

    with tempfile.TemporaryDirectory() as runs:
        run_dir = os.path.join(runs, "run")
        result = module.train(module.Args(**{"torch_threads": 1, "cuda": False, "env_backend": "sync", "progress": False,
                                             "run_dir": run_dir, **kwargs}))
        return result, checkpoint.load_checkpoint(run_dir)


@contextmanager
def recording(module: Any, trace: Any, calls_per_target: int = 1):
    """While open, the engine calls of ``module``'s off-policy loop (fleetrl/algos/dqn.py, td3.py, sac_discrete.py) record
    into ``trace``: each step's action (``step_envs``), each optimiser step's global step and loss
    (``optimizer_step``), each target update's global step (``soft_update``, ``calls_per_target`` calls an update: one
    per network). A global step is CleanRL's loop variable: the steps taken before the last one."""
    step_envs, optimizer_step, soft_update = module.step_envs, module.optimizer_step, module.soft_update
    targets = [0]

    def record_step(envs, rb, obs, actions, *rest):
        action = np.asarray(actions[0])
        trace.actions.append(action.item() if action.ndim == 0 else action.copy())
        return step_envs(envs, rb, obs, actions, *rest)

    def record_update(optimizer, sync, loss):
        trace.update_steps.append(len(trace.actions) - 1)
        trace.losses.append(loss.item())
        return optimizer_step(optimizer, sync, loss)

    def record_target(target, source, tau):
        if targets[0] % calls_per_target == 0:
            trace.target_steps.append(len(trace.actions) - 1)
        targets[0] += 1
        return soft_update(target, source, tau)

    with patched(module, step_envs=record_step, optimizer_step=record_update, soft_update=record_target):
        yield trace


def renamed(state: dict[str, dict], names: dict[str, str]) -> dict[str, Any]:
    """A fleetrl checkpoint's networks as one flat dict of CleanRL's parameter names (``names``: prefix -> prefix)."""
    flat = {}
    for part, tensors in state.items():
        for key, value in tensors.items():
            name = f"{part}.{key}"
            for ours, theirs in names.items():
                name = name.replace(ours, theirs) if name.startswith(ours) else name
            flat[name] = value
    return flat


# ============================================================================ the comparison
def compare(ours: Any, theirs: Any, records: tuple[str, ...] = ("actions", "update_steps", "losses", "target_steps"),
            by_order: tuple[str, str] | None = None) -> dict[str, str]:
    """Each record: "identical (N)", or where the two first part; then the final parameters, matched by CleanRL's names
    (or by order, leaving out ``by_order``'s two buffers: fleetrl's name, CleanRL's)."""
    verdicts = {}
    for name in records:
        mine, other = getattr(ours, name), getattr(theirs, name)
        first = next((i for i, (x, y) in enumerate(zip(mine, other)) if not np.array_equal(x, y)), None)
        if first is None and len(mine) == len(other):
            verdicts[name] = f"identical ({len(mine):,})"
        else:
            verdicts[name] = f"fleetrl {len(mine):,}, cleanrl {len(other):,}, first differ at index {first}"
    if by_order:
        mine = [v for k, v in ours.final_params.items() if k != by_order[0]]
        other = [v for k, v in theirs.final_params.items() if k != by_order[1]]
    else:
        keys = sorted(theirs.final_params)
        mine = [ours.final_params.get(k) for k in keys] if set(ours.final_params) == set(keys) else []
        other = [theirs.final_params[k] for k in keys] if mine else [None]
    # raveled: CleanRL's buffers may come from the vector env's (1, A) bounds where fleetrl's come from one env's (A,)
    same = len(mine) == len(other) and all(np.array_equal(x.numpy().ravel(), y.numpy().ravel()) for x, y in zip(mine, other))
    verdicts["final parameters"] = "identical" if same else "differ"
    return verdicts


def gap(a: list, b: list, relative: bool) -> str:
    """Two lists of numbers or arrays: "identical (N)", or their largest difference, relative or absolute."""
    import torch

    if len(a) != len(b):
        return f"fleetrl {len(a)}, cleanrl {len(b)}"
    a_t = torch.cat([torch.as_tensor(x).flatten().double() for x in a]) if a else torch.zeros(0)
    b_t = torch.cat([torch.as_tensor(x).flatten().double() for x in b]) if b else torch.zeros(0)
    if a_t.shape != b_t.shape:
        return f"shapes differ: fleetrl {tuple(a_t.shape)}, cleanrl {tuple(b_t.shape)}"
    if torch.equal(a_t, b_t):
        return f"identical ({len(a)})"
    diff = (a_t - b_t).abs()
    if relative:
        diff = diff / b_t.abs().clamp_min(1e-12)
    return f"max {'relative' if relative else 'absolute'} difference {diff.max().item():.2e} ({len(a)})"


def both_roundings(compare_with: Callable[[bool], dict[str, str]]) -> dict[str, str]:
    """A lockstep of an actor-critic's update code, twice: CleanRL's code given fleetrl's rounding of the advantages'
    normalisation and the log-probabilities (``compare_with(True)``), then rounding its own way, named ", CleanRL's
    rounding"."""
    verdicts = compare_with(True)
    return {**verdicts, **{f"{name}, CleanRL's rounding": verdict for name, verdict in compare_with(False).items()}}
