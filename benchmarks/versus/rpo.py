"""A user's file against CleanRL's (issue 34): examples/rpo.py (`fleetrl new rpo --from ppo`, 28 lines changed) against
CleanRL's own rpo_continuous_action.py on a MuJoCo env at equal steps: speed and learning, both at their defaults (CleanRL's,
which the user's file takes; fleetrl's env backend its own choice)."""

from __future__ import annotations

import sys
from pathlib import Path

from versus.common import Algo

ALGO = Algo("rpo", "rpo_continuous_action.py", "InvertedPendulum-v5", {"speed": 32_768, "learn": 32_768}, backend="",
            fleetrl_command=(sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "rpo.py")),
            score_bounds={"InvertedPendulum-v5": "0,1000"}, bar=950, modes=("speed", "learn"))
