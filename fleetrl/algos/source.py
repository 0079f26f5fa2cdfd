"""Where an algorithm's code comes from: a built-in (`ppo`), a user's file (`./my_ppo.py`) or a user's module
(`mypkg.my_algo`), and the record of it that checkpoints keep, so `fleetrl eval` rebuilds the policy with that code.

Importing a file runs its code, so fleetrl imports a user's algorithm only when the user names it (`fleetrl train FILE`,
`python FILE`, `fleetrl eval --algo-file FILE`), or when `fleetrl eval` finds the file at the place its checkpoint recorded
and its bytes hash to a sha256 on this user's record of the code they ran (fleetrl/algos/trusted.py). Those bytes are then
imported from that path; nothing a checkpoint records is ever handed to an importer (docs/engine.md, "Whose code runs").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shlex
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from fleetrl import config
from fleetrl.algos import ALGOS, trusted
from fleetrl.errors import FleetError, exit_on_error
from fleetrl.run import Run

REQUIRED = ("Args", "train")  # what `fleetrl train` needs of a file; `fleetrl eval` also needs policy_from_checkpoint
EXAMPLE = "fleetrl train ppo --env-id CartPole-v1, or your own file: fleetrl new my_ppo --from ppo, then fleetrl train ./my_ppo.py"


@dataclass(frozen=True)
class AlgoSource:
    """An algorithm's code: ``kind`` is "builtin" (``fleetrl.algos.NAME``), "file" (a ``.py`` file, imported under its
    stem) or "module" (an importable dotted name); ``path`` its source file, ``sha256`` the hash of that source."""

    kind: str
    module: str
    path: str
    sha256: str
    command: str  # how to run it again, for messages: "fleetrl train ./my_ppo.py", "python my_ppo.py"

    @property
    def name(self) -> str:
        return self.module.rsplit(".", 1)[-1]

    def record(self) -> dict[str, str]:
        """What a checkpoint keeps (``algo_file``)."""
        return {"kind": self.kind, "module": self.module, "path": self.path, "sha256": self.sha256}


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def is_file_spec(spec: str) -> bool:
    """``./my_ppo.py``, ``my_ppo.py``, ``experiments/x.py``: a path; ``ppo``, ``mypkg.my_algo``: a name."""
    return spec.endswith(".py") or os.sep in spec or spec.startswith(".")


def load(spec: str, command: str | None = None) -> tuple[ModuleType, AlgoSource]:
    """The algorithm named on a command line (a built-in, a file or a module), imported, with its source. Refuses, in one
    paragraph each, a file that is not there, one that fails to import (with the user's own traceback) and one that lacks
    ``Args``/``train``."""
    command = command or f"fleetrl train {shlex.quote(spec)}"
    if spec in ALGOS:
        module = importlib.import_module(f"fleetrl.algos.{spec}")
        return module, _source_of(module, "builtin", command)
    if is_file_spec(spec):
        module = import_file(spec)
        return _checked(module, spec), _source_of(module, "file", command)
    if not all(part.isidentifier() for part in spec.split(".")):
        raise FleetError(f"`fleetrl train` needs an algorithm: one of {', '.join(ALGOS)}, a file (./my_algo.py) or a module "
                         f"(mypkg.my_algo); got {spec!r}. Example: {EXAMPLE}")
    module = _import_user_code(spec, lambda: _import_module(spec), spec)
    return _checked(module, spec), _source_of(module, "module", command)


def import_file(path: str, verified: bytes | None = None) -> ModuleType:
    """Import a user's ``.py`` file as the module of its stem, its folder first on the import path (as ``python FILE``
    does), so that its processes (env workers, the learner) import it by name too. ``verified``: the file's bytes, already
    checked against a sha256; those very bytes run, not what the file holds a moment later."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FleetError(f"There is no algorithm file {path} (looked in {Path.cwd()}). Check the path, or make one: "
                         f"fleetrl new {file.stem if file.stem.isidentifier() else 'my_ppo'} --from ppo")
    file = file.resolve()
    name = file.stem
    if not name.isidentifier():
        raise FleetError(f"The algorithm file {path} cannot be imported: {name!r} is not a Python module name. Rename it to letters, "
                         f"digits and underscores, e.g. {''.join(c if c.isalnum() else '_' for c in name).lstrip('0123456789') or 'my_algo'}.py.")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == file:
            return loaded
        raise FleetError(f"The algorithm file {path} is named like the module {name!r} that is already imported from "
                         f"{getattr(loaded, '__file__', None) or 'Python itself'}, so it cannot be imported under its name. Rename the file.")
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)

    def execute() -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            if verified is None:
                spec.loader.exec_module(module)
            else:
                exec(compile(verified, str(file), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - hashed bytes
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module

    return _import_user_code(path, execute, str(file))


def _import_module(name: str) -> ModuleType:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `fleetrl train mypkg.my_algo` finds the package in this folder, as `python -m` does
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name) and (name == exc.name or name[len(exc.name)] == "."):
            raise FleetError(f"There is no algorithm module {name!r} (no module {exc.name!r} on the import path, which starts at "
                             f"{Path.cwd()}). Check the name, or pass a file: fleetrl train ./my_algo.py") from None
        raise


def _import_user_code(spec: str, execute, where: str) -> ModuleType:
    """Run ``execute`` (the import); an error raised by the user's code is shown with its traceback, from their file on."""
    try:
        return execute()
    except FleetError:
        raise
    except BaseException as exc:  # noqa: BLE001 - their code can raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if not f.filename.startswith(("<frozen", str(Path(__file__).parent.parent)))] or frames
        shown = "".join(traceback.format_list(own)) + "".join(traceback.format_exception_only(type(exc), exc))
        raise FleetError(f"The algorithm {spec} failed to import ({type(exc).__name__}: {exc}); the error is in your code, {where}. "
                         f"Fix it and run again; `python {where}` shows the same error. Its traceback:\n{shown.rstrip()}") from None


def _checked(module: ModuleType, spec: str) -> ModuleType:
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise FleetError(f"{spec} is not a fleetrl algorithm: it defines no {' and no '.join(missing)}. An algorithm file defines "
                         f"`Args` (a dataclass of its flags) and `train(args, explicit=None)`, and `policy_from_checkpoint` for "
                         f"`fleetrl eval` (docs/engine.md). Start from a built-in: fleetrl new {Path(spec).stem if Path(spec).stem.isidentifier() else 'my_ppo'} --from ppo")
    return module


def _source_of(module: ModuleType, kind: str, command: str) -> AlgoSource:
    path = str(Path(module.__file__).resolve())
    name = module.__name__
    if name == "__main__":  # `python my_ppo.py` or `python -m mypkg.my_algo`
        name = module.__spec__.name if module.__spec__ is not None else Path(path).stem
    if kind != "file" and name.startswith("fleetrl.algos.") and name.rsplit(".", 1)[-1] in ALGOS:
        kind = "builtin"
    return AlgoSource(kind, name, path, sha256_of(path), command)


def source_of_main(module_name: str) -> tuple[ModuleType, AlgoSource]:
    """The algorithm a file run as a script is (``python my_ppo.py``, ``torchrun my_ppo.py``, ``python -m mypkg.algo``)."""
    module = sys.modules[module_name]
    kind = "module" if module_name == "__main__" and module.__spec__ is not None else "file"
    command = f"python -m {module.__spec__.name}" if kind == "module" else f"python {shlex.quote(sys.argv[0])}"
    return module, _source_of(module, kind, command)


# ---- training: `fleetrl train SPEC ...`, `python my_ppo.py ...` -----------------------------------------------------


def train_command_line(argv: list[str]) -> None:
    """``fleetrl train ALGO|FILE|MODULE [flags]``."""
    if not argv or argv[0].startswith("-"):
        raise FleetError(f"`fleetrl train` needs an algorithm: one of {', '.join(ALGOS)}, a file (./my_algo.py) or a module "
                         f"(mypkg.my_algo); got {argv[0] if argv else 'nothing'}. Example: {EXAMPLE}")
    module, source = load(argv[0])
    _train(module, source, argv[1:], prog=f"fleetrl train {argv[0]}")


def train_main(module_name: str) -> None:
    """An algorithm file's own command line: ``python my_ppo.py [flags]`` or ``torchrun my_ppo.py [flags]`` trains it as
    ``fleetrl train ./my_ppo.py [flags]`` does, with the same errors and exit codes."""

    def train(argv: list[str]) -> None:
        module, source = source_of_main(module_name)
        _train(module, source, argv, prog=source.command)

    exit_on_error(train, sys.argv[1:])


def _train(module: ModuleType, source: AlgoSource, argv: list[str], prog: str) -> None:
    import tyro

    args = tyro.cli(module.Args, args=argv, prog=prog)
    if source.kind != "builtin":  # the user named this code: `fleetrl eval` of its checkpoints may import it again
        trusted.remember(source.sha256, source.path)
    Run.trains(source.record(), source.command)  # checkpoints record the code, for eval
    try:
        module.train(args, explicit=config.explicit_fields(argv, module.Args))
    finally:  # a later train() called in this process (a test, a notebook) is not this file's
        Run.trains(None, None)


# ---- evaluation: which code rebuilds a checkpoint's policy ----------------------------------------------------------


def for_checkpoint(state: dict[str, Any], checkpoint: str, algo_file: str | None) -> ModuleType:
    """The module whose ``policy_from_checkpoint`` rebuilds this checkpoint's policy: the file or module the user names
    (``--algo-file``); else the built-in the checkpoint names; else the file at the recorded place, when its bytes hash to
    the recorded sha256 and that sha256 is on this user's record of the code they ran. Never a built-in for a checkpoint of
    a user's file, and never a name the checkpoint records handed to an importer."""
    record = state.get("algo_file") if isinstance(state.get("algo_file"), dict) else None
    algo = state.get("algo", "ppo")
    rerun = f"fleetrl eval {shlex.quote(checkpoint)} --algo-file FILE"
    if algo_file is not None:
        module, named = load(algo_file, command="")
        if record is not None and record.get("sha256") != named.sha256:
            print(f"fleetrl eval: {algo_file} (sha256 {named.sha256[:16]}...) is not the code this checkpoint was trained with "
                  f"({record.get('path')}, sha256 {str(record.get('sha256'))[:16]}...); evaluating with it as you asked.", file=sys.stderr)
        module = _with_policy(module, algo_file)
        if named.kind != "builtin":
            trusted.remember(named.sha256, named.path)
        return module
    if record is None or record.get("kind") == "builtin":
        if record is None and algo not in ALGOS:
            raise FleetError(f"{checkpoint} was trained by the algorithm {algo!r}, which is not built in, and it records no file. "
                             f"Name the algorithm's file: {rerun}")
        name = str(record["module"]).rsplit(".", 1)[-1] if record is not None else algo
        if name not in ALGOS:
            raise FleetError(f"{checkpoint} names the built-in algorithm {name!r}, which this fleetrl does not have. Name its file: {rerun}")
        return importlib.import_module(f"fleetrl.algos.{name}")  # one of fleetrl's own, from the fixed list
    path, recorded = Path(str(record.get("path"))), str(record.get("sha256"))
    if not path.is_file():
        raise FleetError(f"{checkpoint} was trained with the algorithm file {path} (sha256 {recorded}), which is not there any more. "
                         f"fleetrl rebuilds the policy with that file's own code, never a built-in network. Name the file (or a copy "
                         f"of it): {rerun}")
    rerun_with = rerun.replace("FILE", shlex.quote(str(path)))
    data = path.read_bytes()  # hashed, then these bytes are what runs
    now = hashlib.sha256(data).hexdigest()
    if now != recorded:
        raise FleetError(f"The algorithm file {path} has changed since {checkpoint} was trained: its sha256 is {now}, the checkpoint "
                         f"recorded {recorded}. Restore the file as it was (e.g. from git), or name a file to evaluate with as it "
                         f"is now: {rerun_with}")
    if hasattr(os, "getuid") and path.stat().st_uid != os.getuid():
        raise FleetError(f"{checkpoint} was trained with {path}, which belongs to another user, and fleetrl runs no one else's code "
                         f"on a checkpoint's word. If you trust it, name it: {rerun_with}")
    ran, why = trusted.knows(now)
    if not ran:
        raise FleetError(f"{checkpoint} was trained with the algorithm file {path} (sha256 {now[:16]}...), and fleetrl finds no sign that "
                         f"you ran that code yourself: {why}. A checkpoint alone never makes fleetrl import code, and a file being "
                         f"yours (unpacked from a tarball, cloned) is not enough. Read the file; if you trust it, name it once and "
                         f"fleetrl remembers it: {rerun_with}")
    return _with_policy(_checked(import_file(str(path), verified=data), str(path)), str(path))


def _with_policy(module: ModuleType, spec: str) -> ModuleType:
    if not hasattr(module, "policy_from_checkpoint"):
        raise FleetError(f"{spec} defines no policy_from_checkpoint(state, envs, deterministic), which `fleetrl eval` calls to rebuild "
                         f"the trained policy with the file's own network. Add it (the templates from `fleetrl new` have one).")
    return module
