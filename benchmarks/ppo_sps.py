"""PPO training speed on CartPole-v1 with CleanRL's defaults (4 envs x 128 steps), fleetrl vs a plain loop.

    python benchmarks/ppo_sps.py [--iterations 40] [--repeats 3]

Both count whole iterations (rollout + update) and leave out the first. The baseline is the
straightforward synchronous loop of CleanRL's ppo.py (gymnasium SyncVectorEnv, a Categorical built
each step, preallocated torch tensors), run in the same process, alternating with fleetrl.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS = 4, 128, 4, 4


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class PlainAgent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(4, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(), layer_init(nn.Linear(64, 2), std=0.01))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def plain_ppo(iterations: int, seed: int = 1) -> list[float]:
    """CleanRL's ppo.py loop, written the straightforward way; returns each iteration's seconds."""
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")) for _ in range(NUM_ENVS)])
    agent = PlainAgent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    obs = torch.zeros((NUM_STEPS, NUM_ENVS, 4)); actions = torch.zeros((NUM_STEPS, NUM_ENVS))
    logprobs = torch.zeros((NUM_STEPS, NUM_ENVS)); rewards = torch.zeros((NUM_STEPS, NUM_ENVS))
    dones = torch.zeros((NUM_STEPS, NUM_ENVS)); values = torch.zeros((NUM_STEPS, NUM_ENVS))
    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(NUM_ENVS)
    batch_size = NUM_ENVS * NUM_STEPS
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        for step in range(NUM_STEPS):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(NUM_STEPS)):
                nextnonterminal = 1.0 - (next_done if t == NUM_STEPS - 1 else dones[t + 1])
                nextvalues = next_value if t == NUM_STEPS - 1 else values[t + 1]
                delta = rewards[t] + 0.99 * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + 0.99 * 0.95 * nextnonterminal * lastgaelam
            returns = advantages + values
        b_obs, b_logprobs, b_actions = obs.reshape(-1, 4), logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _epoch in range(EPOCHS):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, batch_size // MINIBATCHES):
                mb = b_inds[start : start + batch_size // MINIBATCHES]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions.long()[mb])
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                mb_adv = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 0.8, 1.2)).mean()
                newvalue = newvalue.view(-1)
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -0.2, 0.2)
                v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - 0.01 * entropy.mean() + v_loss * 0.5
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
        times.append(time.perf_counter() - t0)
    envs.close()
    return times


def fleetrl_ppo(iterations: int, backend: str = "sync") -> list[float]:
    from fleetrl.algos.ppo import Args, train

    with tempfile.TemporaryDirectory() as tmp:
        args = Args(total_timesteps=iterations * NUM_ENVS * NUM_STEPS, run_dir=os.path.join(tmp, "run"), progress=False,
                    checkpoint_every=10**9, env_backend=backend, cuda=False)
        return train(args).iteration_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    contenders = {"plain synchronous loop (CleanRL ppo.py style)": plain_ppo, "fleetrl train ppo (sync backend)": fleetrl_ppo}
    sps: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(opts.repeats):
        for name, run in contenders.items():
            seconds = run(opts.iterations)[1:]  # leave out the first iteration (warm-up)
            sps[name].append(NUM_ENVS * NUM_STEPS * len(seconds) / sum(seconds))
    baseline = statistics.median(sps[next(iter(contenders))])
    print(f"\nPPO CartPole-v1, {NUM_ENVS} envs x {NUM_STEPS} steps, {opts.iterations - 1} timed iterations, "
          f"median of {opts.repeats}, {os.cpu_count()} CPU cores, torch {torch.__version__}\n")
    print("| contender | SPS (median) | SPS (all repeats) | vs plain |")
    print("| --- | --- | --- | --- |")
    for name, values in sps.items():
        med = statistics.median(values)
        print(f"| {name} | {med:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {med / baseline:.2f}x |")


if __name__ == "__main__":
    main()
