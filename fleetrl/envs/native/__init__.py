"""Native vector backends: ale-py's C++ ``AtariVectorEnv`` (:mod:`.ale`) and EnvPool (:mod:`.envpool`), behind fleetrl's
vector interface, and which of them can run an env id here.

Both produce exactly the interface of :mod:`fleetrl.envs.vector` (same-step autoreset, ``info["final_obs"]``/
``"_final_obs"``, ``info["episode"]``/``"_episode"`` only at a real episode end). They do not give the agent the same
data for a seed (EnvPool drops the rewards of its hidden reset frames; ale's FIRE after a lost life is a visible step):
docs/backends.md.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings

from fleetrl.envs.native.ale import AleVectorEnv
from fleetrl.envs.native.common import atari_game_name, envpool_task_id
from fleetrl.envs.native.envpool import EnvPoolVectorEnv

__all__ = ["AleVectorEnv", "EnvPoolVectorEnv", "atari_game_name", "envpool_task_id", "native_backend_support"]


@functools.lru_cache(maxsize=None)
def native_backend_support(env_id: str, family: str) -> dict[str, bool]:
    """Which native backends can run ``env_id``: ``{"ale": bool, "envpool": bool}``.

    True means the package is installed and imports here, and the id is one it provides (for
    Procgen: EnvPool's Procgen module also loads, which needs the system Qt 5 runtime). Never raises.
    """
    return {"ale": _ale_supports(env_id, family), "envpool": _envpool_supports(env_id, family)}


def _ale_supports(env_id: str, family: str) -> bool:
    if family != "atari" or importlib.util.find_spec("ale_py") is None:
        return False
    try:
        importlib.import_module("ale_py.vector_env")
        from ale_py import roms

        with warnings.catch_warnings():  # ale-py warns "Rom ... not supported" for unknown games
            warnings.simplefilter("ignore")
            return roms.get_rom_path(atari_game_name(env_id)) is not None
    except Exception:
        return False


def _envpool_supports(env_id: str, family: str) -> bool:
    if importlib.util.find_spec("envpool") is None:
        return False
    try:
        envpool = importlib.import_module("envpool")
        task = envpool_task_id(env_id, family)
        if task not in envpool.list_all_envs():
            return False
        envpool.make_spec(task)  # loads the task's module: fails e.g. for Procgen without Qt 5
        return True
    except Exception:
        return False
