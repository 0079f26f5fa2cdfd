"""CleanRL's rainbow_atari.py loop, in this process with trace points (its NoisyLinear, network and
PrioritizedReplayBuffer from benchmarks/cleanrl/rainbow_atari.py), and EndlessWalk-v0, the env the lockstep runs on;
the changes are listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

from loops.offpolicy import Trace

# the hyperparameters both loops of the lockstep use: fleetrl's classic-control defaults for Rainbow
LOCKSTEP = dict(learning_rate=2.5e-4, buffer_size=10_000, gamma=0.99, target_network_frequency=500, batch_size=128,
                train_frequency=10, n_step=3, prioritized_replay_alpha=0.5, prioritized_replay_beta=0.4,
                prioritized_replay_eps=1e-6, n_atoms=101, v_min=-100.0, v_max=100.0)


class EndlessWalkEnv(gym.Env):
    """A 4-D state drifting with the action (left or right on its first axis), noise from the env's seeded RNG, a
    reward that is the first coordinate (rounded to float32, so float64 sums of it are the same however stored), and no
    episode end."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.state = np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        push = np.array([1.0 if action == 1 else -1.0, 0.5, -0.5, 0.0], np.float32)
        self.state = (0.9 * self.state + 0.1 * push + 0.1 * self.np_random.standard_normal(4)).astype(np.float32)
        return self.state.copy(), float(np.float32(self.state[0])), False, False, {}


if "EndlessWalk-v0" not in gym.registry:  # (run as a script, this module is imported a second time under its name)
    gym.register("EndlessWalk-v0", entry_point=EndlessWalkEnv)


def plain_rainbow(env_id: str, steps: int, learning_starts: int, seed: int, trace: Trace) -> None:
    """CleanRL's rainbow_atari.py loop for ``steps`` env steps with LOCKSTEP's hyperparameters and the module
    docstring's three changes; ``trace`` records it."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim

    import rainbow_atari
    from loops import offpolicy as po
    from rainbow_atari import NoisyLinear, PrioritizedReplayBuffer

    args = argparse.Namespace(seed=seed, total_timesteps=steps, learning_starts=learning_starts, tau=1.0, **LOCKSTEP)

    class NoisyDuelingDistributionalNetwork(rainbow_atari.NoisyDuelingDistributionalNetwork):
        """CleanRL's network with fleetrl's classic-control trunk for the CNN, and no /255 (vector observations)."""

        def __init__(self, env, n_atoms, v_min, v_max):
            nn.Module.__init__(self)
            self.n_atoms = n_atoms
            self.v_min = v_min
            self.v_max = v_max
            self.delta_z = (v_max - v_min) / (n_atoms - 1)
            self.n_actions = env.single_action_space.n
            self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms))
            self.network = nn.Sequential(nn.Linear(int(np.prod(env.single_observation_space.shape)), 120), nn.ReLU())
            self.value_head = nn.Sequential(NoisyLinear(120, 84), nn.ReLU(), NoisyLinear(84, n_atoms))
            self.advantage_head = nn.Sequential(NoisyLinear(120, 84), nn.ReLU(), NoisyLinear(84, n_atoms * self.n_actions))

        def forward(self, x):
            h = self.network(x)
            value = self.value_head(h).view(-1, 1, self.n_atoms)
            advantage = self.advantage_head(h).view(-1, self.n_actions, self.n_atoms)
            q_atoms = value + advantage - advantage.mean(dim=1, keepdim=True)
            q_dist = F.softmax(q_atoms, dim=2)
            return q_dist

    po._seed(seed)
    device = torch.device("cpu")
    envs = po.make_envs(env_id, seed)
    q_network = NoisyDuelingDistributionalNetwork(envs, args.n_atoms, args.v_min, args.v_max).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=1.5e-4, fused=True)
    target_network = NoisyDuelingDistributionalNetwork(envs, args.n_atoms, args.v_min, args.v_max).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = PrioritizedReplayBuffer(
        args.buffer_size,
        envs.single_observation_space.shape,
        device,
        args.n_step,
        args.gamma,
        args.prioritized_replay_alpha,
        args.prioritized_replay_beta,
        args.prioritized_replay_eps,
    )
    rb.buffer_obs = np.zeros((args.buffer_size, *envs.single_observation_space.shape), np.float32)  # uint8 frames in CleanRL
    rb.buffer_next_obs = np.zeros_like(rb.buffer_obs)

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # anneal PER beta to 1
        rb.beta = min(1.0, args.prioritized_replay_beta + global_step * (1.0 - args.prioritized_replay_beta) / args.total_timesteps)

        # ALGO LOGIC: put action logic here
        with torch.no_grad():
            q_dist = q_network(torch.Tensor(obs).to(device))
            q_values = torch.sum(q_dist * q_network.support, dim=2)
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
        trace.actions.append(int(actions[0]))

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs[0], actions[0], rewards[0], real_next_obs[0], terminations[0])  # numpy 2 refuses (1,) arrays into its scalar slots
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                # reset the noise for both networks
                q_network.reset_noise()
                target_network.reset_noise()
                data = rb.sample(args.batch_size)

                with torch.no_grad():
                    next_dist = target_network(data.next_observations)  # [B, num_actions, n_atoms]
                    support = target_network.support  # [n_atoms]
                    next_q_values = torch.sum(next_dist * support, dim=2)  # [B, num_actions]  # noqa: F841 - CleanRL's

                    # double q-learning
                    next_dist_online = q_network(data.next_observations)  # [B, num_actions, n_atoms]
                    next_q_online = torch.sum(next_dist_online * support, dim=2)  # [B, num_actions]
                    best_actions = torch.argmax(next_q_online, dim=1)  # [B]
                    next_pmfs = next_dist[torch.arange(args.batch_size), best_actions]  # [B, n_atoms]

                    # compute the n-step Bellman update.
                    gamma_n = args.gamma**args.n_step
                    next_atoms = data.rewards + gamma_n * support * (1 - data.dones.float())
                    tz = next_atoms.clamp(q_network.v_min, q_network.v_max)

                    # projection
                    delta_z = q_network.delta_z
                    b = (tz - q_network.v_min) / delta_z  # shape: [B, n_atoms]
                    l = b.floor().clamp(0, args.n_atoms - 1)  # noqa: E741 - CleanRL's name
                    u = b.ceil().clamp(0, args.n_atoms - 1)

                    # (l == u).float() handles the case where bj is exactly an integer
                    # example bj = 1, then the upper ceiling should be uj= 2, and lj= 1
                    d_m_l = (u.float() + (l == b).float() - b) * next_pmfs  # [B, n_atoms]
                    d_m_u = (b - l) * next_pmfs  # [B, n_atoms]

                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])

                dist = q_network(data.observations)  # [B, num_actions, n_atoms]
                pred_dist = dist.gather(1, data.actions.unsqueeze(-1).expand(-1, -1, args.n_atoms)).squeeze(1)
                log_pred = torch.log(pred_dist.clamp(min=1e-5, max=1 - 1e-5))

                loss_per_sample = -(target_pmfs * log_pred).sum(dim=1)
                loss = (loss_per_sample * data.weights.squeeze()).mean()

                # update priorities
                new_priorities = loss_per_sample.detach().cpu().numpy()
                rb.update_priorities(data.indices, new_priorities)
                trace.update_steps.append(global_step)
                trace.indices.append(np.asarray(data.indices))
                trace.weights.append(data.weights.squeeze(1).numpy().copy())
                trace.priorities.append(new_priorities.copy())
                trace.losses.append(loss.item())

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1.0 - args.tau) * target_param.data)
                trace.target_steps.append(global_step)
    envs.close()
    trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
