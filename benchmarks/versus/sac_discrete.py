"""Discrete SAC against CleanRL's sac_atari.py (issue 36): the lockstep, speed and learning.

``--lockstep``: fleetrl's loop recorded at its engine calls, and CleanRL's loop (benchmarks/cleanrl/loops/sac_discrete.py:
its networks with the MLP its ported file gives vector observations) given fleetrl's three differences: numpy's warm-up
draws, target networks copied, fused Adam. ``--speed`` and ``--learn`` give both sides fleetrl's classic-control buffer
and target cadence on classic control (CleanRL's are Atari's), and a 100k buffer on Atari (CleanRL's 1M keeps obs and
next obs apart: 53 GB).
"""

from __future__ import annotations

import argparse

from versus.common import Algo, cleanrl_on_path, compare, fleetrl_run, recording, renamed

ATARI_BUFFER = 100_000
# fleetrl's module names of CleanRL's: fleetrl's MLP is one Sequential; CleanRL's port calls its first layer conv.0
FLEETRL_NAMES = {f"{net}.network.{i}.": f"{net}.{name}." for net in ("actor", "qf1", "qf2", "qf1_target", "qf2_target")
                 for i, name in ((0, "conv.0"), (2, "fc1"), (4, "fc_logits" if net == "actor" else "fc_q"))}


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    from fleetrl.algos import sac_discrete
    from loops.offpolicy import Trace
    from loops.sac_discrete import plain_sac_discrete

    ours = Trace()
    with recording(sac_discrete, ours, calls_per_target=2):  # qf1's target, then qf2's
        _, state = fleetrl_run(sac_discrete, env_id=opts.env_id, seed=opts.seed, total_timesteps=opts.steps,
                               learning_starts=opts.learning_starts)
    ours.final_params = renamed({part: state[part] for part in ("actor", "qf1", "qf2", "qf1_target", "qf2_target")}, FLEETRL_NAMES)
    theirs = plain_sac_discrete(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, fleetrl_draws=True, copied_targets=True,
                                fused_adam=True)
    return compare(ours, theirs)


def shared_flags(env_id: str, opts: argparse.Namespace) -> list[str]:
    from fleetrl.algos.sac_discrete import FAMILY_DEFAULTS
    from fleetrl.envs import env_family

    flags = ["--learning-starts", str(opts.learning_starts)]
    if env_family(env_id).name == "classic":
        classic = FAMILY_DEFAULTS["classic"]
        return flags + ["--buffer-size", str(classic["buffer_size"]), "--target-network-frequency", str(classic["target_network_frequency"])]
    return flags + ["--buffer-size", str(ATARI_BUFFER)]


ALGO = Algo("sac_discrete", "sac_atari.py", "CartPole-v1", {"lockstep": 3000, "speed": 3000, "learn": 100_000},
            learning_starts={"lockstep": 1000, "speed": 1000, "learn": 5000}, flags=shared_flags, lockstep=lockstep,
            score_bounds={"CartPole-v1": "0,500"})
