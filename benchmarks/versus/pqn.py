"""PQN against CleanRL's pqn.py (CartPole, Acrobot) and pqn_atari_envpool.py (Atari) (issue 35): the lockstep, speed
and learning.

``--lockstep``: fleetrl's loop recorded at its calls (the sampler's draws and the actions, the Q(lambda) returns, the
minibatch order, each loss), and CleanRL's pqn.py loop (benchmarks/cleanrl/loops/pqn.py) given fleetrl's draws: each
step's explore uniform and random action, each epoch's permutation. The env transitions, initial weights, greedy
actions, returns and RAdam updates then agree bit for bit.
"""

from __future__ import annotations

import argparse

import numpy as np

from versus.common import Algo, cleanrl_on_path, compare, fleetrl_run, patched


def fleetrl_trace(seed: int, steps: int, env_id: str = "CartPole-v1"):
    cleanrl_on_path()
    import torch

    from fleetrl.algos import pqn
    from loops.offpolicy import Trace

    trace = Trace()
    rollout, q_lambda_returns, td_loss, randperm = pqn.rollout, pqn.q_lambda_returns, pqn.td_loss, torch.randperm

    def recording_rollout(steps_, *args, **kwargs):
        num_actions = kwargs["num_actions"]

        def recorded():
            for due in steps_:
                uniform = np.exp(-due.noise)  # as rollout() reads them
                random_actions = np.minimum(uniform[:, -1] * num_actions, num_actions - 1).astype(np.int64)
                trace.uniforms.append(np.stack([uniform[:, 0], random_actions], 1))
                yield due

        return rollout(recorded(), *args, **kwargs)

    def recording_returns(b, gamma, q_lambda):
        returns = q_lambda_returns(b, gamma, q_lambda)
        trace.returns.append(returns.copy())
        trace.actions += b.actions.tolist()  # every step's actions, as stored and sent
        trace.truncations += int((b.dones & ~b.terminated).sum())
        return returns

    def recording_loss(q_network, mb):
        loss, old_val = td_loss(q_network, mb)
        trace.losses.append(loss.item())
        return loss, old_val

    def recording_randperm(n, *args, **kwargs):
        perm = randperm(n, *args, **kwargs)
        trace.permutations.append(perm.numpy().copy())
        return perm

    with patched(pqn, rollout=recording_rollout, q_lambda_returns=recording_returns, td_loss=recording_loss), patched(torch, randperm=recording_randperm):
        trace.final_params = fleetrl_run(pqn, env_id=env_id, seed=seed, total_timesteps=steps, precision="fp32")[1]["model"]
    return trace


def traces(seed: int, steps: int):
    """Both loops on the same draws: (fleetrl's trace, CleanRL's)."""
    cleanrl_on_path()
    from loops.offpolicy import Trace
    from loops.pqn import plain_pqn

    ours, theirs = fleetrl_trace(seed, steps), Trace()
    plain_pqn("CartPole-v1", steps, seed, ours, theirs)
    return ours, theirs


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    ours, theirs = traces(opts.seed, opts.steps)
    verdicts = compare(ours, theirs, ("actions", "returns", "losses"), by_order=("", ""))
    verdicts["truncations"] = f"{ours.truncations} (fleetrl), {theirs.truncations} (cleanrl)"
    return verdicts


def atari(env_id: str) -> bool:
    return "-v5" in env_id or "NoFrameskip" in env_id


ALGO = Algo("pqn", lambda env_id: "pqn_atari_envpool.py" if atari(env_id) else "pqn.py", "CartPole-v1",
            {"lockstep": 4096, "speed": 50_000, "learn": 500_000}, lockstep=lockstep,
            their_env_id=lambda env_id: env_id.replace("NoFrameskip-v4", "-v5"),  # EnvPool's Breakout-v5: no sticky actions
            score_bounds={"CartPole-v1": "0,500", "Acrobot-v1": "-500,0"})
