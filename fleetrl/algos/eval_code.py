"""Which code rebuilds a checkpoint's policy for `fleetrl eval` (docs/engine.md, "Whose code runs"): the file or module
the user names with ``--algo-file``; else fleetrl's own module of the built-in the checkpoint names; else the file at the
path the checkpoint recorded, imported from the very bytes just hashed, and only when that hash is the recorded one and on
this user's record of the code they ran (fleetrl/algos/trusted.py). Nothing a checkpoint records is handed to an importer.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fleetrl.algos import ALGOS, source
from fleetrl.algos.trusted import knows, remember
from fleetrl.errors import FleetError


def for_checkpoint(state: dict[str, Any], checkpoint: str, algo_file: str | None) -> ModuleType:
    """The module whose ``policy_from_checkpoint`` rebuilds this checkpoint's policy: the file or module the user names
    (``--algo-file``); else the built-in the checkpoint names; else the file at the recorded place, when its bytes hash to
    the recorded sha256 and that sha256 is on this user's record of the code they ran. Never a built-in for a checkpoint of
    a user's file, and never a name the checkpoint records handed to an importer."""
    record = state.get("algo_file") if isinstance(state.get("algo_file"), dict) else None
    algo = state.get("algo", "ppo")
    rerun = f"fleetrl eval {shlex.quote(checkpoint)} --algo-file FILE"
    if algo_file is not None:
        module, named = source.load(algo_file, command="")
        if record is not None and record.get("sha256") != named.sha256:
            print(f"fleetrl: {algo_file} (sha256 {named.sha256[:16]}...) is not the code this checkpoint was trained with "
                  f"({record.get('path')}, sha256 {str(record.get('sha256'))[:16]}...); rebuilding the policy with it as you asked.", file=sys.stderr)
        module = _with_policy(module, algo_file)
        if named.kind != "builtin":
            remember(named.sha256, named.path)
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
    ran, why = knows(now)
    if not ran:
        raise FleetError(f"{checkpoint} was trained with the algorithm file {path} (sha256 {now[:16]}...), and fleetrl finds no sign that "
                         f"you ran that code yourself: {why}. A checkpoint alone never makes fleetrl import code, and a file being "
                         f"yours (unpacked from a tarball, cloned) is not enough. Read the file; if you trust it, name it once and "
                         f"fleetrl remembers it: {rerun_with}")
    return _with_policy(source.checked(source.import_file(str(path), verified=data), str(path)), str(path))


def _with_policy(module: ModuleType, spec: str) -> ModuleType:
    if not hasattr(module, "policy_from_checkpoint"):
        raise FleetError(f"{spec} defines no policy_from_checkpoint(state, envs, deterministic), which `fleetrl eval` calls to rebuild "
                         f"the trained policy with the file's own network. Add it (the templates from `fleetrl new` have one).")
    return module
