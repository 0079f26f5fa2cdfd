"""The baselines of the PPO speed benchmarks: CleanRL's ppo.py and ppo_atari.py loop in a function, their networks
imported from their files (benchmarks/cleanrl/upstream/); the changes are listed in benchmarks/cleanrl/README.md."""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "upstream"))
from ppo import Agent as MlpAgent  # noqa: E402  CleanRL's networks, from its files
from ppo_atari import Agent as AtariAgent  # noqa: E402


@dataclass
class PlainSpec:
    """CleanRL's ppo.py arguments the loop reads (ppo_atari.py's differ in the env, num_envs and clip_coef)."""

    env_id: str = "CartPole-v1"
    atari: bool = False
    vector: str = "sync"  # gymnasium's SyncVectorEnv, or "async": its AsyncVectorEnv (a process per env), for envs that wait
    frame_stack: int = 4  # Atari frames an observation stacks (CleanRL's ppo_atari_lstm.py: 1)
    seed: int = 1
    torch_deterministic: bool = True
    cuda: bool = True
    learning_rate: float = 2.5e-4
    num_envs: int = 4
    num_steps: int = 128
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    batch_size: int = 0
    minibatch_size: int = 0
    num_iterations: int = 0


CARTPOLE = PlainSpec()  # CleanRL ppo.py
BREAKOUT = PlainSpec("BreakoutNoFrameskip-v4", atari=True, num_envs=8, clip_coef=0.1)  # ppo_atari.py


def make_env(spec: PlainSpec) -> Callable[[], gym.Env]:
    """CleanRL's envs; for Atari, its wrapper chain built from gymnasium 1.x's ``AtariPreprocessing`` (noop reset 30,
    max-and-skip 4, 84x84 grayscale) and ``FrameStackObservation``, with SB3's episodic-life, fire-reset and clip-reward."""
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


def plain_ppo(args: PlainSpec, on_iteration: Callable[[float], None] | None = None) -> list[float]:
    """CleanRL's PPO loop for ``args.num_iterations`` iterations, ``args`` a copy it fills in; returns each iteration's
    seconds, and calls ``on_iteration(seconds)`` at the end of each."""
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    vector = gym.vector.AsyncVectorEnv if args.vector == "async" else gym.vector.SyncVectorEnv
    envs = vector([make_env(args) for _ in range(args.num_envs)])
    agent = (AtariAgent if args.atari else MlpAgent)(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    times = []
    for iteration in range(1, args.num_iterations + 1):
        started = time.perf_counter()
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network (without the statistics CleanRL logs: approx KL, clip fraction)
        b_inds = np.arange(args.batch_size)
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        times.append(time.perf_counter() - started)
        if on_iteration is not None:
            on_iteration(times[-1])
    envs.close()
    return times
