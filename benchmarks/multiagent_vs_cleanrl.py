"""fleetrl's parameter-shared PPO on a PettingZoo Atari game against CleanRL's ppo_pettingzoo_ma_atari.py (issue 37).

    python benchmarks/multiagent_vs_cleanrl.py --speed --env-id pettingzoo.atari.pong_v3 --steps 16384 --repeats 3 --cpu 1

CleanRL's script runs as benchmarks/cleanrl/ppo_pettingzoo_ma_atari.py: its own code with the smallest changes that
run it on current packages (SuperSuit's vector with base_class="gymnasium", gymnasium's reset and step), so its
SuperSuit chain steps the games. fleetrl runs ``fleetrl train ppo`` on the same game, with the same batch shapes (16
agent rows, 8 two-player games, and 128 steps) and CleanRL's other defaults, on the sync backend (CleanRL steps its
games in the trainer too: ``num_cpus=0``). Both sides are pinned to one core with one torch thread, alternating, and the
table gives the medians (benchmarks/cleanrl_side_by_side.py).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cleanrl_side_by_side as side_by_side  # noqa: E402
from cleanrl_side_by_side import Sides  # noqa: E402

CLEANRL_MA_ATARI = os.path.join(HERE, "cleanrl", "ppo_pettingzoo_ma_atari.py")


def budget(env_id: str, opts) -> list[str]:
    return ["--num-envs", str(opts.num_envs), "--num-steps", str(opts.num_steps)]


SIDES = Sides("ppo", CLEANRL_MA_ATARI, "ppo_pettingzoo_ma_atari.py", budget, backend="sync",
              their_env_id=lambda env_id: env_id.rsplit(".", 1)[-1])  # CleanRL's script takes pong_v3


def main() -> None:
    parser = side_by_side.parser(__doc__, "pettingzoo.atari.pong_v3", 16384, 0, "multiagent_vs_cleanrl")
    parser.add_argument("--num-envs", type=int, default=16, help="agent rows, every side (CleanRL's default: 8 games of 2)")
    parser.add_argument("--num-steps", type=int, default=128)
    opts = parser.parse_args()
    if not opts.speed:
        parser.error("this benchmark measures --speed (the learning runs are benchmarks/multiagent_learning.py)")
    side_by_side.speed(SIDES, opts)


if __name__ == "__main__":
    main()
