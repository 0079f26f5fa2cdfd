"""CleanRL's sac_atari.py loop, in this process with trace points and fleetrl's three differences as switches (its
networks, with the MLP for vector observations, imported from benchmarks/cleanrl/sac_atari.py); changes listed in
benchmarks/cleanrl/README.md."""

from __future__ import annotations

import copy

import numpy as np

from loops.offpolicy import Trace


def plain_sac_discrete(env_id: str, steps: int, learning_starts: int, seed: int = 1, fleetrl_draws: bool = False,
                       copied_targets: bool = False, fused_adam: bool = False) -> Trace:
    """CleanRL's sac_atari.py loop for ``steps`` env steps, its defaults but fleetrl's classic-control buffer and target
    cadence, with the switches above."""
    import torch
    import torch.nn.functional as F
    import torch.optim as optim

    from loops import offpolicy as plain_offpolicy
    from loops.offpolicy import ReplayBuffer, _seed, make_envs
    from sac_atari import Actor, Args, SoftQNetwork  # CleanRL's, from its file (benchmarks/cleanrl/)

    args = Args(env_id=env_id, total_timesteps=steps, learning_starts=learning_starts, seed=seed, buffer_size=100_000,
                target_network_frequency=500)
    trace = Trace()
    _seed(args.seed)
    device = torch.device("cpu")
    envs = make_envs(args.env_id, args.seed)
    timing = plain_offpolicy.Timing("sac_discrete", env_id, steps, learning_starts)

    actor = Actor(envs).to(device)
    qf1 = SoftQNetwork(envs).to(device)
    qf2 = SoftQNetwork(envs).to(device)
    if copied_targets:  # fleetrl: copies, drawing nothing
        qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
    else:
        qf1_target = SoftQNetwork(envs).to(device)
        qf2_target = SoftQNetwork(envs).to(device)
        qf1_target.load_state_dict(qf1.state_dict())
        qf2_target.load_state_dict(qf2.state_dict())
    fused = {"fused": True} if fused_adam else {}
    # TRY NOT TO MODIFY: eps=1e-4 increases numerical stability
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr, eps=1e-4, **fused)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.policy_lr, eps=1e-4, **fused)

    # Automatic entropy tuning
    if args.autotune:
        target_entropy = -args.target_entropy_scale * torch.log(1 / torch.tensor(envs.single_action_space.n))
        log_alpha = torch.zeros(1, requires_grad=True, device=device)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, eps=1e-4, **fused)
    else:
        alpha = args.alpha

    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        if global_step < args.learning_starts:
            if fleetrl_draws:  # fleetrl: numpy's global RNG (fleetrl.offpolicy.uniform_actions)
                actions = np.random.randint(envs.single_action_space.n, size=envs.num_envs)
            else:
                actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            actions, _, _ = actor.get_action(torch.Tensor(obs).to(device))
            actions = actions.detach().cpu().numpy()
        trace.actions.append(np.array(actions[0]))

        # TRY NOT TO MODIFY: execute the game and log data; save data to reply buffer; handle `final_observation`
        next_obs = plain_offpolicy._step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.update_frequency == 0:
                data = rb.sample(args.batch_size)
                # CRITIC training
                with torch.no_grad():
                    _, next_state_log_pi, next_state_action_probs = actor.get_action(data.next_observations)
                    qf1_next_target = qf1_target(data.next_observations)
                    qf2_next_target = qf2_target(data.next_observations)
                    # we can use the action probabilities instead of MC sampling to estimate the expectation
                    min_qf_next_target = next_state_action_probs * (
                        torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
                    )
                    # adapt Q-target for discrete Q-function
                    min_qf_next_target = min_qf_next_target.sum(dim=1)
                    next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (min_qf_next_target)

                # use Q-values only for the taken actions
                qf1_values = qf1(data.observations)
                qf2_values = qf2(data.observations)
                qf1_a_values = qf1_values.gather(1, data.actions.long()).view(-1)
                qf2_a_values = qf2_values.gather(1, data.actions.long()).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
                qf_loss = qf1_loss + qf2_loss
                trace.update_steps.append(global_step)
                trace.losses.append(qf_loss.item())

                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()

                # ACTOR training
                _, log_pi, action_probs = actor.get_action(data.observations)
                with torch.no_grad():
                    qf1_values = qf1(data.observations)
                    qf2_values = qf2(data.observations)
                    min_qf_values = torch.min(qf1_values, qf2_values)
                # no need for reparameterization, the expectation can be calculated for discrete actions
                actor_loss = (action_probs * ((alpha * log_pi) - min_qf_values)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(actor_loss.item())

                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                if args.autotune:
                    # reuse action probabilities for temperature loss
                    alpha_loss = (action_probs.detach() * (-log_alpha.exp() * (log_pi + target_entropy).detach())).mean()
                    trace.update_steps.append(global_step)
                    trace.losses.append(alpha_loss.item())

                    a_optimizer.zero_grad()
                    alpha_loss.backward()
                    a_optimizer.step()
                    alpha = log_alpha.exp().item()

            # update the target networks
            if global_step % args.target_network_frequency == 0:
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                trace.target_steps.append(global_step)

    envs.close()
    for name, network in dict(actor=actor, qf1=qf1, qf2=qf2, qf1_target=qf1_target, qf2_target=qf2_target).items():
        trace.final_params.update({f"{name}.{k}": v.clone() for k, v in network.state_dict().items()})
    return trace
