"""CleanRL's pqn.py loop (benchmarks/cleanrl/pqn.py), in this process with trace points and fleetrl's draws in place
of its own; the changes are listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

import numpy as np

from loops.offpolicy import Trace


def plain_pqn(env_id: str, steps: int, seed: int, draws: Trace, trace: Trace, num_envs: int = 4, num_steps: int = 128) -> None:
    """CleanRL's pqn.py main loop (defaults), gymnasium 1.x same-step autoreset, with fleetrl's draws from ``draws``."""
    import gymnasium as gym
    import torch
    import torch.nn.functional as F
    import torch.optim as optim
    from torch import nn

    from fleetrl.nets import layer_init

    class QNetwork(nn.Module):  # CleanRL's, verbatim
        def __init__(self, env):
            super().__init__()
            self.network = nn.Sequential(
                layer_init(nn.Linear(np.array(env.single_observation_space.shape).prod(), 120)), nn.LayerNorm(120), nn.ReLU(),
                layer_init(nn.Linear(120, 84)), nn.LayerNorm(84), nn.ReLU(),
                layer_init(nn.Linear(84, env.single_action_space.n)),
            )

        def forward(self, x):
            return self.network(x)

    def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
        slope = (end_e - start_e) / duration
        return max(slope * t + start_e, end_e)

    learning_rate, update_epochs, num_minibatches, gamma, max_grad_norm, q_lambda = 2.5e-4, 4, 4, 0.99, 10.0, 0.65
    start_e, end_e, exploration_fraction, total_timesteps = 1, 0.05, 0.5, steps
    batch_size = num_envs * num_steps
    minibatch_size, num_iterations = batch_size // num_minibatches, total_timesteps // batch_size
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cpu")
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id)) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    q_network = QNetwork(envs).to(device)
    optimizer = optim.RAdam(q_network.parameters(), lr=learning_rate)
    obs = torch.zeros((num_steps, num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((num_steps, num_envs) + envs.single_action_space.shape).to(device)
    rewards = torch.zeros((num_steps, num_envs)).to(device)
    dones = torch.zeros((num_steps, num_envs)).to(device)
    values = torch.zeros((num_steps, num_envs)).to(device)
    global_step = 0
    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(num_envs).to(device)
    draw, epoch_draw = iter(draws.uniforms), iter(draws.permutations)
    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * learning_rate
        for step in range(0, num_steps):
            global_step += num_envs
            obs[step] = next_obs
            dones[step] = next_done
            epsilon = linear_schedule(start_e, end_e, exploration_fraction * total_timesteps, global_step)
            uniform = next(draw)  # fleetrl's draws in place of torch.randint and torch.rand
            random_actions = torch.as_tensor(uniform[:, 1]).long()
            with torch.no_grad():
                q_values = q_network(next_obs)
                max_actions = torch.argmax(q_values, dim=1)
                values[step] = q_values[torch.arange(num_envs), max_actions].flatten()
            explore = torch.as_tensor(uniform[:, 0]) < epsilon
            action = torch.where(explore, random_actions, max_actions)
            actions[step] = action
            trace.actions.append(action.tolist())
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            trace.truncations += int(truncations.sum())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
        with torch.no_grad():  # Compute Q(lambda) targets
            returns = torch.zeros_like(rewards).to(device)
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    next_value, _ = torch.max(q_network(next_obs), dim=-1)
                    nextnonterminal = 1.0 - next_done
                    returns[t] = rewards[t] + gamma * next_value * nextnonterminal
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    next_value = values[t + 1]
                    returns[t] = rewards[t] + gamma * (q_lambda * returns[t + 1] + (1 - q_lambda) * next_value) * nextnonterminal
        trace.returns.append(returns.numpy().copy())
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_returns = returns.reshape(-1)
        for epoch in range(update_epochs):
            b_inds = next(epoch_draw)  # fleetrl's permutation in place of np.random.shuffle
            for start in range(0, batch_size, minibatch_size):
                end = start + minibatch_size
                mb_inds = b_inds[start:end]
                old_val = q_network(b_obs[mb_inds]).gather(1, b_actions[mb_inds].unsqueeze(-1).long()).squeeze()
                loss = F.mse_loss(b_returns[mb_inds], old_val)
                trace.losses.append(loss.item())
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
                optimizer.step()
    envs.close()
    trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
