"""CleanRL's ddpg_continuous_action.py loop, in this process with trace points and fleetrl's three differences as
switches (its networks imported from benchmarks/cleanrl/ddpg_continuous_action.py); changes listed in
benchmarks/cleanrl/README.md."""

from __future__ import annotations

import copy

import numpy as np

from loops.offpolicy import Trace


def plain_ddpg(env_id: str, steps: int, learning_starts: int, seed: int = 1, trace: Trace | None = None, fleetrl_draws: bool = False,
               copied_targets: bool = False, fused_adam: bool = False) -> Trace:
    """CleanRL's ddpg_continuous_action.py loop for ``steps`` env steps (its defaults), with the switches above."""
    import torch
    import torch.nn.functional as F
    import torch.optim as optim

    from ddpg_continuous_action import Actor, Args, QNetwork  # CleanRL's, from its file (benchmarks/cleanrl/)
    from loops import offpolicy as plain_offpolicy
    from loops.offpolicy import ReplayBuffer, _seed, make_envs

    args = Args(env_id=env_id, total_timesteps=steps, learning_starts=learning_starts, seed=seed)
    trace = Trace() if trace is None else trace
    _seed(args.seed)
    device = torch.device("cpu")
    envs = make_envs(args.env_id, args.seed)
    timing = plain_offpolicy.Timing("ddpg", env_id, steps, learning_starts)

    actor = Actor(envs).to(device)
    qf1 = QNetwork(envs).to(device)
    if copied_targets:  # fleetrl: copies, drawing nothing
        qf1_target, target_actor = copy.deepcopy(qf1), copy.deepcopy(actor)
    else:
        qf1_target = QNetwork(envs).to(device)
        target_actor = Actor(envs).to(device)
        target_actor.load_state_dict(actor.state_dict())
        qf1_target.load_state_dict(qf1.state_dict())
    fused = {"fused": True} if fused_adam else {}
    q_optimizer = optim.Adam(list(qf1.parameters()), lr=args.learning_rate, **fused)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate, **fused)

    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    space = envs.single_action_space
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        if global_step < args.learning_starts:
            if fleetrl_draws:  # fleetrl: numpy's global RNG (fleetrl.offpolicy.uniform_actions)
                actions = np.random.uniform(space.low, space.high, (envs.num_envs, *space.low.shape)).astype(space.dtype)
            else:
                actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(envs.single_action_space.low, envs.single_action_space.high)
        trace.actions.append(np.array(actions[0]))

        # TRY NOT TO MODIFY: execute the game and log data; save data to reply buffer; handle `final_observation`
        next_obs = plain_offpolicy._step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                next_state_actions = target_actor(data.next_observations)
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (qf1_next_target).view(-1)

            qf1_a_values = qf1(data.observations, data.actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
            trace.update_steps.append(global_step)
            trace.losses.append(qf1_loss.item())

            # optimize the model
            q_optimizer.zero_grad()
            qf1_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(actor_loss.item())
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                # update the target network
                for param, target_param in zip(actor.parameters(), target_actor.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                trace.target_steps.append(global_step)

    envs.close()
    trace.final_params = {**{f"actor.{k}": v.clone() for k, v in actor.state_dict().items()},
                          **{f"qf1.{k}": v.clone() for k, v in qf1.state_dict().items()},
                          **{f"target_actor.{k}": v.clone() for k, v in target_actor.state_dict().items()},
                          **{f"qf1_target.{k}": v.clone() for k, v in qf1_target.state_dict().items()}}
    return trace
