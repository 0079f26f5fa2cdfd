"""Independent PPO learners on a PettingZoo game: the baseline of `benchmarks/learning.py --suite multiagent` (issue 37).

CleanRL's ppo.py loop (its Agent, rollout, GAE and clipped update, unchanged in substance), with one network and one
optimiser per agent: agent k acts on its own rows of fleetrl's vector (``make_vec``: row ``g * A + k`` is agent k of
game g) and is trained only on them. Nothing is shared between the agents, which is what "independent learners" means
against fleetrl's parameter-shared PPO. ``--random``: no network, uniform random actions (the random baseline), logged
the same way. It writes CleanRL's TensorBoard scalars (``charts/episodic_return`` per agent episode) into ``--run-dir``,
which ``fleetrl compare`` reads. Vector observations and discrete actions (MPE); agents that leave early are not masked.

    python benchmarks/ippo_pettingzoo.py --env-id mpe2.simple_spread_v3 --seed 1 --total-timesteps 500000 --run-dir DIR
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.tensorboard import SummaryWriter

from bench import add_flags
from fleetrl.envs import make_vec
from fleetrl.envs.registry import env_family
from loops.ppo import MlpAgent as Agent  # CleanRL's ppo.py Agent, from its file (benchmarks/cleanrl/upstream/)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    add_flags(p, env_id="mpe2.simple_spread_v3", seed=1, total_timesteps=(2_000_000, "agent steps (rows x steps), as fleetrl counts them"),
              num_envs=(6, "agent rows (whole games)"), num_steps=128, learning_rate=2.5e-4, gamma=0.99, gae_lambda=0.95, num_minibatches=4,
              update_epochs=4, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
              random=(False, "uniform random actions, no learning"))
    args = p.parse_args()

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    writer = SummaryWriter(args.run_dir)
    num_agents = env_family(args.env_id).agents
    # SAME_STEP: the loop below is CleanRL's, which reads each finished row's statistics from final_info
    envs = make_vec(args.env_id, args.num_envs, backend="sync", autoreset_mode="SameStep")
    obs_dim, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    rows = [np.arange(k, args.num_envs, num_agents) for k in range(num_agents)]  # agent k's rows
    agents = [Agent(envs) for _ in range(num_agents)]
    optimizers = [optim.Adam(a.parameters(), lr=args.learning_rate, eps=1e-5) for a in agents]
    rng = np.random.default_rng(args.seed)

    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N, obs_dim))
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs, rewards, dones, values = (torch.zeros((T, N)) for _ in range(4))
    next_obs = torch.tensor(envs.reset(seed=args.seed)[0], dtype=torch.float32).reshape(N, -1)
    next_done = torch.zeros(N)
    global_step, start = 0, time.time()
    num_iterations = args.total_timesteps // (T * N)
    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations  # CleanRL's annealed learning rate
        for optimizer in optimizers:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(T):
            global_step += N
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                for k, agent in enumerate(agents):
                    if args.random:
                        actions[step, rows[k]] = torch.from_numpy(rng.integers(n_actions, size=len(rows[k])))
                        continue
                    action, logprob, _, value = agent.get_action_and_value(next_obs[rows[k]])
                    actions[step, rows[k]], logprobs[step, rows[k]], values[step, rows[k]] = action, logprob, value.flatten()
            o, reward, terminations, truncations, infos = envs.step(actions[step].numpy())
            rewards[step] = torch.tensor(reward, dtype=torch.float32)
            next_obs = torch.tensor(o, dtype=torch.float32).reshape(N, -1)
            next_done = torch.tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
            if "final_info" in infos and "_episode" in infos["final_info"]:
                finished = infos["final_info"]
                for i in np.flatnonzero(finished["_episode"]):
                    writer.add_scalar("charts/episodic_return", finished["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", finished["episode"]["l"][i], global_step)
        if args.random:
            writer.add_scalar("charts/SPS", int(global_step / (time.time() - start)), global_step)
            continue

        for k, agent in enumerate(agents):  # each agent learns from its own rows only
            r = rows[k]
            with torch.no_grad():  # CleanRL's GAE
                next_value = agent.get_value(next_obs[r]).reshape(1, -1)
                advantages = torch.zeros((T, len(r)))
                lastgaelam = 0
                for t in reversed(range(T)):
                    nextnonterminal = 1.0 - (next_done[r] if t == T - 1 else dones[t + 1, r])
                    nextvalues = next_value if t == T - 1 else values[t + 1, r]
                    delta = rewards[t, r] + args.gamma * nextvalues * nextnonterminal - values[t, r]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values[:, r]
            b_obs, b_actions = obs[:, r].reshape(-1, obs_dim), actions[:, r].reshape(-1)
            b_logprobs, b_advantages = logprobs[:, r].reshape(-1), advantages.reshape(-1)
            b_returns, b_values = returns.reshape(-1), values[:, r].reshape(-1)
            batch_size = len(b_obs)
            minibatch_size = batch_size // args.num_minibatches
            for _ in range(args.update_epochs):  # CleanRL's clipped update
                b_inds = np.random.permutation(batch_size)
                for begin in range(0, batch_size, minibatch_size):
                    mb = b_inds[begin : begin + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                    ratio = (newlogprob - b_logprobs[mb]).exp()
                    mb_adv = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
                    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                    newvalue = newvalue.view(-1)
                    v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -args.clip_coef, args.clip_coef)
                    v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    optimizers[k].zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizers[k].step()
        writer.add_scalar("charts/SPS", int(global_step / (time.time() - start)), global_step)
    envs.close()
    writer.close()


if __name__ == "__main__":
    main()
