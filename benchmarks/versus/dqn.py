"""DQN against CleanRL's dqn.py on CartPole-v1 (issue 22): the lockstep, and learning over many seeds.

CleanRL's side is its loop run in this repository (benchmarks/cleanrl/loops/offpolicy.py: its network and default init,
its RNG streams, SB3's buffer, gymnasium 1.x same-step autoreset), each run in a process of its own. More sides:
``fleetrl-orthogonal`` (fleetrl's network re-initialised as before issue 22: CleanRL's PPO orthogonal init),
``cleanrl-numpy-draws`` and ``cleanrl-fused-adam`` (CleanRL's loop with one of fleetrl's two differences each).

``--lockstep``: fleetrl's loop recorded at its engine calls, and CleanRL's given fleetrl's exploration draws (one
uniform pair a step from numpy's global RNG) and its fused Adam: the same actions, updates and losses, bit for bit.
"""

from __future__ import annotations

import argparse
import math

from versus.common import Algo, Side, cleanrl_on_path, compare, fleetrl_run, patched, recording

cleanrl_on_path()
from loops.offpolicy import Trace, plain_dqn  # noqa: E402


def fleetrl_trace(seed: int, steps: int, learning_starts: int, env_id: str = "CartPole-v1"):
    """fleetrl's DQN run, its actions (and the Q-values they came from), update and target steps and losses recorded."""
    cleanrl_on_path()
    from fleetrl.algos import dqn

    trace, host_forward = Trace(), dqn.host_forward

    def recording_host_forward(module, device):
        forward = host_forward(module, device)

        def q_values_of(obs):
            q_values = forward(obs)
            trace.q_values[len(trace.actions)] = q_values[0].tolist()  # the step about to be taken
            return q_values
        return q_values_of

    with patched(dqn, host_forward=recording_host_forward), recording(dqn, trace):
        trace.final_params = fleetrl_run(dqn, env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts)[1]["q_network"]
    return trace


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    ours, theirs = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts, opts.env_id), Trace()
    plain_dqn(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, numpy_draws=True, fused_adam=True, trace=theirs)
    verdicts = compare(ours, theirs, by_order=("", ""))  # CleanRL's QNetwork is fleetrl's layer for layer, named otherwise
    first = next((i for i, (x, y) in enumerate(zip(ours.actions, theirs.actions)) if x != y), None)
    if first is not None:
        verdicts["first parting"] = f"step {first:,}: fleetrl acts on Q {ours.q_values.get(first)}, cleanrl on {theirs.q_values.get(first)}"
    return verdicts


def orthogonal_q_network() -> None:
    """Make fleetrl's QNetwork start as it did before issue 22: CleanRL's PPO init, not its dqn.py's."""
    from torch import nn

    from fleetrl.algos import dqn
    from fleetrl.nets import layer_init

    default_init = dqn.QNetwork.__init__

    def init(self, obs_shape, num_actions):
        default_init(self, obs_shape, num_actions)
        linears = [m for m in self.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        for layer in linears:
            layer_init(layer, std=1.0 if layer is linears[-1] else math.sqrt(2))  # and zero biases

    dqn.QNetwork.__init__ = init


def in_process(side: str, env_id: str, seed: int, opts: argparse.Namespace) -> dict:
    """One run of an in-process side: its episode returns and SPS."""
    cleanrl_on_path()
    if side == "fleetrl-orthogonal":
        from fleetrl.algos import dqn

        orthogonal_q_network()
        result, _ = fleetrl_run(dqn, env_id=env_id, seed=seed, total_timesteps=opts.steps, learning_starts=opts.learning_starts)
        return {"returns": result.episode_returns, "loop_sps": float("nan")}
    timing = plain_dqn(env_id, opts.steps, opts.learning_starts, seed=seed, numpy_draws=side == "cleanrl-numpy-draws",
                       fused_adam=side == "cleanrl-fused-adam")
    return {"returns": timing.episode_returns, "loop_sps": timing.sps()}


ALGO = Algo("dqn", "", "CartPole-v1", {"lockstep": 4000, "speed": 50_000, "learn": 500_000}, learning_starts={"lockstep": 1000, "speed": 10_000, "learn": 10_000},
            flags=lambda env_id, opts: ["--learning-starts", str(opts.learning_starts)], lockstep=lockstep, lockstep_seed=3,
            sides={name: Side(in_process=True) for name in ("cleanrl", "fleetrl-orthogonal", "cleanrl-numpy-draws", "cleanrl-fused-adam")},
            in_process=in_process, score_bounds={"CartPole-v1": "0,500", "Acrobot-v1": "-500,0"}, bar=475)
