"""CleanRL's c51.py loop (benchmarks/cleanrl/c51.py: its Args, network and schedule imported from it), in this process
with trace points and fleetrl's draws as switches; its changes are listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

import random

import numpy as np


def plain_c51(env_id: str, steps: int, learning_starts: int, seed: int = 1, numpy_draws: bool = False, fused_adam: bool = False,
              final_obs: bool = False, trace=None):
    """CleanRL's c51.py loop for ``steps`` env steps with its defaults (``numpy_draws``, ``fused_adam``: fleetrl's two
    differences of DQN's, as loops.offpolicy.plain_dqn takes them); ``trace`` (loops.offpolicy.Trace) records it.

    ``final_obs``: store the episode's final observation as a terminal transition's next observation, as fleetrl's buffer
    does (CleanRL's stores the next episode's first). The bootstrap is zeroed either way, but C51's projection still sums
    the next distribution's 101 probabilities onto the reward's atom, to 1 within rounding that depends on them: without
    this switch the targets of terminal transitions differ in their last bits (DQN's ``target_max * 0`` does not)."""
    import torch
    import torch.optim as optim

    from c51 import Args, QNetwork, linear_schedule  # CleanRL's, from its file (benchmarks/cleanrl/)
    from loops import offpolicy as po

    args = Args(env_id=env_id, total_timesteps=steps, learning_starts=learning_starts, seed=seed)
    trace = po.Trace() if trace is None else trace
    po._seed(args.seed)
    device = torch.device("cpu")
    envs = po.make_envs(args.env_id, args.seed)
    timing = po.Timing("c51", env_id, steps, learning_starts)
    q_network = QNetwork(envs, n_atoms=args.n_atoms, v_min=args.v_min, v_max=args.v_max).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=0.01 / args.batch_size, **({"fused": True} if fused_adam else {}))
    target_network = QNetwork(envs, n_atoms=args.n_atoms, v_min=args.v_min, v_max=args.v_max).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = po.ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
        draws = np.random.random((2, envs.num_envs)) if numpy_draws else None  # fleetrl's: explore, then which action
        if (draws[0, 0] if numpy_draws else random.random()) < epsilon:
            actions = ((draws[1] * envs.single_action_space.n).astype(np.int64) if numpy_draws else
                       np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)]))
        else:
            actions, pmf = q_network.get_action(torch.Tensor(obs).to(device))
            actions = actions.cpu().numpy()
        trace.actions.append(int(actions[0]))

        if final_obs:  # the transition fleetrl stores; its env step and episode records are CleanRL's
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            real_next_obs = next_obs.copy()
            for idx in np.flatnonzero(terminations | truncations):
                real_next_obs[idx] = infos["final_obs"][idx]
            rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
            obs = next_obs
        else:
            obs = po._step_and_store(envs, obs, actions, rb, timing)

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    _, next_pmfs = target_network.get_action(data.next_observations)
                    next_atoms = data.rewards + args.gamma * target_network.atoms * (1 - data.dones)
                    # projection
                    delta_z = target_network.atoms[1] - target_network.atoms[0]
                    tz = next_atoms.clamp(args.v_min, args.v_max)

                    b = (tz - args.v_min) / delta_z
                    l = b.floor().clamp(0, args.n_atoms - 1)  # noqa: E741 - CleanRL's name
                    u = b.ceil().clamp(0, args.n_atoms - 1)
                    d_m_l = (u + (l == u).float() - b) * next_pmfs
                    d_m_u = (b - l) * next_pmfs
                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])

                _, old_pmfs = q_network.get_action(data.observations, data.actions.flatten())
                loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(loss.item())

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())
                trace.target_steps.append(global_step)
    envs.close()
    trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
    return timing
