"""The baseline of the PPO-LSTM speed benchmark: CleanRL's ppo_atari_lstm.py loop, written the straightforward way.

Imported by the PPO speed benchmarks (breakout-lstm); not run on its own. As CleanRL's file: gymnasium
``SyncVectorEnv`` with CleanRL's Atari wrappers and one frame a step (``FrameStack(1)``), the Nature CNN, an
``nn.LSTM(512, 128)`` called once a step with the state masked by ``1 - done``, fp32, float32 torch rollout storage, a
``Categorical`` each step, GAE in a Python loop, and minibatches of whole env sequences. The env wrappers and the CNN's
initialisation are shared with loops/ppo.py.
"""

from __future__ import annotations

import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

from loops.ppo import PlainSpec, layer_init, make_env

BREAKOUT_LSTM = PlainSpec("BreakoutNoFrameskip-v4", atari=True, num_envs=8, num_steps=128, clip_coef=0.1, frame_stack=1)


class LstmAgent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(1, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.lstm = nn.LSTM(512, 128)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(128, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(128, 1), std=1)

    def get_states(self, x, lstm_state, done):
        hidden = self.network(x / 255.0)
        batch_size = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, batch_size, self.lstm.input_size))
        done = done.reshape((-1, batch_size))
        new_hidden = []
        for h, d in zip(hidden, done):
            h, lstm_state = self.lstm(h.unsqueeze(0), ((1.0 - d).view(1, -1, 1) * lstm_state[0], (1.0 - d).view(1, -1, 1) * lstm_state[1]))
            new_hidden += [h]
        return torch.flatten(torch.cat(new_hidden), 0, 1), lstm_state

    def get_value(self, x, lstm_state, done):
        hidden, _ = self.get_states(x, lstm_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, lstm_state, done, action=None):
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden), lstm_state


def plain_ppo_lstm(spec: PlainSpec, iterations: int, seed: int = 1, device: str = "cpu",
                   on_iteration: Callable[[float], None] | None = None) -> list[float]:
    """CleanRL's PPO-LSTM loop for ``iterations`` iterations; returns each iteration's seconds (``on_iteration`` each)."""
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    dev = torch.device(device)
    envs = gym.vector.SyncVectorEnv([make_env(spec) for _ in range(spec.num_envs)])
    agent = LstmAgent(int(envs.single_action_space.n)).to(dev)
    optimizer = torch.optim.Adam(agent.parameters(), lr=spec.learning_rate, eps=1e-5)
    n_steps, n_envs = spec.num_steps, spec.num_envs
    obs_shape = envs.single_observation_space.shape
    obs = torch.zeros((n_steps, n_envs) + obs_shape).to(dev)
    actions = torch.zeros((n_steps, n_envs)).to(dev)
    logprobs, rewards, dones, values = (torch.zeros((n_steps, n_envs)).to(dev) for _ in range(4))
    batch_size = n_envs * n_steps
    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.Tensor(next_obs).to(dev), torch.zeros(n_envs).to(dev)
    next_lstm_state = (torch.zeros(1, n_envs, 128).to(dev), torch.zeros(1, n_envs, 128).to(dev))
    times = []
    for iteration in range(1, iterations + 1):
        t0 = time.perf_counter()
        initial_lstm_state = (next_lstm_state[0].clone(), next_lstm_state[1].clone())
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / iterations) * spec.learning_rate
        for step in range(n_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value, next_lstm_state = agent.get_action_and_value(next_obs, next_lstm_state, next_done)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).to(dev).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(dev), torch.Tensor(np.logical_or(terminations, truncations)).to(dev)
        with torch.no_grad():
            next_value = agent.get_value(next_obs, next_lstm_state, next_done).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(dev)
            lastgaelam = 0
            for t in reversed(range(n_steps)):
                nextnonterminal = 1.0 - (next_done if t == n_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == n_steps - 1 else values[t + 1]
                delta = rewards[t] + spec.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + spec.gamma * spec.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values
        b_obs, b_logprobs, b_actions, b_dones = obs.reshape((-1,) + obs_shape), logprobs.reshape(-1), actions.reshape(-1), dones.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        envsperbatch = n_envs // spec.num_minibatches
        envinds = np.arange(n_envs)
        flatinds = np.arange(batch_size).reshape(n_steps, n_envs)
        for _epoch in range(spec.update_epochs):
            np.random.shuffle(envinds)
            for start in range(0, n_envs, envsperbatch):
                mbenvinds = envinds[start : start + envsperbatch]
                mb = flatinds[:, mbenvinds].ravel()
                _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                    b_obs[mb], (initial_lstm_state[0][:, mbenvinds], initial_lstm_state[1][:, mbenvinds]), b_dones[mb], b_actions.long()[mb])
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                mb_adv = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - spec.clip_coef, 1 + spec.clip_coef)).mean()
                newvalue = newvalue.view(-1)
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -spec.clip_coef, spec.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - spec.ent_coef * entropy.mean() + v_loss * spec.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), spec.max_grad_norm)
                optimizer.step()
        times.append(time.perf_counter() - t0)
        if on_iteration is not None:
            on_iteration(times[-1])
    envs.close()
    return times
