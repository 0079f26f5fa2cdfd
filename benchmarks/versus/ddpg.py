"""DDPG against CleanRL's ddpg_continuous_action.py (issue 36): the lockstep, speed and learning.

``--lockstep``: fleetrl's loop (TD3's with one critic) recorded at its engine calls, and CleanRL's loop
(benchmarks/cleanrl/loops/ddpg.py) given fleetrl's three differences: numpy's warm-up draws, target networks copied (not
built and loaded), fused Adam. The same actions, updates, soft updates, losses and final weights, bit for bit.
"""

from __future__ import annotations

import argparse

from versus.common import Algo, cleanrl_on_path, compare, fleetrl_run, recording, renamed

# fleetrl's module names of CleanRL's: the actor's are the same but for the trunk; the critic is critics.0
FLEETRL_NAMES = {"actor.trunk.0.": "actor.fc1.", "actor.trunk.2.": "actor.fc2.", "qf.critics.0.": "qf1.",
                 "target_actor.trunk.0.": "target_actor.fc1.", "target_actor.trunk.2.": "target_actor.fc2.",
                 "qf_target.critics.0.": "qf1_target."}


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    from fleetrl.algos import ddpg, td3
    from loops.ddpg import plain_ddpg
    from loops.offpolicy import Trace

    ours = Trace()
    with recording(td3, ours, calls_per_target=2):  # the actor's target, then the critic's
        _, state = fleetrl_run(ddpg, env_id=opts.env_id, seed=opts.seed, total_timesteps=opts.steps, learning_starts=opts.learning_starts)
    ours.final_params = renamed({part: state[part] for part in ("actor", "qf", "target_actor", "qf_target")}, FLEETRL_NAMES)
    theirs = plain_ddpg(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, fleetrl_draws=True, copied_targets=True,
                        fused_adam=True)
    return compare(ours, theirs)


ALGO = Algo("ddpg", "ddpg_continuous_action.py", "InvertedPendulum-v5", {"lockstep": 3000, "speed": 3000, "learn": 100_000},
            learning_starts={"lockstep": 1000, "speed": 1000, "learn": 10_000},
            flags=lambda env_id, opts: ["--learning-starts", str(opts.learning_starts)], lockstep=lockstep,
            score_bounds={"InvertedPendulum-v5": "0,1000"})
