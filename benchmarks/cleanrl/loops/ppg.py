"""CleanRL's ppg_procgen.py update code (its policy phase, rollout storage and auxiliary phase; its Agent from
benchmarks/cleanrl/ppg_procgen.py), replayed in this process on fleetrl's recorded batches and orders; the changes are
listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# a short job: 2 phases of 2 iterations, 4 envs x 32 steps, 2 minibatches, 2 auxiliary epochs of 2-rollout minibatches
LOCKSTEP = dict(num_envs=4, num_steps=32, num_minibatches=2, n_iteration=2, e_auxiliary=2, num_aux_rollouts=2, total_timesteps=4 * 32 * 4)


@dataclass
class Record:
    """One side's run: the initial weights, each iteration's batch, raw advantages and minibatch order, each auxiliary
    epoch's rollout order, every optimiser step's loss, and the weights after each phase."""

    initial: dict[str, Any] = field(default_factory=dict)
    batches: list[dict[str, Any]] = field(default_factory=list)
    raw_advantages: list[Any] = field(default_factory=list)
    normalized_advantages: list[Any] = field(default_factory=list)
    orders: list[Any] = field(default_factory=list)
    aux_orders: list[np.ndarray] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    aux_losses: list[float] = field(default_factory=list)
    phase_weights: list[list[Any]] = field(default_factory=list)


def cleanrl_replay(ours: Record, seed: int, fused_adam: bool = True, zeroed_aux_grads: bool = True, fleetrl_advantages: bool = False,
                   fleetrl_logprobs: bool = False) -> Record:
    """CleanRL's ppg_procgen.py update code on fleetrl's batches, in fleetrl's orders: its policy phase, rollout
    storage and auxiliary phase as its file writes them, with the switches above. Two more give it fleetrl's rounding:
    ``fleetrl_advantages`` (fleetrl's normalised advantages) and ``fleetrl_logprobs`` (log-probabilities and entropy by
    ``fleetrl.nets.categorical_logprob_entropy``)."""
    from types import SimpleNamespace

    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.optim as optim
    from torch import distributions as td
    from torch.distributions.categorical import Categorical

    from ppg_procgen import Agent, Args, flatten01, unflatten01  # CleanRL's, from its file (benchmarks/cleanrl/)

    args = Args(seed=seed, **{k: v for k, v in LOCKSTEP.items()})
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    args.num_phases = int(args.num_iterations // args.n_iteration)
    args.aux_batch_rollouts = int(args.num_envs * args.n_iteration)
    obs_shape = tuple(ours.batches[0]["obs"].shape[1:])
    envs = SimpleNamespace(single_observation_space=gym.spaces.Box(0, 255, obs_shape, np.uint8),
                           single_action_space=gym.spaces.Discrete(len(ours.initial["actor.bias"])))
    theirs = Record()
    torch.manual_seed(seed)  # TRY NOT TO MODIFY: seeding (fleetrl's run seeds torch alike before it makes its agent)
    agent = Agent(envs)
    if fleetrl_logprobs:  # fleetrl: the same quantities, computed as fleetrl.nets computes them
        from fleetrl.nets import categorical_logprob_entropy

        def get_action_and_value(x, action):
            hidden = agent.network(x / 255.0)
            logprob, entropy = categorical_logprob_entropy(agent.actor(hidden), action)
            return action, logprob, entropy, agent.critic(hidden.detach())

        agent.get_action_and_value = get_action_and_value
    theirs.initial = dict(zip(ours.initial, (p.detach().clone() for p in agent.state_dict().values())))
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-8, **({"fused": True} if fused_adam else {}))
    aux_obs = torch.zeros((args.num_steps, args.aux_batch_rollouts) + obs_shape, dtype=torch.uint8)  # Saves lot system RAM
    aux_returns = torch.zeros((args.num_steps, args.aux_batch_rollouts))
    iteration, aux_epoch = 0, 0
    for phase in range(1, args.num_phases + 1):
        # POLICY PHASE
        for update in range(1, args.n_iteration + 1):
            batch = ours.batches[iteration]
            b_obs, b_actions, b_logprobs = batch["obs"].float(), batch["actions"], batch["logprobs"]
            b_returns, b_values = batch["returns"], batch["values"]
            b_advantages = ours.raw_advantages[iteration]
            # PPG code does full batch advantage normalization
            if args.adv_norm_fullbatch:
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
            if fleetrl_advantages:  # fleetrl: its float64 statistics (over all ranks)
                b_advantages = ours.normalized_advantages[iteration]

            # Optimizing the policy and value network
            for epoch in range(args.e_policy):
                b_inds = ours.orders[iteration].numpy()  # fleetrl: its minibatch order (torch's RNG, not numpy's shuffle)
                for start in range(0, args.batch_size, args.minibatch_size):
                    end = start + args.minibatch_size
                    mb_inds = b_inds[start:end]

                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    mb_advantages = b_advantages[mb_inds]

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    newvalue = newvalue.view(-1)
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                    theirs.losses.append(loss.item())

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            # PPG Storage - Rollouts are saved without flattening for sampling full rollouts later:
            storage_slice = slice(args.num_envs * (update - 1), args.num_envs * update)
            aux_obs[:, storage_slice] = unflatten01(batch["obs"], (args.num_steps, args.num_envs))
            aux_returns[:, storage_slice] = unflatten01(b_returns, (args.num_steps, args.num_envs))
            iteration += 1

        # AUXILIARY PHASE
        aux_inds = np.arange(args.aux_batch_rollouts)

        # Build the old policy on the aux buffer before distilling to the network
        aux_pi = torch.zeros((args.num_steps, args.aux_batch_rollouts, envs.single_action_space.n))
        for i, start in enumerate(range(0, args.aux_batch_rollouts, args.num_aux_rollouts)):
            end = start + args.num_aux_rollouts
            aux_minibatch_ind = aux_inds[start:end]
            m_aux_obs = aux_obs[:, aux_minibatch_ind].to(torch.float32)
            m_obs_shape = m_aux_obs.shape
            m_aux_obs = flatten01(m_aux_obs)
            with torch.no_grad():
                pi_logits = agent.get_pi(m_aux_obs).logits.cpu().clone()
            aux_pi[:, aux_minibatch_ind] = unflatten01(pi_logits, m_obs_shape[:2])

        if zeroed_aux_grads:  # fleetrl: the policy phase's last gradients are not carried into the first auxiliary step
            optimizer.zero_grad()
        for auxiliary_update in range(1, args.e_auxiliary + 1):
            aux_inds = ours.aux_orders[aux_epoch].copy()  # fleetrl: its order (CleanRL: np.random.shuffle(aux_inds))
            aux_epoch += 1
            for i, start in enumerate(range(0, args.aux_batch_rollouts, args.num_aux_rollouts)):
                end = start + args.num_aux_rollouts
                aux_minibatch_ind = aux_inds[start:end]
                m_aux_obs = aux_obs[:, aux_minibatch_ind]
                m_aux_obs = flatten01(m_aux_obs)  # Sample full rollouts for PPG instead of random indexes
                m_aux_returns = aux_returns[:, aux_minibatch_ind].to(torch.float32)
                m_aux_returns = flatten01(m_aux_returns)

                new_pi, new_values, new_aux_values = agent.get_pi_value_and_aux_value(m_aux_obs)

                new_values = new_values.view(-1)
                new_aux_values = new_aux_values.view(-1)
                old_pi_logits = flatten01(aux_pi[:, aux_minibatch_ind])
                old_pi = Categorical(logits=old_pi_logits)
                kl_loss = td.kl_divergence(old_pi, new_pi).mean()

                real_value_loss = 0.5 * ((new_values - m_aux_returns) ** 2).mean()
                aux_value_loss = 0.5 * ((new_aux_values - m_aux_returns) ** 2).mean()
                joint_loss = aux_value_loss + args.beta_clone * kl_loss

                loss = (joint_loss + real_value_loss) / args.n_aux_grad_accum
                theirs.aux_losses.append(loss.item())
                loss.backward()

                if (i + 1) % args.n_aux_grad_accum == 0:
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()  # This cannot be outside, else gradients won't accumulate
        theirs.phase_weights.append([p.detach().clone() for p in agent.parameters()])
    return theirs
