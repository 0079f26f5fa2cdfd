"""`fleetrl new NAME --from ALGO`: NAME.py, the user's own copy of a built-in algorithm, to change and compare.

The copy is the built-in's file, whole and in the same order (flags, networks, rollout, advantage, loss, update, training,
evaluation, command line), with its names changed to NAME, so its runs, checkpoints and folders are its own. It imports
only the engine's public names (docs/engine.md), and runs every way a built-in does: ``python NAME.py``, ``torchrun
NAME.py``, ``fleetrl train ./NAME.py``, and under ``fleetrl benchmark`` and ``fleetrl tune``.
"""

from __future__ import annotations

import datetime
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

import fleetrl
from fleetrl import files
from fleetrl.algos import ALGOS
from fleetrl.errors import FleetError


@dataclass
class NewArgs:
    name: tyro.conf.Positional[str]
    """the new algorithm's name, or its file: my_ppo writes ./my_ppo.py; experiments/my_ppo.py writes there"""
    from_algo: Annotated[str, tyro.conf.arg(name="from")] = "ppo"
    """the built-in algorithm to copy (`fleetrl --help` lists them)"""
    force: bool = False
    """overwrite the file if it exists"""


def template(algo: str, name: str, today: datetime.date | None = None, path: str | None = None) -> str:
    """The text of ``name``.py: the built-in ``algo``'s file with its names changed to ``name``. ``path``: where it is
    written, as the user gave it (the header's commands name it) [``name``.py]."""
    source = Path(importlib.util.find_spec(f"fleetrl.algos.{algo}").origin).read_text()
    # the name its run passes to Run.start: a keyword of ppo's and td3's train (ppo_lstm and ddpg train through them)
    named = '*, algo: str = "{}",' if algo in ("ppo", "td3") else 'algo="{}"'
    renames = [  # each must match exactly once, or the built-in changed and this must follow it
        ('    exp_name: str = "{}"\n'.format(algo), '    exp_name: str = "{}"\n'.format(name)),
        (named.format(algo), named.format(name)),
    ]
    for old, new in renames:
        if source.count(old) != 1:
            raise AssertionError(f"fleetrl/algos/{algo}.py has {source.count(old)} of {old.strip()!r}, not 1: update fleetrl/tools/new.py")
        source = source.replace(old, new)
    path = path or f"{name}.py"
    given = name if path == f"{name}.py" else path
    local = path if path.startswith(("/", "./", "../")) else f"./{path}"
    header = (f"# {name}.py: your own copy of fleetrl's {algo} (fleetrl {fleetrl.__version__}), made by `fleetrl new {given} --from {algo}` "
              f"on {(today or datetime.date.today()).isoformat()}.\n"
              f"# Change anything. Run it: python {path} --env-id ENV, torchrun --nproc-per-node 2 {path} ..., fleetrl train {local} ...\n"
              f"# It imports only the engine's public names, listed with what stays stable in fleetrl's docs/engine.md.\n")
    return header + source


def new(args: NewArgs) -> Path:
    if args.from_algo not in ALGOS:
        raise FleetError(f"--from {args.from_algo}: there is no built-in algorithm of that name. Copy one of: {', '.join(ALGOS)}. "
                         f"Example: fleetrl new my_ppo --from ppo")
    path = Path(args.name if args.name.endswith(".py") else f"{args.name}.py")
    name = path.stem
    if not name.isidentifier() or name.startswith("_"):
        raise FleetError(f"{args.name!r}: the name must be a Python module name (letters, digits and underscores, not starting with a "
                         f"digit or _), since `fleetrl eval` and your run's processes import the file by it. Example: fleetrl new my_ppo --from ppo")
    shadowed = _module_named(name, path)
    if shadowed:
        raise FleetError(f"{name!r} is already the name of the module {shadowed}, which your file would hide (or be hidden by) when it "
                         f"is imported. Choose another name, e.g. my_{name}.")
    if path.exists() and not args.force:
        raise FleetError(f"{path} exists already, and fleetrl never overwrites your file. Choose another name, or add --force to "
                         f"replace it.")
    if not path.parent.is_dir():
        raise FleetError(f"There is no folder {path.parent} to write {path.name} into. Create it first (mkdir -p {path.parent}).")
    try:
        files.write_atomically(path, template(args.from_algo, name, path=args.name if args.name.endswith(".py") else None))
    except OSError as exc:
        raise FleetError(f"Cannot write {path} ({exc.strerror or exc}). Choose a folder you can write.") from None
    print(f"wrote {path}: fleetrl's {args.from_algo}, yours to change. Run it:\n"
          f"  python {path} --env-id CartPole-v1\n  fleetrl train ./{path} --env-id CartPole-v1\n"
          f"Its checkpoints record the file and its sha256; `fleetrl eval RUN` rebuilds the policy with this file's code (docs/engine.md).")
    return path


def _module_named(name: str, path: Path) -> str | None:
    """The module that ``name`` already names (the standard library's, an installed package's), other than ``path`` itself."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names or name == "fleetrl":
        return f"{name} (Python's own)" if name != "fleetrl" else "fleetrl"
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: finding it runs no code
    except (ImportError, ValueError):
        return None
    if spec is None or (spec.origin and Path(spec.origin).resolve() == path.resolve()):
        return None
    return f"{name} ({spec.origin or 'a namespace package'})"
