"""CleanRL's qdagger_dqn_atari_impalacnn.py loop in a function, its three phases as its file writes them, with trace
points and fleetrl's differences as switches: the lockstep of tests/test_qdagger.py and benchmarks/vs_cleanrl.py qdagger.

CleanRL's file is Atari-only; its update code does not depend on the network, so on vector observations the student and
the teacher are CleanRL's dqn.py QNetwork (the MLP 120-84 that fleetrl's classic-control QDagger uses), and on frames the
student is the file's IMPALA CNN and the teacher dqn_atari.py's Nature CNN (both from ../qdagger_dqn_atari_impalacnn.py).
What changes: no TensorBoard writer, prints or progress bars; the offline phase's evaluations of the student are left out
(they change nothing but Python's ``random`` stream, which ``numpy_draws`` replaces); the teacher comes in as a network
with its evaluation returns (fleetrl's, from its checkpoint: CleanRL's evaluate draws from Python's ``random``); the
returns the distillation weight reads are Python floats (CleanRL's come from the episode statistics' arrays).
"""

from __future__ import annotations

import os
import random
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from loops.offpolicy import QNetwork as MLPQNetwork, ReplayBuffer, Timing, Trace, _seed, _step_and_store, buffers, linear_schedule, make_envs

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import qdagger_dqn_atari_impalacnn as cleanrl_qdagger  # noqa: E402  CleanRL's file (gymnasium 1.x port): its networks and loss
from qdagger_dqn_atari_impalacnn import kl_divergence_with_logits  # noqa: E402


@dataclass(frozen=True)
class QDaggerArgs:
    """CleanRL's flags; fleetrl's classic-control defaults (CleanRL has Atari's only: 1e-4, 1M, 1000, 32, 0.01, 80k, 4)."""

    seed: int = 1
    total_timesteps: int = 100_000
    learning_rate: float = 2.5e-4
    buffer_size: int = 10_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.1
    learning_starts: int = 1_000
    train_frequency: int = 10
    teacher_steps: int = 5_000
    offline_steps: int = 5_000
    temperature: float = 1.0


@dataclass
class QDaggerTrace(Trace):
    """:class:`Trace`, and the distillation weight of every update."""

    distill_coeffs: list[float] = field(default_factory=list)


def student_network(envs: gym.vector.VectorEnv) -> nn.Module:
    """CleanRL's student: the IMPALA CNN on frames (its QNetwork reads the module's global ``envs``), dqn.py's MLP else."""
    if len(envs.single_observation_space.shape) == 3:
        cleanrl_qdagger.envs = envs
        return cleanrl_qdagger.QNetwork(envs)
    return MLPQNetwork(envs)


def teacher_network(envs: gym.vector.VectorEnv, state_dict: dict[str, torch.Tensor]) -> nn.Module:
    """CleanRL's teacher (dqn_atari.py's QNetwork on frames, dqn.py's on vectors) holding a fleetrl DQN checkpoint's
    ``q_network`` weights, matched by order (the layers are the same; their names differ)."""
    model = cleanrl_qdagger.TeacherModel(envs) if len(envs.single_observation_space.shape) == 3 else MLPQNetwork(envs)
    model.load_state_dict(dict(zip(model.state_dict(), state_dict.values())))
    model.eval()
    return model


def plain_qdagger(env_id: str, teacher_state: dict[str, torch.Tensor], teacher_episodic_returns: list[float], seed: int = 1,
                  args: QDaggerArgs = QDaggerArgs(), device: str = "cpu", numpy_draws: bool = False, fused_adam: bool = False,
                  true_next_obs: bool = False, trace: QDaggerTrace | None = None, on_mark: Callable[[int], None] | None = None) -> Timing:
    """CleanRL's QDagger: ``args.teacher_steps`` teacher steps, ``args.offline_steps`` offline updates, then
    ``args.total_timesteps`` online steps. Its clock (``timing``) counts the online steps.

    fleetrl's differences, each a switch: ``numpy_draws`` (one uniform pair per step from numpy's global RNG, for the
    teacher's exploration and the student's), ``fused_adam``, ``true_next_obs`` (the teacher's buffer stores each
    transition's own next observation: CleanRL's ``optimize_memory_usage=True`` buffer keeps the next step's, the reset
    observation after a time limit). With all three the loop takes fleetrl's actions and updates; ``trace`` records them,
    an update or target copy at the index of the last action taken (the teacher's last during the offline phase)."""
    args = replace(args, seed=seed)
    _seed(args.seed)
    device = torch.device(device)
    envs = make_envs(env_id, seed)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action space is supported"
    timing = Timing("qdagger", env_id, args.total_timesteps, args.learning_starts, on_mark)

    q_network = student_network(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, **({"fused": True} if fused_adam else {}))
    target_network = student_network(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())

    # QDAGGER LOGIC:
    teacher_model = teacher_network(envs, teacher_state).to(device)

    def act(model: nn.Module, obs: np.ndarray, epsilon: float) -> np.ndarray:
        draws = np.random.random((2, envs.num_envs)) if numpy_draws else None  # fleetrl's: explore, then which action
        if (draws[0, 0] if numpy_draws else random.random()) < epsilon:
            actions = ((draws[1] * envs.single_action_space.n).astype(np.int64) if numpy_draws else
                       np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)]))
        else:
            q_values = model(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
        if trace is not None:
            trace.actions.append(int(actions[0]))
        return actions

    def qdagger_update(data, distill_coeff: float) -> None:
        # perform a gradient-descent step
        with torch.no_grad():
            target_max, _ = target_network(data.next_observations).max(dim=1)
            td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
            teacher_q_values = teacher_model(data.observations) / args.temperature
        student_q_values = q_network(data.observations)
        old_val = student_q_values.gather(1, data.actions).squeeze()
        q_loss = F.mse_loss(td_target, old_val)
        student_q_values = student_q_values / args.temperature
        distill_loss = torch.mean(kl_divergence_with_logits(teacher_q_values, student_q_values))
        loss = q_loss + distill_coeff * distill_loss
        if trace is not None:
            trace.update_steps.append(len(trace.actions) - 1)
            trace.losses.append(loss.item())
            trace.distill_coeffs.append(float(distill_coeff))

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def update_target() -> None:
        for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
            target_network_param.data.copy_(args.tau * q_network_param.data + (1.0 - args.tau) * target_network_param.data)
        if trace is not None:
            trace.target_steps.append(len(trace.actions) - 1)

    # collect teacher data for args.teacher_steps
    teacher_rb = (ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device) if true_next_obs else
                  buffers.ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device,
                                       optimize_memory_usage=True, handle_timeout_termination=False))
    teacher_timing = Timing("qdagger-teacher", env_id, args.teacher_steps, 0)  # the teacher's episodes are not the student's
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.teacher_steps):
        epsilon = linear_schedule(args.start_e, args.end_e, args.teacher_steps, global_step)
        actions = act(teacher_model, obs, epsilon)
        obs = _step_and_store(envs, obs, actions, teacher_rb, teacher_timing)

    # offline training phase: train the student model using the qdagger loss
    for global_step in range(args.offline_steps):
        data = teacher_rb.sample(args.batch_size)
        qdagger_update(data, 1.0)
        # update the target network
        if global_step % args.target_network_frequency == 0:
            update_target()

    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)
    # TRY NOT TO MODIFY: start the game
    envs.close()
    envs = make_envs(env_id, seed)
    obs, _ = envs.reset(seed=args.seed)
    episodic_returns = deque(maxlen=10)
    # online training phase
    for global_step in range(args.total_timesteps):
        global_step += args.offline_steps
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
        actions = act(q_network, obs, epsilon)
        ended = len(timing.episode_returns)
        obs = _step_and_store(envs, obs, actions, rb, timing)
        episodic_returns.extend(timing.episode_returns[ended:])

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                if len(episodic_returns) < 10:
                    distill_coeff = 1.0
                else:
                    distill_coeff = max(1 - np.mean(episodic_returns) / np.mean(teacher_episodic_returns), 0)
                qdagger_update(data, distill_coeff)
            # update the target network
            if global_step % args.target_network_frequency == 0:
                update_target()
        timing.step_done(global_step - args.offline_steps + 1)

    envs.close()
    if trace is not None:
        trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
    return timing
