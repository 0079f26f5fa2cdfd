"""fleetrl's PPO-RND against CleanRL's ppo_rnd_envpool.py (issue 36): its networks and update code in lockstep, and speed.

    python benchmarks/ppo_rnd_vs_cleanrl.py --lockstep [--env-id BreakoutNoFrameskip-v4] [--seed 1]
    python benchmarks/ppo_rnd_vs_cleanrl.py --speed --env-id ALE/Breakout-v5 --num-envs 32 --steps 16384 --repeats 3

``--speed`` runs CleanRL's script (benchmarks/cleanrl/ppo_rnd_envpool.py, on EnvPool) and ``fleetrl train ppo_rnd`` (on
EnvPool too) side by side (benchmarks/cleanrl_side_by_side.py), with the same ``--num-envs``, ``--num-steps`` and
``--num-iterations-obs-norm-init``. CleanRL's SPS counts its random-action start (its clock starts before it) and
fleetrl's does not, so the wall-clock column, start-up included, is the like-for-like one.

``fleetrl.algos.ppo_rnd.train`` runs a short Atari job, recorded where its loop calls the curiosity: the initial
weights, each iteration's rollout (its extrinsic rewards and values, episode ends, intrinsic rewards and values, as
the curiosity computed them) and advantages, the observation statistics the predictor trained with, every minibatch
with the torch RNG state its loss started from, every loss, and the weights after each iteration. CleanRL's code, as
its file writes it (benchmarks/cleanrl/ppo_rnd_envpool.py: its Agent and RNDModel, its two-stream GAE, its
minibatch loss and step), then runs on the same inputs, in the same order, from the same seed. It reports where the
two part and by how much. The initial weights are identical (the same seed makes the same networks) and so are the
advantages; the update is identical given fleetrl's rounding of two quantities (the log-probabilities without
``torch.distributions``, and the advantages' normalisation in float64), and otherwise differs by rounding only.
tests/test_ppo_rnd.py bounds it in ``make test``.

Not compared here: the intrinsic rewards' scaling, where fleetrl's running discount goes along each env's steps and
CleanRL's along the envs (docs/algorithms.md), and the random-action start of the statistics (the envs differ).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cleanrl_side_by_side as side_by_side  # noqa: E402
from cleanrl_side_by_side import gap  # noqa: E402

# a short job: 3 iterations of 4 envs x 32 steps, 2 minibatches, 2 epochs, the statistics started by 1 random rollout
LOCKSTEP = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, num_iterations_obs_norm_init=1, total_timesteps=3 * 4 * 32)


@dataclass
class Record:
    initial: dict[str, Any] = field(default_factory=dict)
    warmup_batches: list[np.ndarray] = field(default_factory=list)  # the random-action start's newest frames, a batch a rollout
    warmup_stats: tuple[np.ndarray, np.ndarray] | None = None  # the observation statistics after it: (mean, var)
    acting: list[dict[str, Any]] = field(default_factory=list)  # per rollout: what acted, on what, and what it computed
    rollouts: list[dict[str, np.ndarray]] = field(default_factory=list)  # the advantage's inputs and outputs
    obs_stats: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # after each rollout: (mean, var)
    minibatches: list[tuple[dict[str, Any], Any]] = field(default_factory=list)  # (minibatch, torch RNG state before its loss)
    losses: list[float] = field(default_factory=list)
    weights: list[list[Any]] = field(default_factory=list)  # after each iteration's update


def fleetrl_record(env_id: str, seed: int) -> Record:
    """fleetrl's PPO-RND on ``LOCKSTEP``'s job, recorded where its loop calls the curiosity."""
    import torch

    from fleetrl import checkpoint
    from fleetrl.algos import ppo_rnd
    from fleetrl.sampling.normalize import RunningMeanStd

    record = Record()
    curiosity = ppo_rnd.Curiosity
    real = (curiosity.__init__, curiosity.advantage, curiosity.loss)

    def record_init(self, run, agent, *args):
        record.initial = {k: v.clone() for k, v in agent.state_dict().items()}
        update = RunningMeanStd.update

        def keep(rms, batch, allreduce=None):  # only the random-action start updates statistics here
            record.warmup_batches.append(np.array(batch))
            return update(rms, batch, allreduce)

        RunningMeanStd.update = keep
        try:
            real[0](self, run, agent, *args)
        finally:
            RunningMeanStd.update = update
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

    curiosity.__init__, curiosity.advantage, curiosity.loss = record_init, record_advantage, record_loss
    try:
        with tempfile.TemporaryDirectory() as runs:
            run_dir = os.path.join(runs, "run")
            ppo_rnd.train(ppo_rnd.Args(env_id=env_id, seed=seed, torch_threads=1, cuda=False, env_backend="ale", progress=False,
                                       precision="fp32", memory_format="contiguous", actor_device="cpu", run_dir=run_dir, **LOCKSTEP))
            model = checkpoint.load_checkpoint(run_dir)["model"]
    finally:
        curiosity.__init__, curiosity.advantage, curiosity.loss = real
    record.weights.append([model[k] for k, v in record.initial.items() if not k.startswith("rnd.target.")])
    return record


def cleanrl_replay(ours: Record, seed: int, fused_adam: bool = True, fleetrl_advantages: bool = False, fleetrl_logprobs: bool = False,
                   fleetrl_predictor_rows: bool = False) -> Record:
    """CleanRL's ppo_rnd_envpool.py code on fleetrl's rollouts: its GAE over both streams from the same rewards and
    values, and its minibatch loss and step on fleetrl's minibatches, each from the same torch RNG state (its update
    mask). ``fused_adam``: fleetrl's deliberate difference (one kernel for all parameters). Three switches give it
    fleetrl's rounding: ``fleetrl_advantages`` (``Dist.normalize``), ``fleetrl_logprobs``
    (``fleetrl.nets.categorical_logprob_entropy``) and ``fleetrl_predictor_rows`` (the predictor run on the masked rows
    only: the same terms, grouped otherwise in its sums)."""
    from types import SimpleNamespace

    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim

    from fleetrl.distributed import Dist
    from fleetrl.nets import categorical_logprob_entropy

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from ppo_rnd_envpool import Agent, Args, RNDModel  # CleanRL's, from its file (benchmarks/cleanrl/)

    args = Args(seed=seed, env_id="", **{k: v for k, v in LOCKSTEP.items()})
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    num_updates = args.total_timesteps // args.batch_size
    device = torch.device("cpu")
    envs = SimpleNamespace(single_action_space=gym.spaces.Discrete(len(ours.initial["actor.2.bias"])))
    theirs = Record()
    torch.manual_seed(seed)  # TRY NOT TO MODIFY: seeding (fleetrl's run seeds torch alike before it makes its agent)
    agent = Agent(envs).to(device)
    rnd_model = RNDModel(4, envs.single_action_space.n).to(device)
    theirs.initial = {k: v.clone() for k, v in [*agent.state_dict().items(), *((f"rnd.{k}", v) for k, v in rnd_model.state_dict().items())]}
    combined_parameters = list(agent.parameters()) + list(rnd_model.predictor.parameters())
    optimizer = optim.Adam(combined_parameters, lr=args.learning_rate, eps=1e-5, **({"fused": True} if fused_adam else {}))  # fleetrl: fused
    minibatches = iter(ours.minibatches)

    for update, (rollout, (mean, var)) in enumerate(zip(ours.rollouts, ours.obs_stats), 1):
        frac = 1.0 - (update - 1.0) / num_updates
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # bootstrap value if not done (fleetrl's dones[t] ends transition t; CleanRL's dones[t] began step t)
        rewards, ext_values = torch.from_numpy(rollout["rewards"]), torch.from_numpy(rollout["values"])
        curiosity_rewards = torch.from_numpy(rollout["curiosity"]) / np.sqrt(rollout["reward_var"])
        int_values = torch.from_numpy(rollout["int_values"])
        dones = torch.zeros_like(rewards)
        dones[1:] = torch.from_numpy(rollout["dones"][:-1].astype(np.float32))
        next_done = torch.from_numpy(rollout["dones"][-1].astype(np.float32))
        next_value_ext = torch.from_numpy(rollout["last_values"]).reshape(1, -1)
        next_value_int = torch.from_numpy(rollout["next_value_int"]).reshape(1, -1)
        with torch.no_grad():
            ext_advantages = torch.zeros_like(rewards, device=device)
            int_advantages = torch.zeros_like(curiosity_rewards, device=device)
            ext_lastgaelam = 0
            int_lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    ext_nextnonterminal = 1.0 - next_done
                    int_nextnonterminal = 1.0
                    ext_nextvalues = next_value_ext
                    int_nextvalues = next_value_int
                else:
                    ext_nextnonterminal = 1.0 - dones[t + 1]
                    int_nextnonterminal = 1.0
                    ext_nextvalues = ext_values[t + 1]
                    int_nextvalues = int_values[t + 1]
                ext_delta = rewards[t] + args.gamma * ext_nextvalues * ext_nextnonterminal - ext_values[t]
                int_delta = curiosity_rewards[t] + args.int_gamma * int_nextvalues * int_nextnonterminal - int_values[t]
                ext_advantages[t] = ext_lastgaelam = (
                    ext_delta + args.gamma * args.gae_lambda * ext_nextnonterminal * ext_lastgaelam
                )
                int_advantages[t] = int_lastgaelam = (
                    int_delta + args.int_gamma * args.gae_lambda * int_nextnonterminal * int_lastgaelam
                )
            ext_returns = ext_advantages + ext_values
            int_returns = int_advantages + int_values
        b_advantages = int_advantages.reshape(-1) * args.int_coef + ext_advantages.reshape(-1) * args.ext_coef
        theirs.rollouts.append(dict(advantages=b_advantages.numpy(), returns=ext_returns.reshape(-1).numpy(),
                                    int_returns=int_returns.reshape(-1).numpy()))

        for epoch in range(args.update_epochs):
            for start in range(0, args.batch_size, args.minibatch_size):
                mb, rng_state = next(minibatches)  # fleetrl's minibatch, in its order, and the RNG its loss began with
                torch.set_rng_state(rng_state)
                b_obs = mb["obs"].float()
                rnd_next_obs = (
                    (
                        (b_obs[:, 3, :, :].reshape(-1, 1, 84, 84) - torch.from_numpy(mean).to(device))
                        / torch.sqrt(torch.from_numpy(var).to(device))
                    ).clip(-5, 5)
                ).float()

                if fleetrl_predictor_rows:  # fleetrl: the predictor runs on the rows its loss keeps (the same terms, summed otherwise)
                    mask = torch.rand(len(rnd_next_obs), device=device)
                    mask = (mask < args.update_proportion).type(torch.FloatTensor).to(device)
                    rows = mask.nonzero().squeeze(1) if mask.any() else mask.new_zeros(1, dtype=torch.long)
                    # the target on the whole minibatch as CleanRL runs it (fleetrl's: on minibatch-sized chunks, the same shapes)
                    predict_next_state_feature, target_next_state_feature = rnd_model.predictor(rnd_next_obs[rows]), rnd_model.target(rnd_next_obs)[rows]
                    forward_loss = F.mse_loss(
                        predict_next_state_feature, target_next_state_feature.detach(), reduction="none"
                    ).mean(-1)
                    forward_loss = (forward_loss * mask[rows]).sum() / torch.max(
                        mask.sum(), torch.tensor([1], device=device, dtype=torch.float32)
                    )
                else:
                    predict_next_state_feature, target_next_state_feature = rnd_model(rnd_next_obs)
                    forward_loss = F.mse_loss(
                        predict_next_state_feature, target_next_state_feature.detach(), reduction="none"
                    ).mean(-1)

                    mask = torch.rand(len(forward_loss), device=device)
                    mask = (mask < args.update_proportion).type(torch.FloatTensor).to(device)
                    forward_loss = (forward_loss * mask).sum() / torch.max(
                        mask.sum(), torch.tensor([1], device=device, dtype=torch.float32)
                    )
                if fleetrl_logprobs:  # fleetrl: the same quantities, computed as fleetrl.nets computes them
                    hidden = agent.network(b_obs / 255.0)
                    features = agent.extra_layer(hidden)
                    newlogprob, entropy = categorical_logprob_entropy(agent.actor(hidden), mb["actions"])
                    new_ext_values, new_int_values = agent.critic_ext(features + hidden), agent.critic_int(features + hidden)
                else:
                    _, newlogprob, entropy, new_ext_values, new_int_values = agent.get_action_and_value(
                        b_obs, mb["actions"].long()
                    )
                logratio = newlogprob - mb["logprobs"]
                ratio = logratio.exp()

                mb_advantages = mb["advantages"]
                if args.norm_adv:
                    if fleetrl_advantages:
                        mb_advantages = Dist().normalize(mb_advantages)
                    else:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                new_ext_values, new_int_values = new_ext_values.view(-1), new_int_values.view(-1)
                if args.clip_vloss:
                    ext_v_loss_unclipped = (new_ext_values - mb["returns"]) ** 2
                    ext_v_clipped = mb["values"] + torch.clamp(
                        new_ext_values - mb["values"],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    ext_v_loss_clipped = (ext_v_clipped - mb["returns"]) ** 2
                    ext_v_loss_max = torch.max(ext_v_loss_unclipped, ext_v_loss_clipped)
                    ext_v_loss = 0.5 * ext_v_loss_max.mean()
                else:
                    ext_v_loss = 0.5 * ((new_ext_values - mb["returns"]) ** 2).mean()

                int_v_loss = 0.5 * ((new_int_values - mb["int_returns"]) ** 2).mean()
                v_loss = ext_v_loss + int_v_loss
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + forward_loss
                theirs.losses.append(loss.item())

                optimizer.zero_grad()
                loss.backward()
                if args.max_grad_norm:
                    nn.utils.clip_grad_norm_(
                        combined_parameters,
                        args.max_grad_norm,
                    )
                optimizer.step()
        theirs.weights.append([p.detach().clone() for p in combined_parameters])
    return theirs


def cleanrl_acting(ours: Record) -> dict[str, list]:
    """CleanRL's start and acting code on fleetrl's observations: its random-action start's statistics from the same
    frames, and for each rollout, at the weights that acted, step by step as its loop does: the values, the
    log-probability of the action fleetrl took (the actions themselves are drawn from each side's own RNG), and the
    intrinsic reward of the next observation with the statistics as they stood."""
    from types import SimpleNamespace

    import gymnasium as gym
    import torch
    from gymnasium.wrappers.utils import RunningMeanStd

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from ppo_rnd_envpool import Agent, RNDModel  # CleanRL's, from its file (benchmarks/cleanrl/)

    obs_rms = RunningMeanStd(shape=(1, 1, 84, 84))
    for next_ob in ours.warmup_batches:  # CleanRL: obs_rms.update(np.stack(next_ob)) once a rollout's worth
        obs_rms.update(next_ob)
    n = len(ours.initial["actor.2.bias"])
    agent, rnd_model = Agent(SimpleNamespace(single_action_space=gym.spaces.Discrete(n))), RNDModel(4, n)
    theirs: dict[str, list] = {"warmup": [obs_rms.mean.reshape(-1), obs_rms.var.reshape(-1)], "logprobs": [], "ext_values": [],
                               "int_values": [], "curiosity": []}
    for rollout in ours.acting:
        agent.load_state_dict({k: v for k, v in rollout["weights"].items() if not k.startswith("rnd.")})
        rnd_model.load_state_dict({k.removeprefix("rnd."): v for k, v in rollout["weights"].items() if k.startswith("rnd.")})
        mean, var = rollout["obs_stats"]
        for step in range(len(rollout["obs"])):
            obs, next_obs = torch.Tensor(rollout["obs"][step]), torch.Tensor(rollout["next_obs"][step])
            with torch.no_grad():
                value_ext, value_int = agent.get_value(obs)
                _, logprob, _, _, _ = agent.get_action_and_value(obs, torch.as_tensor(rollout["actions"][step]))
                rnd_next_obs = (((next_obs.reshape(len(obs), 1, 84, 84) - torch.from_numpy(mean)) / torch.sqrt(torch.from_numpy(var)))
                                .clip(-5, 5)).float()
                target_next_feature = rnd_model.target(rnd_next_obs)
                predict_next_feature = rnd_model.predictor(rnd_next_obs)
            theirs["logprobs"].append(logprob.numpy())
            theirs["ext_values"].append(value_ext.flatten().numpy())
            theirs["int_values"].append(value_int.flatten().numpy())
            theirs["curiosity"].append(((target_next_feature - predict_next_feature).pow(2).sum(1) / 2).numpy())
    return theirs


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
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_record(opts.env_id, opts.seed)
    acting = compare_acting(ours, cleanrl_acting(ours))
    side_by_side.print_verdicts(f"lockstep (the start and the acting), {opts.env_id}, seed {opts.seed}: CleanRL's code on fleetrl's "
                                f"observations and actions, at the weights and statistics that acted:", acting)
    verdicts = side_by_side.both_roundings(
        f"lockstep (the networks and the update code), {opts.env_id}, seed {opts.seed}, {LOCKSTEP}",
        lambda fleetrl_rounding: compare(ours, cleanrl_replay(ours, opts.seed, fleetrl_advantages=fleetrl_rounding, fleetrl_logprobs=fleetrl_rounding,
                                                              fleetrl_predictor_rows=fleetrl_rounding)))
    return {**acting, **verdicts}


# ============================================================================ subprocess runs: speed
def budget(env_id: str, opts: argparse.Namespace) -> list[str]:
    return ["--num-envs", str(opts.num_envs), "--num-steps", str(opts.num_steps), "--num-iterations-obs-norm-init", str(opts.obs_norm_init)]


SIDES = side_by_side.Sides("ppo_rnd", os.path.join(HERE, "cleanrl", "ppo_rnd_envpool.py"), "ppo_rnd_envpool.py", budget, backend="envpool",
                           their_env_id=lambda env_id: env_id.removeprefix("ALE/"))


def main() -> None:
    parser = side_by_side.parser(__doc__, "BreakoutNoFrameskip-v4", 16384, 0, "ppo_rnd_vs_cleanrl")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--obs-norm-init", type=int, default=1, help="--num-iterations-obs-norm-init, both sides")
    opts = parser.parse_args()
    if opts.lockstep:
        lockstep(opts)
    elif opts.speed:
        side_by_side.speed(SIDES, opts)
    else:
        sys.exit("--learn: not in this harness (the issue asks one long Montezuma's Revenge run: fleetrl train ppo_rnd)")


if __name__ == "__main__":
    main()
