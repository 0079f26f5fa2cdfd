"""PPO-RND against CleanRL's ppo_rnd_envpool.py (issue 36): its networks, start, acting and update code in lockstep, and
speed.

``--lockstep``: fleetrl's PPO-RND runs a short Atari job, recorded where its loop calls the curiosity (the initial
weights, each rollout and its advantages, the observation statistics, every minibatch with the torch RNG state its loss
began with, every loss, the weights after each iteration); CleanRL's code (benchmarks/cleanrl/loops/ppo_rnd.py) then
runs on the same inputs in the same order from the same seed. Identical given fleetrl's rounding of the
log-probabilities, the advantages' normalisation and the predictor's rows; otherwise by rounding only. Not compared:
the intrinsic rewards' scaling (fleetrl's running discount goes along each env's steps, CleanRL's along the envs). Its
SPS counts CleanRL's random-action start and not fleetrl's, so the wall column is the like-for-like one.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from versus.common import Algo, both_roundings, cleanrl_on_path, gap, patched

cleanrl_on_path()
from loops.ppo_rnd import LOCKSTEP, Record  # noqa: E402


def fleetrl_record(env_id: str, seed: int) -> Record:
    """fleetrl's PPO-RND on ``LOCKSTEP``'s job, recorded where its loop calls the curiosity."""
    cleanrl_on_path()
    import torch

    from fleetrl import checkpoint
    from fleetrl.algos import ppo_rnd
    from fleetrl.sampling.normalize import RunningMeanStd

    record = Record()
    curiosity = ppo_rnd.Curiosity
    real = (curiosity.__init__, curiosity.advantage, curiosity.loss)
    update = RunningMeanStd.update

    def record_init(self, run, agent, *args):
        record.initial = {k: v.clone() for k, v in agent.state_dict().items()}

        def keep(rms, batch, allreduce=None):  # only the random-action start updates statistics here
            record.warmup_batches.append(np.array(batch))
            return update(rms, batch, allreduce)

        with patched(RunningMeanStd, update=keep):
            real[0](self, run, agent, *args)
        record.warmup_stats = (self.obs_rms.mean.copy(), self.obs_rms.var.copy())

    def record_advantage(self, b):
        if record.rollouts:  # the weights the previous iteration's update left
            record.weights.append([p.detach().clone() for p in self.agent.parameters() if p.requires_grad])
        record.acting.append(dict(weights={k: v.clone() for k, v in self.agent.state_dict().items()}, obs=b.obs.copy(),
                                  actions=b.actions.copy(), logprobs=b.logprobs.copy(), values=b.values.copy(),
                                  next_obs=b.next_obs(ppo_rnd.rnd_input), obs_stats=(self.obs_rms.mean.copy(), self.obs_rms.var.copy())))
        curiosity_seen = {}
        update = self.discounted_reward.update

        def keep(rews):
            curiosity_seen.setdefault("rewards", []).append(np.array(rews))
            return update(rews)

        self.discounted_reward.update = keep
        try:
            extra = real[1](self, b)
        finally:
            del self.discounted_reward.update
        record.rollouts.append(dict(rewards=b.rewards.copy(), dones=b.dones.copy(), terminated=b.terminated.copy(), values=b.values.copy(),
                                    last_values=b.last_values.copy(), curiosity=np.stack(curiosity_seen["rewards"]),
                                    reward_var=float(self.reward_rms.var), advantages=b.advantages.copy(), returns=b.returns.copy(),
                                    int_returns=extra["int_returns"].numpy().copy(), int_values=self.int_values.copy(),
                                    next_value_int=self.next_value_int.copy()))
        record.obs_stats.append((self.obs_rms.mean.copy(), self.obs_rms.var.copy()))
        return extra

    def record_loss(self, agent, mb, args, dist):
        record.minibatches.append(({k: v.clone() for k, v in mb.items()}, torch.get_rng_state()))
        loss, stats = real[2](self, agent, mb, args, dist)
        record.losses.append(loss.item())
        return loss, stats

    with patched(curiosity, __init__=record_init, advantage=record_advantage, loss=record_loss), tempfile.TemporaryDirectory() as runs:
        run_dir = os.path.join(runs, "run")
        ppo_rnd.train(ppo_rnd.Args(env_id=env_id, seed=seed, torch_threads=1, cuda=False, env_backend="ale", progress=False,
                                   precision="fp32", memory_format="contiguous", actor_device="cpu", run_dir=run_dir, **LOCKSTEP))
        model = checkpoint.load_checkpoint(run_dir)["model"]
    record.weights.append([model[k] for k, v in record.initial.items() if not k.startswith("rnd.target.")])
    return record


def compare_acting(ours: Record, theirs: dict[str, list]) -> dict[str, str]:
    mean, var = ours.warmup_stats
    return {"start's statistics": gap([mean.reshape(-1), var.reshape(-1)], theirs["warmup"], True),
            "acting: log-probabilities": gap([row for r in ours.acting for row in r["logprobs"]], theirs["logprobs"], True),
            "acting: extrinsic values": gap([row for r in ours.acting for row in r["values"]], theirs["ext_values"], True),
            "intrinsic values": gap([row for r in ours.rollouts for row in r["int_values"]], theirs["int_values"], True),
            "intrinsic rewards": gap([row for r in ours.rollouts for row in r["curiosity"]], theirs["curiosity"], True)}


def compare(ours: Record, theirs: Record) -> dict[str, str]:
    verdicts = {"initial weights": gap(list(ours.initial.values()), list(theirs.initial.values()), False)}
    if list(ours.initial) != list(theirs.initial):
        verdicts["initial weights"] = "the parameters are named or ordered differently"
    for name in ("advantages", "returns", "int_returns"):
        verdicts[name] = gap([r[name].reshape(-1) for r in ours.rollouts], [r[name] for r in theirs.rollouts], True)
    verdicts["losses"] = gap(ours.losses, theirs.losses, True)
    for i, (mine, other) in enumerate(zip(ours.weights, theirs.weights), 1):
        verdicts[f"weights after iteration {i}"] = gap(mine, other, False)
    return verdicts


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    from loops.ppo_rnd import cleanrl_acting, cleanrl_replay

    ours = fleetrl_record(opts.env_id, opts.seed)
    acting = compare_acting(ours, cleanrl_acting(ours))
    return {**acting, **both_roundings(lambda fleetrl_rounding: compare(ours, cleanrl_replay(
        ours, opts.seed, fleetrl_advantages=fleetrl_rounding, fleetrl_logprobs=fleetrl_rounding, fleetrl_predictor_rows=fleetrl_rounding)))}


ALGO = Algo("ppo_rnd", "ppo_rnd_envpool.py", "BreakoutNoFrameskip-v4", {"lockstep": 0, "speed": 16_384},
            flags=lambda env_id, opts: ["--num-envs", str(opts.num_envs), "--num-steps", str(opts.num_steps),
                                        "--num-iterations-obs-norm-init", str(opts.obs_norm_init)],
            backend="envpool", their_env_id=lambda env_id: env_id.removeprefix("ALE/"), lockstep=lockstep, modes=("lockstep", "speed"),
            options=((("--num-envs",), dict(type=int, default=32)), (("--num-steps",), dict(type=int, default=128)),
                     (("--obs-norm-init",), dict(type=int, default=1, help="--num-iterations-obs-norm-init, both sides"))))
