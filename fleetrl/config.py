"""Argument plumbing shared by the algorithms: defaults by env family, resume overrides, run folders."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Iterable, TypeVar

from fleetrl.errors import FleetError

A = TypeVar("A")


def apply_family_defaults(args: A, table: dict[str, dict[str, Any]], family: str) -> A:
    """Fill every field the user left unset (None) with the default for the env family."""
    unset = {k: v for k, v in table[family].items() if getattr(args, k) is None}
    return dataclasses.replace(args, **unset)


def explicit_fields(argv: Iterable[str], args_type: type) -> set[str]:
    """The dataclass fields given on the command line (``--learning-rate 1e-3``, ``--no-anneal-lr``, ...)."""
    names = {f.name for f in dataclasses.fields(args_type)}
    given = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        flag = token[2:].split("=", 1)[0].replace("-", "_")
        if flag.startswith("no_") and flag[3:] in names:
            flag = flag[3:]
        if flag in names:
            given.add(flag)
    return given


def fields_differing_from_default(args: Any) -> set[str]:
    """For calls from Python: the fields whose value is not the dataclass default."""
    return {f.name for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING and getattr(args, f.name) != f.default}


def merge_resumed_args(args: A, saved: dict[str, Any], explicit: set[str]) -> A:
    """A resumed run keeps its saved arguments; flags given again now (e.g. a larger
    ``--total-timesteps``) win over them."""
    known = {f.name for f in dataclasses.fields(args)}
    restored = {k: v for k, v in saved.items() if k in known and k not in explicit}
    return dataclasses.replace(args, **restored)


def default_run_dir(env_id: str, exp_name: str, seed: int) -> str:
    """``runs/{env_id}__{exp_name}__{seed}__{timestamp}`` (CleanRL's name); '/' in ALE ids becomes '-'."""
    safe_env = env_id.replace("/", "-").replace(":", "-")
    return os.path.join("runs", f"{safe_env}__{exp_name}__{seed}__{int(time.time())}")


def check_positive(**values: float | int) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise FleetError(f"--{name.replace('_', '-')} must be positive, got {value}.")
