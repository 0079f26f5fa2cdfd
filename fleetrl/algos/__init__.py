"""One readable file per algorithm, each on the same engine.

Each module exposes:
* ``Args``: its flags, a dataclass subclassing :class:`fleetrl.args.CommonArgs` (CleanRL's names and defaults);
* ``FAMILY_DEFAULTS``: the defaults of the flags left ``None``, per env family (a family it lacks is refused);
* ``AGENT_ROWS``: whether it trains PettingZoo games, whose rows of agents that have left a game are blank (True only
  where the live mask reaches its buffers, losses, normalisers and statistics; a file without it is refused them);
* ``RANGES`` and ``validate(args, world_size)``: what it refuses before anything starts;
* ``train(args, explicit=None)``: the whole algorithm, top to bottom, in a :class:`fleetrl.run.Run`;
* ``policy_from_checkpoint(state, envs, deterministic)``: ``obs -> action`` for ``fleetrl eval``
  (:func:`fleetrl.policy.policy_fn` of a network implementing :class:`fleetrl.policy.Policy`).
``fleetrl train``, ``eval``, ``benchmark`` and ``tune`` work for every algorithm listed here.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from fleetrl import config

ALGOS = ("ppo", "ppo_lstm", "ppg", "ppo_rnd", "ppo_trxl", "dqn", "c51", "rainbow", "qdagger", "pqn", "sac", "sac_discrete", "td3", "ddpg")


def agent_rows(algo: str, algorithm_file: dict[str, str] | None = None) -> tuple[bool, list[str]]:
    """Whether the algorithm being trained says ``AGENT_ROWS = True`` (the user's file this process trains, as
    ``algorithm_file`` records it, else the built-in named ``algo``), and the built-ins that say so, for the engine's one
    check of PettingZoo games (:func:`fleetrl.config.check_agent_rows`)."""
    if algorithm_file and algorithm_file.get("kind") != "builtin":  # `fleetrl train ./my_ppo.py`, `python my_ppo.py`
        path = Path(algorithm_file.get("path", "")).resolve()
        module = next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) and Path(m.__file__).resolve() == path), None)
    elif algo in ALGOS:
        module = importlib.import_module(f"fleetrl.algos.{algo}")
    else:  # a script that calls Run.start itself: its own file, run as __main__
        module = sys.modules.get("__main__")
    declared = getattr(module, "AGENT_ROWS", False) is True
    return declared, ([] if declared else [name for name in ALGOS if importlib.import_module(f"fleetrl.algos.{name}").AGENT_ROWS is True])


config.AGENT_ROWS_READER = agent_rows  # the engine knows no algorithm: it asks here
