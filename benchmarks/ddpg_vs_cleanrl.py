"""fleetrl's DDPG against CleanRL's ddpg_continuous_action.py (issue 36, item 1): a lockstep trace of the two loops.

    python benchmarks/ddpg_vs_cleanrl.py --lockstep --steps 3000 --learning-starts 1000 --seed 1
    python benchmarks/ddpg_vs_cleanrl.py --speed --env-id HalfCheetah-v5 --steps 12000 --learning-starts 2000 --repeats 3
    python benchmarks/ddpg_vs_cleanrl.py --learn --env-id InvertedPendulum-v5 --seeds 1-10 --steps 100000 --learning-starts 10000

``--lockstep``: fleetrl's loop (``fleetrl.algos.ddpg.train``, which runs TD3's loop with one critic; recorded at its
engine calls) beside CleanRL's ddpg_continuous_action.py loop (``plain_ddpg`` below: its networks, acting, target,
losses, Adam steps and soft updates as its file writes them, on benchmarks/plain_offpolicy.py's SB3-style buffer and
gymnasium 1.x's same-step autoreset). CleanRL's loop is given fleetrl's three differences, each a switch:
``fleetrl_draws`` (warm-up actions from numpy's global RNG, not the action space's own), ``copied_targets`` (the target
networks deep-copied, not built and loaded: the same weights without drawing torch's RNG for discarded ones) and
``fused_adam``. Both then take the same actions, updates and target updates, with the same losses, bit for bit; the
first place they part is printed. tests/test_ddpg.py runs it in ``make test``.

``--speed`` and ``--learn`` run CleanRL's own script (benchmarks/cleanrl/ddpg_continuous_action.py: its file with
gymnasium 1.x's changes) and ``fleetrl train ddpg`` as subprocesses, one at a time, alternating sides, one torch thread
each, pinned with ``taskset -c --cpu``, with the same ``--total-timesteps`` and ``--learning-starts``. Speed: CleanRL's
``charts/SPS`` (steps over the seconds since its loop began; fleetrl's is the same measure) and steps over the whole
process's wall time, start-up included. Learning: each run's TensorBoard folder goes to OUT/learn/SIDE/ENV/, and
``fleetrl compare`` reads them (a run's score: the mean of its last episodes' returns).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cleanrl_side_by_side as side_by_side  # noqa: E402
from cleanrl_side_by_side import Sides, Trace, compare, print_verdicts, renamed  # noqa: E402

CLEANRL_DDPG = os.path.join(HERE, "cleanrl", "ddpg_continuous_action.py")


@dataclass
class DDPGArgs:  # ddpg_continuous_action.py's defaults
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    exploration_noise: float = 0.1
    policy_frequency: int = 2


def plain_ddpg(env_id: str, steps: int, learning_starts: int, seed: int = 1, args: DDPGArgs = DDPGArgs(), trace: Trace | None = None,
               fleetrl_draws: bool = False, copied_targets: bool = False, fused_adam: bool = False) -> Trace:
    """CleanRL's ddpg_continuous_action.py loop for ``steps`` env steps, with the switches above."""
    import torch
    import torch.nn.functional as F
    import torch.optim as optim

    import plain_offpolicy
    from plain_offpolicy import ReplayBuffer, _seed, _soft_update, make_envs

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from ddpg_continuous_action import Actor, QNetwork  # CleanRL's networks, from its file (benchmarks/cleanrl/)

    trace = Trace() if trace is None else trace
    _seed(seed)
    device = torch.device("cpu")
    envs = make_envs(env_id, seed)
    timing = plain_offpolicy.Timing("ddpg", env_id, steps, learning_starts, torch.get_num_threads())

    actor = Actor(envs).to(device)
    qf1 = QNetwork(envs).to(device)
    if copied_targets:  # fleetrl: copies, drawing nothing
        qf1_target, target_actor = copy.deepcopy(qf1), copy.deepcopy(actor)
    else:
        qf1_target = QNetwork(envs).to(device)
        target_actor = Actor(envs).to(device)
        target_actor.load_state_dict(actor.state_dict())
        qf1_target.load_state_dict(qf1.state_dict())
    fused = {"fused": True} if fused_adam else {}
    q_optimizer = optim.Adam(list(qf1.parameters()), lr=args.learning_rate, **fused)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate, **fused)

    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=seed)
    space = envs.single_action_space
    for global_step in range(steps):
        # ALGO LOGIC: put action logic here
        if global_step < learning_starts:
            if fleetrl_draws:  # fleetrl: numpy's global RNG (fleetrl.offpolicy.uniform_actions)
                actions = np.random.uniform(space.low, space.high, (envs.num_envs, *space.low.shape)).astype(space.dtype)
            else:
                actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(envs.single_action_space.low, envs.single_action_space.high)
        trace.actions.append(np.array(actions[0]))

        # TRY NOT TO MODIFY: execute the game and log data; save data to reply buffer; handle `final_observation`
        next_obs = plain_offpolicy._step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                next_state_actions = target_actor(data.next_observations)
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (qf1_next_target).view(-1)

            qf1_a_values = qf1(data.observations, data.actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
            trace.update_steps.append(global_step)
            trace.losses.append(qf1_loss.item())

            # optimize the model
            q_optimizer.zero_grad()
            qf1_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(actor_loss.item())
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                # update the target network (CleanRL's loop over the parameters: plain_offpolicy._soft_update)
                _soft_update(args.tau, (actor, target_actor), (qf1, qf1_target))
                trace.target_steps.append(global_step)

    envs.close()
    trace.final_params = {**{f"actor.{k}": v.clone() for k, v in actor.state_dict().items()},
                          **{f"qf1.{k}": v.clone() for k, v in qf1.state_dict().items()},
                          **{f"target_actor.{k}": v.clone() for k, v in target_actor.state_dict().items()},
                          **{f"qf1_target.{k}": v.clone() for k, v in qf1_target.state_dict().items()}}
    return trace


# fleetrl's module names of CleanRL's: the actor's are the same but for the trunk; the critic is critics.0
FLEETRL_NAMES = {"actor.trunk.0.": "actor.fc1.", "actor.trunk.2.": "actor.fc2.", "qf.critics.0.": "qf1.",
                 "target_actor.trunk.0.": "target_actor.fc1.", "target_actor.trunk.2.": "target_actor.fc2.",
                 "qf_target.critics.0.": "qf1_target."}


def fleetrl_trace(env_id: str, steps: int, learning_starts: int, seed: int = 1) -> Trace:
    """fleetrl's DDPG run, recorded at the engine calls TD3's loop makes (fleetrl/algos/td3.py): each step's action
    (``step_envs``), each optimiser step's loss (``optimizer_step``), each soft update (``soft_update``, two a time:
    the actor's target, then the critic's)."""
    from fleetrl import checkpoint
    from fleetrl.algos import ddpg, td3

    trace = Trace()
    calls = (td3.step_envs, td3.optimizer_step, td3.soft_update)
    step_envs, optimizer_step, soft_update = calls

    def record_step(envs, rb, obs, actions, *rest):
        trace.actions.append(np.array(actions[0]))
        return step_envs(envs, rb, obs, actions, *rest)

    def record_update(optimizer, sync, loss):
        trace.update_steps.append(len(trace.actions) - 1)
        trace.losses.append(loss.item())
        return optimizer_step(optimizer, sync, loss)

    def record_target(target, source, tau):
        if isinstance(target, td3.Actor):  # once per target update: the actor's comes first
            trace.target_steps.append(len(trace.actions) - 1)
        return soft_update(target, source, tau)

    td3.step_envs, td3.optimizer_step, td3.soft_update = record_step, record_update, record_target
    try:
        with tempfile.TemporaryDirectory() as runs:
            ddpg.train(ddpg.Args(env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts, torch_threads=1,
                                 cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run")))
            state = checkpoint.load_checkpoint(os.path.join(runs, "run"))
    finally:
        td3.step_envs, td3.optimizer_step, td3.soft_update = calls
    trace.final_params = renamed({part: state[part] for part in ("actor", "qf", "target_actor", "qf_target")}, FLEETRL_NAMES)
    return trace


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_trace(opts.env_id, opts.steps, opts.learning_starts, opts.seed)
    theirs = plain_ddpg(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, fleetrl_draws=True, copied_targets=True,
                        fused_adam=True)
    verdicts = compare(ours, theirs)
    print_verdicts(f"lockstep, {opts.env_id}, seed {opts.seed}, {opts.steps:,} steps, learning after step {opts.learning_starts:,}:",
                   verdicts)
    return verdicts


# ============================================================================ subprocess runs: speed and learning
SIDES = Sides("ddpg", CLEANRL_DDPG, "ddpg_continuous_action.py", lambda env_id, opts: ["--learning-starts", str(opts.learning_starts)])


def main() -> None:
    opts = side_by_side.parser(__doc__, "InvertedPendulum-v5", 3000, 1000, "ddpg_vs_cleanrl").parse_args()
    if opts.lockstep:
        lockstep(opts)
    elif opts.speed:
        side_by_side.speed(SIDES, opts)
    else:
        side_by_side.learn(SIDES, opts)


if __name__ == "__main__":
    main()
