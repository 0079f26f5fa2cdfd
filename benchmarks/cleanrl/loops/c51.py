"""CleanRL's c51.py loop (benchmarks/cleanrl/c51.py), in this process with trace points and fleetrl's draws as
switches; its changes are listed in benchmarks/cleanrl/README.md."""

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
    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.optim as optim

    from loops import offpolicy as po

    lr, n_atoms, v_min, v_max, buffer_size, gamma = 2.5e-4, 101, -100, 100, 10_000, 0.99
    target_network_frequency, batch_size, start_e, end_e, exploration_fraction, train_frequency = 500, 128, 1, 0.05, 0.5, 10

    class QNetwork(nn.Module):  # CleanRL's, as c51.py writes it
        def __init__(self, env, n_atoms=101, v_min=-100, v_max=100):
            super().__init__()
            self.env = env
            self.n_atoms = n_atoms
            self.register_buffer("atoms", torch.linspace(v_min, v_max, steps=n_atoms))
            self.n = env.single_action_space.n
            self.network = nn.Sequential(nn.Linear(np.array(env.single_observation_space.shape).prod(), 120), nn.ReLU(),
                                         nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, self.n * n_atoms))

        def get_action(self, x, action=None):
            logits = self.network(x)
            # probability mass function for each action
            pmfs = torch.softmax(logits.view(len(x), self.n, self.n_atoms), dim=2)
            q_values = (pmfs * self.atoms).sum(2)
            if action is None:
                action = torch.argmax(q_values, 1)
            return action, pmfs[torch.arange(len(x)), action]

    po._seed(seed)
    envs = po.make_envs(env_id, seed)
    timing = po.Timing("c51", env_id, steps, learning_starts)
    q_network = QNetwork(envs, n_atoms=n_atoms, v_min=v_min, v_max=v_max)
    optimizer = optim.Adam(q_network.parameters(), lr=lr, eps=0.01 / batch_size, **({"fused": True} if fused_adam else {}))
    target_network = QNetwork(envs, n_atoms=n_atoms, v_min=v_min, v_max=v_max)
    target_network.load_state_dict(q_network.state_dict())
    rb = po.ReplayBuffer(buffer_size, envs.single_observation_space, envs.single_action_space, "cpu")

    obs, _ = envs.reset(seed=seed)
    for global_step in range(steps):
        epsilon = po.linear_schedule(start_e, end_e, exploration_fraction * steps, global_step)
        draws = np.random.random((2, envs.num_envs)) if numpy_draws else None
        if (draws[0, 0] if numpy_draws else random.random()) < epsilon:
            actions = ((draws[1] * envs.single_action_space.n).astype(np.int64) if numpy_draws else
                       np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)]))
        else:
            actions, pmf = q_network.get_action(torch.Tensor(obs))
            actions = actions.cpu().numpy()
        if trace is not None:
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

        if global_step > learning_starts:
            if global_step % train_frequency == 0:
                data = rb.sample(batch_size)
                with torch.no_grad():
                    _, next_pmfs = target_network.get_action(data.next_observations)
                    next_atoms = data.rewards + gamma * target_network.atoms * (1 - data.dones)
                    # projection
                    delta_z = target_network.atoms[1] - target_network.atoms[0]
                    tz = next_atoms.clamp(v_min, v_max)

                    b = (tz - v_min) / delta_z
                    l = b.floor().clamp(0, n_atoms - 1)  # noqa: E741 - CleanRL's name
                    u = b.ceil().clamp(0, n_atoms - 1)
                    d_m_l = (u + (l == u).float() - b) * next_pmfs
                    d_m_u = (b - l) * next_pmfs
                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])

                _, old_pmfs = q_network.get_action(data.observations, data.actions.flatten())
                loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
                if trace is not None:
                    trace.update_steps.append(global_step)
                    trace.losses.append(loss.item())

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if global_step % target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())
                if trace is not None:
                    trace.target_steps.append(global_step)
    envs.close()
    if trace is not None:
        trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
    return timing
