"""CleanRL's ppo_rnd_envpool.py start, acting and update code (its Agent and RNDModel from
benchmarks/cleanrl/ppo_rnd_envpool.py), replayed in this process on fleetrl's recorded rollouts and minibatches; the
changes are listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
