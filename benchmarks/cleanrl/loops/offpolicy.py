"""CleanRL's dqn.py, sac_continuous_action.py and td3_continuous_action.py loops in functions (their networks imported
from their files in upstream/), with trace points and fleetrl's draws as switches; CleanRL's replay buffer as its files
build it; the Trace every in-process CleanRL loop records.

The baselines of the off-policy speed benchmark and of benchmarks/vs_cleanrl.py dqn; not run on its own. Each
``plain_*`` runs ``steps`` env steps (``--total-timesteps``) after ``--learning-starts learning_starts`` and returns a
:class:`Timing`. Torch keeps its default thread count, as CleanRL does; the changes are listed in
benchmarks/cleanrl/README.md.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "upstream"))
from cleanrl_utils import buffers  # noqa: E402  CleanRL's copy of SB3's buffers (SB3 is not installed here)
from dqn import QNetwork, linear_schedule  # noqa: E402  CleanRL's networks, from its files (upstream/)
from sac_continuous_action import Actor as SACActor, SoftQNetwork  # noqa: E402
from td3_continuous_action import Actor as TD3Actor  # noqa: E402

MARK_EVERY = 100  # steps between clock marks (fleetrl's off-policy iteration is 100 vector steps too)
LOG_EVERY = 100  # CleanRL writes its loss scalars every 100 steps (each write an .item(): a host sync)


# ============================================================================ what a run returns
@dataclass
class Timing:
    """A run's clock: (env steps done, ``time.perf_counter()``) at the end of every ``MARK_EVERY`` steps, where
    ``on_mark(steps_done)`` is called, so the caller can time any window of whole blocks; and its episodes' returns."""

    algo: str
    env_id: str
    steps: int
    learning_starts: int
    on_mark: Callable[[int], None] | None = None
    torch_threads: int = field(default_factory=torch.get_num_threads)
    marks: list[tuple[int, float]] = field(default_factory=list)
    episode_returns: list[float] = field(default_factory=list)

    def step_done(self, steps_done: int) -> None:
        if steps_done % MARK_EVERY == 0:
            self.marks.append((steps_done, time.perf_counter()))
            if self.on_mark is not None:
                self.on_mark(steps_done)

    def sps(self, from_step: int | None = None) -> float:
        """Env steps per second from the mark at ``from_step`` (default: ``learning_starts``, rounded up to a mark)
        to the last mark."""
        start = self.learning_starts if from_step is None else from_step
        first = next(((s, t) for s, t in self.marks if s >= start), None)
        if first is None or first == self.marks[-1]:
            raise ValueError(f"no whole block of {MARK_EVERY} steps after step {start} (run of {self.steps} steps)")
        (s0, t0), (s1, t1) = first, self.marks[-1]
        return (s1 - s0) / (t1 - t0)


# ============================================================================ envs and replay buffer
def make_env(env_id: str, seed: int) -> Callable[[], gym.Env]:
    """CleanRL's ``make_env`` (no video)."""

    def thunk() -> gym.Env:
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(env_id: str, seed: int, num_envs: int = 1) -> gym.vector.SyncVectorEnv:
    # gymnasium 1.x: same-step autoreset gives CleanRL's (gymnasium 0.29) semantics, the final obs in the info
    return gym.vector.SyncVectorEnv([make_env(env_id, seed + i) for i in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class ReplayBuffer(buffers.ReplayBuffer):
    """CleanRL's replay buffer (its cleanrl_utils/buffers.py, SB3's) as its off-policy files build it, for them and the
    loops: ``handle_timeout_termination=False``."""

    def __init__(self, buffer_size: int, observation_space: gym.spaces.Space, action_space: gym.spaces.Space, device="cpu", n_envs: int = 1):
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs, handle_timeout_termination=False)


def _seed(seed: int) -> None:
    # TRY NOT TO MODIFY: seeding
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True


def _step_and_store(envs: gym.vector.VectorEnv, obs: np.ndarray, actions: np.ndarray, rb: ReplayBuffer, timing: Timing) -> np.ndarray:
    """CleanRL's "TRY NOT TO MODIFY" block: execute the game, record finished episodes (what CleanRL prints and writes,
    from gymnasium 1.x's `final_info`), save the transition to the replay buffer (the final observation at a time limit);
    returns ``next_obs``."""
    next_obs, rewards, terminations, truncations, infos = envs.step(actions)
    if "final_info" in infos and "episode" in infos["final_info"]:
        for i in np.flatnonzero(infos["final_info"]["_episode"]):
            timing.episode_returns.append(float(infos["final_info"]["episode"]["r"][i]))
    real_next_obs = next_obs.copy()
    for idx, trunc in enumerate(truncations):
        if trunc:
            real_next_obs[idx] = infos["final_obs"][idx]
    rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
    return next_obs


# ============================================================================ DQN (cleanrl/dqn.py)
@dataclass(frozen=True)
class DQNArgs:
    seed: int = 1
    total_timesteps: int = 500000
    learning_starts: int = 10000
    learning_rate: float = 2.5e-4
    buffer_size: int = 10_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    train_frequency: int = 10


@dataclass
class Trace:
    """What a loop did, for a lockstep comparison (benchmarks/vs_cleanrl.py ALGO --lockstep): every step's action (and
    the Q-values it acted on, by step), the global step of every optimiser step with its loss, and of every target
    update; Rainbow's sampled slots, importance weights and new priorities; PQN's returns and fleetrl's draws; the final
    weights by CleanRL's names. A global step is CleanRL's loop variable."""

    actions: list = field(default_factory=list)
    q_values: dict[int, list[float]] = field(default_factory=dict)
    update_steps: list[int] = field(default_factory=list)
    target_steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    indices: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    priorities: list[np.ndarray] = field(default_factory=list)
    returns: list[np.ndarray] = field(default_factory=list)
    uniforms: list[np.ndarray] = field(default_factory=list)  # fleetrl's draws: per step, (explore uniform, random action)
    permutations: list[np.ndarray] = field(default_factory=list)  # fleetrl's draws: per epoch, the minibatch order
    truncations: int = 0
    final_params: dict[str, Any] = field(default_factory=dict)


def plain_dqn(env_id: str, steps: int, learning_starts: int, seed: int = 1, device: str = "cpu",
              args: DQNArgs = DQNArgs(), on_mark: Callable[[int], None] | None = None, numpy_draws: bool = False,
              fused_adam: bool = False, trace: Trace | None = None) -> Timing:
    """CleanRL's dqn.py loop for ``steps`` env steps (``--total-timesteps``).

    fleetrl's DQN differs from it in two things only (benchmarks/vs_cleanrl.py dqn), each a switch here:
    ``numpy_draws`` explores with fleetrl's draws (one uniform pair per step from numpy's global RNG, not
    ``random.random()`` and the action space's own RNG); ``fused_adam`` takes its fused Adam. With both, the loop takes
    fleetrl's actions and updates; ``trace`` records them. (With one env, SB3's buffer draws the replay indices from
    numpy's global RNG as fleetrl's does: its env index draws nothing.)"""
    args = replace(args, seed=seed, total_timesteps=steps, learning_starts=learning_starts)
    _seed(args.seed)
    device = torch.device(device)
    envs = make_envs(env_id, seed)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action space is supported"
    timing, logged = Timing("dqn", env_id, steps, learning_starts, on_mark), []

    q_network = QNetwork(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, **({"fused": True} if fused_adam else {}))
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

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
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
            if trace is not None:
                trace.q_values[global_step] = q_values[0].tolist()
        if trace is not None:
            trace.actions.append(int(actions[0]))

        # TRY NOT TO MODIFY: execute the game, log data, save data to the replay buffer
        next_obs = _step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)

                if global_step % LOG_EVERY == 0:  # writer.add_scalar("losses/td_loss", loss) reads it too
                    logged.append((loss.item(), old_val.mean().item()))
                if trace is not None:
                    trace.update_steps.append(global_step)
                    trace.losses.append(loss.item())

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
                    target_network_param.data.copy_(args.tau * q_network_param.data + (1.0 - args.tau) * target_network_param.data)
                if trace is not None:
                    trace.target_steps.append(global_step)
        timing.step_done(global_step + 1)

    envs.close()
    if trace is not None:
        trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
    return timing


# ============================================================================ SAC and TD3: the parts their files share
def _continuous_setup(env_id: str, seed: int, device: torch.device, buffer_size: int):
    """The env (asserted continuous), the two critics and their targets, and the replay buffer (float32 observations,
    as CleanRL forces them)."""
    envs = make_envs(env_id, seed)
    assert isinstance(envs.single_action_space, gym.spaces.Box), "only continuous action space is supported"
    qf1 = SoftQNetwork(envs).to(device)
    qf2 = SoftQNetwork(envs).to(device)
    qf1_target = SoftQNetwork(envs).to(device)
    qf2_target = SoftQNetwork(envs).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(buffer_size, envs.single_observation_space, envs.single_action_space, device)
    return envs, qf1, qf2, qf1_target, qf2_target, rb


def _critic_update(qf1: nn.Module, qf2: nn.Module, q_optimizer: optim.Optimizer, data: buffers.ReplayBufferSamples,
                   next_q_value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    qf1_a_values = qf1(data.observations, data.actions).view(-1)
    qf2_a_values = qf2(data.observations, data.actions).view(-1)
    qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
    qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
    qf_loss = qf1_loss + qf2_loss

    # optimize the model
    q_optimizer.zero_grad()
    qf_loss.backward()
    q_optimizer.step()
    return qf1_a_values, qf2_a_values, qf1_loss, qf2_loss, qf_loss


def _soft_update(tau: float, *pairs: tuple[nn.Module, nn.Module]) -> None:
    for net, target in pairs:
        for param, target_param in zip(net.parameters(), target.parameters()):
            target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)


def _critic_scalars(qf1_a_values, qf2_a_values, qf1_loss, qf2_loss, qf_loss, actor_loss) -> tuple[float, ...]:
    # CleanRL's writer.add_scalar calls every 100 steps, without the writer: the same host syncs
    return (qf1_a_values.mean().item(), qf2_a_values.mean().item(), qf1_loss.item(), qf2_loss.item(), qf_loss.item() / 2.0,
            actor_loss.item())


# ============================================================================ SAC (cleanrl/sac_continuous_action.py)
@dataclass(frozen=True)
class SACArgs:
    seed: int = 1
    total_timesteps: int = 1000000
    learning_starts: int = 5e3
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    policy_lr: float = 3e-4
    q_lr: float = 1e-3
    policy_frequency: int = 2
    target_network_frequency: int = 1  # Denis Yarats' implementation delays this by 2.
    alpha: float = 0.2
    autotune: bool = True


def plain_sac(env_id: str, steps: int, learning_starts: int, seed: int = 1, device: str = "cpu",
              args: SACArgs = SACArgs(), on_mark: Callable[[int], None] | None = None) -> Timing:
    """CleanRL's sac_continuous_action.py loop for ``steps`` env steps (``--total-timesteps``)."""
    args = replace(args, seed=seed, total_timesteps=steps, learning_starts=learning_starts)
    _seed(args.seed)
    device = torch.device(device)
    envs, qf1, qf2, qf1_target, qf2_target, rb = _continuous_setup(env_id, seed, device, args.buffer_size)
    timing, logged = Timing("sac", env_id, steps, learning_starts, on_mark), []

    actor = SACActor(envs).to(device)
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.policy_lr)

    # Automatic entropy tuning
    if args.autotune:
        target_entropy = -torch.prod(torch.Tensor(envs.single_action_space.shape).to(device)).item()
        log_alpha = torch.zeros(1, requires_grad=True, device=device)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args.q_lr)
    else:
        alpha = args.alpha

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            actions, _, _ = actor.get_action(torch.Tensor(obs).to(device))
            actions = actions.detach().cpu().numpy()

        # TRY NOT TO MODIFY: execute the game, log data, save data to the replay buffer
        next_obs = _step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                next_state_actions, next_state_log_pi, _ = actor.get_action(data.next_observations)
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                qf2_next_target = qf2_target(data.next_observations, next_state_actions)
                min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
                next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (min_qf_next_target).view(-1)
            critic = _critic_update(qf1, qf2, q_optimizer, data, next_q_value)

            if global_step % args.policy_frequency == 0:  # TD 3 Delayed update support
                for _ in range(args.policy_frequency):  # compensate for the delay by doing 'actor_update_interval' instead of 1
                    pi, log_pi, _ = actor.get_action(data.observations)
                    qf1_pi = qf1(data.observations, pi)
                    qf2_pi = qf2(data.observations, pi)
                    min_qf_pi = torch.min(qf1_pi, qf2_pi)
                    actor_loss = ((alpha * log_pi) - min_qf_pi).mean()

                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    actor_optimizer.step()

                    if args.autotune:
                        with torch.no_grad():
                            _, log_pi, _ = actor.get_action(data.observations)
                        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()

                        a_optimizer.zero_grad()
                        alpha_loss.backward()
                        a_optimizer.step()
                        alpha = log_alpha.exp().item()

            # update the target networks
            if global_step % args.target_network_frequency == 0:
                _soft_update(args.tau, (qf1, qf1_target), (qf2, qf2_target))

            if global_step % LOG_EVERY == 0:  # a multiple of policy_frequency: actor_loss exists
                logged.append(_critic_scalars(*critic, actor_loss) + (alpha,) + ((alpha_loss.item(),) if args.autotune else ()))
        timing.step_done(global_step + 1)

    envs.close()
    return timing


# ============================================================================ TD3 (cleanrl/td3_continuous_action.py)
@dataclass(frozen=True)
class TD3Args:
    seed: int = 1
    total_timesteps: int = 1000000
    learning_starts: int = 25e3
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    policy_noise: float = 0.2
    exploration_noise: float = 0.1
    policy_frequency: int = 2
    noise_clip: float = 0.5


def plain_td3(env_id: str, steps: int, learning_starts: int, seed: int = 1, device: str = "cpu",
              args: TD3Args = TD3Args(), on_mark: Callable[[int], None] | None = None) -> Timing:
    """CleanRL's td3_continuous_action.py loop for ``steps`` env steps (``--total-timesteps``)."""
    args = replace(args, seed=seed, total_timesteps=steps, learning_starts=learning_starts)
    _seed(args.seed)
    device = torch.device(device)
    envs, qf1, qf2, qf1_target, qf2_target, rb = _continuous_setup(env_id, seed, device, args.buffer_size)
    timing, logged = Timing("td3", env_id, steps, learning_starts, on_mark), []

    actor = TD3Actor(envs).to(device)
    target_actor = TD3Actor(envs).to(device)
    target_actor.load_state_dict(actor.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.learning_rate)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(envs.single_action_space.low, envs.single_action_space.high)

        # TRY NOT TO MODIFY: execute the game, log data, save data to the replay buffer
        next_obs = _step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                clipped_noise = (torch.randn_like(data.actions, device=device) * args.policy_noise).clamp(
                    -args.noise_clip, args.noise_clip) * target_actor.action_scale
                next_state_actions = (target_actor(data.next_observations) + clipped_noise).clamp(
                    envs.single_action_space.low[0], envs.single_action_space.high[0])
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                qf2_next_target = qf2_target(data.next_observations, next_state_actions)
                min_qf_next_target = torch.min(qf1_next_target, qf2_next_target)
                next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (min_qf_next_target).view(-1)
            critic = _critic_update(qf1, qf2, q_optimizer, data, next_q_value)

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                # update the target network
                _soft_update(args.tau, (actor, target_actor), (qf1, qf1_target), (qf2, qf2_target))

            if global_step % LOG_EVERY == 0:  # a multiple of policy_frequency: actor_loss exists
                logged.append(_critic_scalars(*critic, actor_loss))
        timing.step_done(global_step + 1)

    envs.close()
    return timing


PLAIN = {"dqn": plain_dqn, "sac": plain_sac, "td3": plain_td3}
ARGS = {"dqn": DQNArgs, "sac": SACArgs, "td3": TD3Args}  # the hyperparameters each loop runs with (fleetrl gets the same)
