"""Rainbow against CleanRL's rainbow_atari.py (issue 35): the lockstep, and Atari side by side (``--speed``, ``--learn``).

``--lockstep``: fleetrl's loop recorded at DQN's engine calls and its replay buffer's sample and update_priorities, and
CleanRL's loop (benchmarks/cleanrl/loops/rainbow.py: its classes from its file, an MLP trunk for the CNN) on
EndlessWalk-v0, whose episodes never end (CleanRL's n-step queue and fleetrl's differ at episode ends, on purpose): the
same actions, updates, target copies, sampled slots, importance weights, new priorities, losses and final weights.
"""

from __future__ import annotations

import argparse

from versus.common import Algo, cleanrl_on_path, compare, fleetrl_run, patched, recording

cleanrl_on_path()
from loops.offpolicy import Trace  # noqa: E402
from loops.rainbow import LOCKSTEP, plain_rainbow  # noqa: E402


def fleetrl_trace(seed: int, steps: int, learning_starts: int, env_id: str = "EndlessWalk-v0"):
    cleanrl_on_path()
    from fleetrl.algos import dqn, rainbow
    from fleetrl.sampling.replay import ReplayBuffer

    trace = Trace()
    sample, update_priorities = ReplayBuffer.sample, ReplayBuffer.update_priorities

    def record_sample(self, batch_size):
        batch = sample(self, batch_size)
        trace.indices.append(batch.indices.copy())
        trace.weights.append(batch.weights.numpy().copy())
        return batch

    def record_priorities(self, indices, errors):
        trace.priorities.append(errors.numpy().copy())
        return update_priorities(self, indices, errors)

    with patched(ReplayBuffer, sample=record_sample, update_priorities=record_priorities), recording(dqn, trace):
        trace.final_params = fleetrl_run(rainbow, env_id=f"loops.rainbow:{env_id}", seed=seed, total_timesteps=steps,
                                         learning_starts=learning_starts, **LOCKSTEP)[1]["q_network"]
    return trace


def compare_traces(ours, theirs) -> dict[str, str]:
    return compare(ours, theirs, ("actions", "update_steps", "target_steps", "indices", "weights", "priorities", "losses"),
                   by_order=("atoms", "support"))


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    opts.env_id = "EndlessWalk-v0"  # the lockstep's env, whatever --env-id says
    ours, theirs = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts), Trace()
    plain_rainbow("EndlessWalk-v0", opts.steps, opts.learning_starts, opts.seed, theirs)
    return compare_traces(ours, theirs)


ALGO = Algo("rainbow", "rainbow_atari.py", "BreakoutNoFrameskip-v4", {"lockstep": 3000, "speed": 25_000, "learn": 100_000},
            learning_starts={"lockstep": 500, "speed": 15_000, "learn": 20_000},
            flags=lambda env_id, opts: ["--learning-starts", str(opts.learning_starts), "--buffer-size", str(opts.buffer_size)],
            lockstep=lockstep, options=((("--buffer-size",), dict(type=int, default=100_000, help="speed, learn: both sides")),))
