"""Where an algorithm's code comes from: a built-in (`ppo`), a user's file (`./my_ppo.py`) or a user's module
(`mypkg.my_algo`), loaded for the command that names it (`fleetrl train`, `python FILE`: :func:`train_main`), with the
record of it that checkpoints keep.

Importing a file runs its code, so fleetrl imports a user's algorithm only when the user names it (`fleetrl train FILE`,
`python FILE`, `fleetrl eval --algo-file FILE`), or, for `fleetrl eval`, from the very bytes of a file that the user ran
before (fleetrl/algos/eval_code.py and trusted.py; docs/engine.md, "Whose code runs").
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

from fleetrl import config, run_setup
from fleetrl.algos import ALGOS, trusted
from fleetrl.errors import FleetError, exit_on_error

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
        return checked(module, spec), _source_of(module, "file", command)
    if not all(part.isidentifier() for part in spec.split(".")):
        raise FleetError(f"`fleetrl train` needs an algorithm: one of {', '.join(ALGOS)}, a file (./my_algo.py) or a module "
                         f"(mypkg.my_algo); got {spec!r}. Example: {EXAMPLE}")
    module = _import_user_code(spec, lambda: _import_module(spec), spec)
    return checked(module, spec), _source_of(module, "module", command)


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


def checked(module: ModuleType, spec: str) -> ModuleType:
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
    # checkpoints record the code, for eval; a later train() called in this process (a test, a notebook) is not this file's
    with run_setup.training(source.record(), source.command):
        module.train(args, explicit=config.explicit_fields(argv, module.Args))
