"""C51 against CleanRL's c51.py (issue 35): the lockstep, speed (with ``fleetrl-lag1``: ``--policy-lag 1`` on
``--lag-cpus``) and learning.

``--lockstep``: fleetrl's loop recorded at DQN's engine calls, and CleanRL's c51.py loop (benchmarks/cleanrl/loops/c51.py)
given DQN's two differences (numpy's exploration draws, fused Adam) and the episode's final observation at a termination
(``--cleanrl-next-obs``: CleanRL's own, the next episode's first, which changes the targets' last bits).
"""

from __future__ import annotations

import argparse

from versus.common import Algo, Side, cleanrl_on_path, compare, fleetrl_run, recording

cleanrl_on_path()
from loops.c51 import plain_c51  # noqa: E402
from loops.offpolicy import Trace  # noqa: E402


def fleetrl_trace(seed: int, steps: int, learning_starts: int, env_id: str = "CartPole-v1"):
    cleanrl_on_path()
    from fleetrl.algos import c51, dqn

    trace = Trace()
    with recording(dqn, trace):
        trace.final_params = fleetrl_run(c51, env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts)[1]["q_network"]
    return trace


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    ours, theirs = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts, opts.env_id), Trace()
    plain_c51(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, numpy_draws=True, fused_adam=True,
              final_obs=not opts.cleanrl_next_obs, trace=theirs)
    return compare(ours, theirs)


ALGO = Algo("c51", "c51.py", "CartPole-v1", {"lockstep": 4000, "speed": 30_000, "learn": 500_000}, learning_starts={"lockstep": 1000, "speed": 10_000, "learn": 10_000},
            flags=lambda env_id, opts: ["--learning-starts", str(opts.learning_starts)], lockstep=lockstep, lockstep_seed=3,
            options=((("--cleanrl-next-obs",), dict(action="store_true", help="lockstep: CleanRL's next obs at a termination")),),
            sides={"fleetrl-lag1": Side(("--policy-lag", "1", "--torch-threads", "None"), lag_cpus=True)},
            speed_sides="cleanrl,fleetrl,fleetrl-lag1", score_bounds={"CartPole-v1": "0,500", "Acrobot-v1": "-500,0", "MountainCar-v0": "-200,0"})
