"""fleetrl's discrete SAC against CleanRL's sac_atari.py (issue 36, item 2): a lockstep trace of the two loops, speed
and learning.

    python benchmarks/sac_discrete_vs_cleanrl.py --lockstep --steps 3000 --learning-starts 1000 --seed 1
    python benchmarks/sac_discrete_vs_cleanrl.py --speed --env-id BreakoutNoFrameskip-v4 --steps 6000 --learning-starts 2000 --repeats 3
    python benchmarks/sac_discrete_vs_cleanrl.py --learn --env-id CartPole-v1 --seeds 1-10 --steps 100000 --learning-starts 5000

``--lockstep``: fleetrl's loop (``fleetrl.algos.sac_discrete.train``, recorded at its engine calls) beside CleanRL's
sac_atari.py loop (``plain_sac_discrete`` below: its networks, imported from benchmarks/cleanrl/sac_atari.py with the
MLP that file gives vector observations, and its acting, critic, actor and temperature updates and target copies as
its file writes them, on benchmarks/plain_offpolicy.py's SB3-style buffer and gymnasium 1.x's same-step autoreset).
CleanRL's loop is given fleetrl's three differences, each a switch: ``fleetrl_draws`` (warm-up actions from numpy's
global RNG, not the action space's own), ``copied_targets`` (the target networks deep-copied, not built and loaded:
the same weights without drawing torch's RNG for discarded ones) and ``fused_adam``. Both then take the same actions,
updates and target updates, with the same losses, bit for bit; the first place they part is printed.
tests/test_sac_discrete.py runs it in ``make test``.

``--speed`` and ``--learn`` run CleanRL's own script (benchmarks/cleanrl/sac_atari.py) and ``fleetrl train
sac_discrete`` side by side (benchmarks/cleanrl_side_by_side.py), with the same budget and ``--learning-starts``; on
classic control fleetrl's classic buffer and target cadence are given to both (CleanRL's are Atari's), and on Atari a
100k buffer (CleanRL's 1M keeps obs and next obs apart: 53 GB).
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

CLEANRL_SAC_ATARI = os.path.join(HERE, "cleanrl", "sac_atari.py")


@dataclass
class SACArgs:  # sac_atari.py's defaults, with fleetrl's classic-control buffer and target cadence
    buffer_size: int = 100_000
    gamma: float = 0.99
    tau: float = 1.0
    batch_size: int = 64
    policy_lr: float = 3e-4
    q_lr: float = 3e-4
    update_frequency: int = 4
    target_network_frequency: int = 500
    alpha: float = 0.2
    autotune: bool = True
    target_entropy_scale: float = 0.89


def plain_sac_discrete(env_id: str, steps: int, learning_starts: int, seed: int = 1, args: SACArgs = SACArgs(), fleetrl_draws: bool = False,
                       copied_targets: bool = False, fused_adam: bool = False) -> Trace:
    """CleanRL's sac_atari.py loop for ``steps`` env steps, with the switches above."""
    import torch
    import torch.nn.functional as F
    import torch.optim as optim

    import plain_offpolicy
    from plain_offpolicy import ReplayBuffer, _seed, make_envs

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from sac_atari import Actor, SoftQNetwork  # CleanRL's networks, from its file (benchmarks/cleanrl/)

    trace = Trace()
    _seed(seed)
    device = torch.device("cpu")
    envs = make_envs(env_id, seed)
    timing = plain_offpolicy.Timing("sac_discrete", env_id, steps, learning_starts, torch.get_num_threads())

    actor = Actor(envs).to(device)
    qf1 = SoftQNetwork(envs).to(device)
    qf2 = SoftQNetwork(envs).to(device)
    if copied_targets:  # fleetrl: copies, drawing nothing
        qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
    else:
        qf1_target = SoftQNetwork(envs).to(device)
        qf2_target = SoftQNetwork(envs).to(device)
        qf1_target.load_state_dict(qf1.state_dict())
        qf2_target.load_state_dict(qf2.state_dict())
    fused = {"fused": True} if fused_adam else {}
    # TRY NOT TO MODIFY: eps=1e-4 increases numerical stability
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr, eps=1e-4, **fused)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.policy_lr, eps=1e-4, **fused)

    # Automatic entropy tuning
    if args.autotune:
        target_entropy = -args.target_entropy_scale * torch.log(1 / torch.tensor(envs.single_action_space.n))
        log_alpha = torch.zeros(1, requires_grad=True, device=device)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, eps=1e-4, **fused)
    else:
        alpha = args.alpha

    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=seed)
    for global_step in range(steps):
        # ALGO LOGIC: put action logic here
        if global_step < learning_starts:
            if fleetrl_draws:  # fleetrl: numpy's global RNG (fleetrl.offpolicy.uniform_actions)
                actions = np.random.randint(envs.single_action_space.n, size=envs.num_envs)
            else:
                actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            actions, _, _ = actor.get_action(torch.Tensor(obs).to(device))
            actions = actions.detach().cpu().numpy()
        trace.actions.append(np.array(actions[0]))

        # TRY NOT TO MODIFY: execute the game and log data; save data to reply buffer; handle `final_observation`
        next_obs = plain_offpolicy._step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > learning_starts:
            if global_step % args.update_frequency == 0:
                data = rb.sample(args.batch_size)
                # CRITIC training
                with torch.no_grad():
                    _, next_state_log_pi, next_state_action_probs = actor.get_action(data.next_observations)
                    qf1_next_target = qf1_target(data.next_observations)
                    qf2_next_target = qf2_target(data.next_observations)
                    # we can use the action probabilities instead of MC sampling to estimate the expectation
                    min_qf_next_target = next_state_action_probs * (
                        torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
                    )
                    # adapt Q-target for discrete Q-function
                    min_qf_next_target = min_qf_next_target.sum(dim=1)
                    next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (min_qf_next_target)

                # use Q-values only for the taken actions
                qf1_values = qf1(data.observations)
                qf2_values = qf2(data.observations)
                qf1_a_values = qf1_values.gather(1, data.actions.long()).view(-1)
                qf2_a_values = qf2_values.gather(1, data.actions.long()).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
                qf_loss = qf1_loss + qf2_loss
                trace.update_steps.append(global_step)
                trace.losses.append(qf_loss.item())

                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()

                # ACTOR training
                _, log_pi, action_probs = actor.get_action(data.observations)
                with torch.no_grad():
                    qf1_values = qf1(data.observations)
                    qf2_values = qf2(data.observations)
                    min_qf_values = torch.min(qf1_values, qf2_values)
                # no need for reparameterization, the expectation can be calculated for discrete actions
                actor_loss = (action_probs * ((alpha * log_pi) - min_qf_values)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(actor_loss.item())

                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                if args.autotune:
                    # reuse action probabilities for temperature loss
                    alpha_loss = (action_probs.detach() * (-log_alpha.exp() * (log_pi + target_entropy).detach())).mean()
                    trace.update_steps.append(global_step)
                    trace.losses.append(alpha_loss.item())

                    a_optimizer.zero_grad()
                    alpha_loss.backward()
                    a_optimizer.step()
                    alpha = log_alpha.exp().item()

            # update the target networks
            if global_step % args.target_network_frequency == 0:
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                trace.target_steps.append(global_step)

    envs.close()
    for name, network in dict(actor=actor, qf1=qf1, qf2=qf2, qf1_target=qf1_target, qf2_target=qf2_target).items():
        trace.final_params.update({f"{name}.{k}": v.clone() for k, v in network.state_dict().items()})
    return trace


# fleetrl's module names of CleanRL's: fleetrl's MLP is one Sequential; CleanRL's port calls its first layer conv.0
FLEETRL_NAMES = {f"{net}.network.{i}.": f"{net}.{name}." for net in ("actor", "qf1", "qf2", "qf1_target", "qf2_target")
                 for i, name in ((0, "conv.0"), (2, "fc1"), (4, "fc_logits" if net == "actor" else "fc_q"))}


def fleetrl_trace(env_id: str, steps: int, learning_starts: int, seed: int = 1) -> Trace:
    """fleetrl's discrete SAC run, recorded at the engine calls its loop makes (fleetrl/algos/sac_discrete.py): each
    step's action (``step_envs``), each optimiser step's loss (``optimizer_step``), each target update
    (``soft_update``, two a time: qf1's, then qf2's)."""
    from fleetrl import checkpoint
    from fleetrl.algos import sac_discrete

    trace = Trace()
    calls = (sac_discrete.step_envs, sac_discrete.optimizer_step, sac_discrete.soft_update)
    step_envs, optimizer_step, soft_update = calls
    targets = []

    def record_step(envs, rb, obs, actions, *rest):
        trace.actions.append(np.array(actions[0]))
        return step_envs(envs, rb, obs, actions, *rest)

    def record_update(optimizer, sync, loss):
        trace.update_steps.append(len(trace.actions) - 1)
        trace.losses.append(loss.item())
        return optimizer_step(optimizer, sync, loss)

    def record_target(target, source, tau):
        targets.append(target)
        if len(targets) % 2 == 1:  # once per target update: qf1's comes first
            trace.target_steps.append(len(trace.actions) - 1)
        return soft_update(target, source, tau)

    sac_discrete.step_envs, sac_discrete.optimizer_step, sac_discrete.soft_update = record_step, record_update, record_target
    try:
        with tempfile.TemporaryDirectory() as runs:
            sac_discrete.train(sac_discrete.Args(env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts, torch_threads=1,
                                                 cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run")))
            state = checkpoint.load_checkpoint(os.path.join(runs, "run"))
    finally:
        sac_discrete.step_envs, sac_discrete.optimizer_step, sac_discrete.soft_update = calls
    trace.final_params = renamed({part: state[part] for part in ("actor", "qf1", "qf2", "qf1_target", "qf2_target")}, FLEETRL_NAMES)
    return trace


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_trace(opts.env_id, opts.steps, opts.learning_starts, opts.seed)
    theirs = plain_sac_discrete(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, fleetrl_draws=True, copied_targets=True,
                                fused_adam=True)
    verdicts = compare(ours, theirs)
    print_verdicts(f"lockstep, {opts.env_id}, seed {opts.seed}, {opts.steps:,} steps, learning after step {opts.learning_starts:,}:",
                   verdicts)
    return verdicts


# ============================================================================ subprocess runs: speed and learning
ATARI_BUFFER = 100_000


def shared_flags(env_id: str, opts: argparse.Namespace) -> list[str]:
    """Both sides' flags: the budget's start, and on classic control fleetrl's classic defaults (CleanRL's are Atari's)."""
    from fleetrl.algos.sac_discrete import FAMILY_DEFAULTS
    from fleetrl.envs import env_family

    flags = ["--learning-starts", str(opts.learning_starts)]
    if env_family(env_id).name == "classic":
        classic = FAMILY_DEFAULTS["classic"]
        flags += ["--buffer-size", str(classic["buffer_size"]), "--target-network-frequency", str(classic["target_network_frequency"])]
    else:  # CleanRL's 1M-frame buffer holds obs and next obs apart: 53 GB, more than this machine has
        flags += ["--buffer-size", str(ATARI_BUFFER)]
    return flags


SIDES = Sides("sac_discrete", CLEANRL_SAC_ATARI, "sac_atari.py", shared_flags)


def main() -> None:
    opts = side_by_side.parser(__doc__, "CartPole-v1", 3000, 1000, "sac_discrete_vs_cleanrl").parse_args()
    if opts.lockstep:
        lockstep(opts)
    elif opts.speed:
        side_by_side.speed(SIDES, opts)
    else:
        side_by_side.learn(SIDES, opts)


if __name__ == "__main__":
    main()
