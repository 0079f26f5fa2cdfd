"""The baselines of the PPO speed benchmarks: CleanRL's ppo.py and ppo_atari.py loops, written the straightforward way.

Imported by the PPO speed benchmarks under benchmarks/; not run on its own. One loop serves both
(CleanRL's two files differ only in the envs, the network and a few hyperparameters): gymnasium
``SyncVectorEnv``, fp32, float32 torch rollout storage, a ``Categorical`` built every step, GAE in a Python
loop, a minibatch gather per minibatch (``vector="async"``: gymnasium's ``AsyncVectorEnv`` instead, a process per
env, as a CleanRL user steps envs that wait). Atari uses CleanRL's wrapper chain (noop reset 30, max-and-skip 4,
episodic life, fire reset, reward clipping, 84x84 grayscale, frame stack 4), built from gymnasium's
``AtariPreprocessing`` and ``FrameStackObservation`` plus SB3's episodic-life, fire-reset and clip-reward wrappers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical


@dataclass(frozen=True)
class PlainSpec:
    """What differs between CleanRL's ppo.py and ppo_atari.py."""

    env_id: str
    atari: bool
    num_envs: int
    num_steps: int
    learning_rate: float = 2.5e-4
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    gamma: float = 0.99
    gae_lambda: float = 0.95
    vector: str = "sync"  # gymnasium's SyncVectorEnv, or "async": its AsyncVectorEnv (a process per env), for envs that wait
    frame_stack: int = 4  # Atari frames an observation stacks (CleanRL's ppo_atari_lstm.py: 1)


CARTPOLE = PlainSpec("CartPole-v1", atari=False, num_envs=4, num_steps=128)  # CleanRL ppo.py
BREAKOUT = PlainSpec("BreakoutNoFrameskip-v4", atari=True, num_envs=8, num_steps=128, clip_coef=0.1)  # ppo_atari.py


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def make_env(spec: PlainSpec) -> Callable[[], gym.Env]:
    if spec.atari:
        import ale_py

        gym.register_envs(ale_py)  # gymnasium 1.x no longer finds the ALE ids by itself
        # SB3's small wrappers, as CleanRL uses them; fleetrl's copies are the same code, so they serve here too
        from fleetrl.envs.atari import ClipReward, EpisodicLife, FireReset

    def thunk() -> gym.Env:
        env = gym.make(spec.env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if spec.atari:
            env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
            env = EpisodicLife(env)
            if "FIRE" in env.unwrapped.get_action_meanings():
                env = FireReset(env)
            env = ClipReward(env)
            env = gym.wrappers.FrameStackObservation(env, spec.frame_stack)
        return env

    return thunk


# ---------------------------------------------------------------------------- networks (CleanRL's)
class MlpAgent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, num_actions), std=0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class AtariAgent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


# ---------------------------------------------------------------------------- the loop
def plain_ppo(spec: PlainSpec, iterations: int, seed: int = 1, device: str = "cpu",
              on_iteration: Callable[[float], None] | None = None) -> list[float]:
    """CleanRL's PPO loop for ``iterations`` iterations (the learning rate anneals over them); returns each
    iteration's seconds, and calls ``on_iteration(seconds)`` at the end of each."""
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    dev = torch.device(device)
    vector = gym.vector.AsyncVectorEnv if spec.vector == "async" else gym.vector.SyncVectorEnv
    envs = vector([make_env(spec) for _ in range(spec.num_envs)])
    obs_shape, num_actions = envs.single_observation_space.shape, int(envs.single_action_space.n)
    agent = (AtariAgent(num_actions) if spec.atari else MlpAgent(int(np.prod(obs_shape)), num_actions)).to(dev)
    optimizer = torch.optim.Adam(agent.parameters(), lr=spec.learning_rate, eps=1e-5)

    n_steps, n_envs = spec.num_steps, spec.num_envs
    obs = torch.zeros((n_steps, n_envs) + obs_shape).to(dev)
    actions = torch.zeros((n_steps, n_envs)).to(dev)
    logprobs = torch.zeros((n_steps, n_envs)).to(dev)
    rewards = torch.zeros((n_steps, n_envs)).to(dev)
    dones = torch.zeros((n_steps, n_envs)).to(dev)
    values = torch.zeros((n_steps, n_envs)).to(dev)
    batch_size = n_envs * n_steps
    minibatch_size = batch_size // spec.num_minibatches

    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.Tensor(next_obs).to(dev), torch.zeros(n_envs).to(dev)
    times = []
    for iteration in range(1, iterations + 1):
        t0 = time.perf_counter()
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / iterations) * spec.learning_rate
        for step in range(n_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(dev).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(dev), torch.Tensor(next_done).to(dev)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(dev)
            lastgaelam = 0
            for t in reversed(range(n_steps)):
                if t == n_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + spec.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + spec.gamma * spec.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _epoch in range(spec.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb = b_inds[start : start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions.long()[mb])
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
