"""PPG against CleanRL's ppg_procgen.py (issue 36): the update code in lockstep, speed, and learning against fleetrl's PPO.

``--lockstep`` compares the update code (CleanRL's script runs the old procgen package, which does not install here):
fleetrl's PPG runs a short job on EnvPool's Procgen, recorded at its engine calls (each iteration's batch, raw
advantages and minibatch order, the auxiliary phase's rollout order, every loss, the weights after each phase);
CleanRL's update code (benchmarks/cleanrl/loops/ppg.py) then runs on the same batches in the same order from the same
seed, given fused Adam and the auxiliary phase's zeroed gradients. Identical given fleetrl's rounding of the
log-probabilities and the whole-batch advantage normalisation; otherwise close. ``--learn`` runs ``fleetrl train ppg``
against ``fleetrl train ppo`` at equal steps.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from versus.common import Algo, Side, both_roundings, cleanrl_on_path, gap, patched

cleanrl_on_path()
from loops.ppg import LOCKSTEP, Record  # noqa: E402


def fleetrl_record(env_id: str, seed: int) -> Record:
    """fleetrl's PPG on ``LOCKSTEP``'s job, recorded where its loop calls the engine."""
    cleanrl_on_path()
    import torch

    from fleetrl.algos import ppg, ppo
    from fleetrl.distributed import Dist

    record = Record()
    randperm, shuffle, normalize, ppo_loss, backward = torch.randperm, np.random.shuffle, Dist.normalize, ppo.ppo_loss, torch.Tensor.backward
    aux_init, aux_call, distil = ppg.AuxiliaryPhase.__init__, ppg.AuxiliaryPhase.after_update, ppg.AuxiliaryPhase.distil
    in_distil = [False]

    def record_randperm(n, *args, **kwargs):
        order = randperm(n, *args, **kwargs)
        record.orders.append(order.clone())
        return order

    def record_shuffle(x):
        shuffle(x)
        record.aux_orders.append(np.array(x))

    def record_normalize(self, x, *args, **kwargs):
        record.raw_advantages.append(x.clone())
        record.normalized_advantages.append(normalize(self, x, *args, **kwargs))
        return record.normalized_advantages[-1]

    def record_loss(*args, **kwargs):
        loss, stats = ppo_loss(*args, **kwargs)
        record.losses.append(loss.item())
        return loss, stats

    def record_init(self, run, agent, *args):
        record.initial = {k: v.clone() for k, v in agent.state_dict().items()}
        aux_init(self, run, agent, *args)

    def record_call(self, iteration, batch):
        record.batches.append({k: v.clone() for k, v in batch.items()})
        return aux_call(self, iteration, batch)

    def record_distil(self, rollouts):
        in_distil[0] = True
        try:
            stats = distil(self, rollouts)
        finally:
            in_distil[0] = False
        record.phase_weights.append([p.detach().clone() for p in self.agent.parameters()])
        return stats

    def record_backward(self, *args, **kwargs):
        if in_distil[0]:
            record.aux_losses.append(self.item())
        return backward(self, *args, **kwargs)

    with (patched(torch, randperm=record_randperm), patched(np.random, shuffle=record_shuffle), patched(Dist, normalize=record_normalize),
          patched(ppo, ppo_loss=record_loss), patched(torch.Tensor, backward=record_backward),
          patched(ppg.AuxiliaryPhase, __init__=record_init, after_update=record_call, distil=record_distil), tempfile.TemporaryDirectory() as runs):
        ppg.train(ppg.Args(env_id=env_id, seed=seed, torch_threads=1, cuda=False, env_backend="envpool", progress=False, precision="fp32",
                           memory_format="contiguous",  # CleanRL's layout: channels-last rounds convolutions its own way
                           actor_device="cpu", run_dir=os.path.join(runs, "run"), **LOCKSTEP))
    return record


def compare(ours: Record, theirs: Record) -> dict[str, str]:
    """Each record: "identical", or the largest difference, relative for losses and absolute for weights."""
    verdicts = {"initial weights": gap(list(ours.initial.values()), list(theirs.initial.values()), False),
                "policy-phase losses": gap(ours.losses, theirs.losses, True),
                "auxiliary losses": gap(ours.aux_losses, theirs.aux_losses, True)}
    for phase, (mine, other) in enumerate(zip(ours.phase_weights, theirs.phase_weights), 1):
        verdicts[f"weights after phase {phase}"] = gap(mine, other, False)
    return verdicts


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    from loops.ppg import cleanrl_replay

    ours = fleetrl_record(opts.env_id, opts.seed)
    return both_roundings(lambda fleetrl_rounding: compare(ours, cleanrl_replay(ours, opts.seed, fleetrl_advantages=fleetrl_rounding,
                                                                                fleetrl_logprobs=fleetrl_rounding)))


ALGO = Algo("ppg", "ppg_procgen.py", "StarpilotEasy-v0", {"lockstep": 0, "speed": 65_536, "learn": 65_536},
            flags=lambda env_id, opts: ["--num-envs", str(opts.num_envs), "--n-iteration", str(opts.n_iteration)], backend="envpool",
            lockstep=lockstep, options=((("--n-iteration",), dict(type=int, default=32, help="PPG's policy iterations per phase")),
                                        (("--num-envs",), dict(type=int, default=64, help="envs, every side"))),
            sides={"fleetrl-ppo": Side(algo="ppo")}, learn_sides="fleetrl,fleetrl-ppo")
