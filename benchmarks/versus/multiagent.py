"""Parameter-shared PPO on a PettingZoo Atari game against CleanRL's ppo_pettingzoo_ma_atari.py (issue 37): speed.

CleanRL's script (benchmarks/cleanrl/ppo_pettingzoo_ma_atari.py: its SuperSuit chain steps the games in the trainer)
against ``fleetrl train ppo`` on the same game with the same batch shapes (16 agent rows, 8 two-player games, 128
steps) on the sync backend. The learning runs are the learning benchmark's."""

from __future__ import annotations

from versus.common import Algo

ALGO = Algo("ppo", "ppo_pettingzoo_ma_atari.py", "pettingzoo.atari.pong_v3", {"speed": 16_384},
            flags=lambda env_id, opts: ["--num-envs", str(opts.num_envs), "--num-steps", str(opts.num_steps)],
            their_env_id=lambda env_id: env_id.rsplit(".", 1)[-1],  # CleanRL's script takes pong_v3
            options=((("--num-envs",), dict(type=int, default=16, help="agent rows, every side (CleanRL's: 8 games of 2)")),
                     (("--num-steps",), dict(type=int, default=128))), modes=("speed",))
