"""fleetrl's PPG against CleanRL's ppg_procgen.py (issue 36, item 3): its update code in lockstep, speed, and learning
against fleetrl's own PPO.

    python benchmarks/ppg_vs_cleanrl.py --lockstep
    python benchmarks/ppg_vs_cleanrl.py --speed --env-id StarpilotEasy-v0 --num-envs 16 --n-iteration 4 --steps 32768 --repeats 3
    python benchmarks/ppg_vs_cleanrl.py --learn --env-id StarpilotEasy-v0 --seeds 1-3 --steps 2000000

``--lockstep`` compares the update code, as the issue asks (CleanRL's script runs the old procgen package, which does
not install here): ``fleetrl.algos.ppg.train`` runs a short job on EnvPool's Procgen, recorded at its engine calls
(each iteration's batch, its raw advantages, the minibatch order, the auxiliary phase's rollout order, every loss and
the weights after each phase). CleanRL's update code, as its file writes it (the policy phase's minibatch loop, the
rollout storage, the auxiliary phase; its Agent imported from benchmarks/cleanrl/ppg_procgen.py), then runs on the same
batches in the same order from the same seed, given fleetrl's deliberate differences as switches: fused Adam and the
auxiliary phase's zeroed gradients. It reports the first place the two part and by how much: the initial weights are
identical (the same seed makes the same network), and the rest differs only by rounding, because fleetrl's log-probability
and entropy (``fleetrl.nets.categorical_logprob_entropy``, not ``torch.distributions``) and its whole-batch advantage
normalisation (float64, over all ranks) round differently. tests/test_ppg.py bounds those differences in ``make test``.

``--speed`` runs CleanRL's script (benchmarks/cleanrl/ppg_procgen.py, on EnvPool) and ``fleetrl train ppg`` side by
side (benchmarks/cleanrl_side_by_side.py), with the same ``--num-envs`` and ``--n-iteration``. ``--learn`` runs
``fleetrl train ppg`` and ``fleetrl train ppo`` at equal steps (their Procgen defaults but ``--num-envs``), one seed
each turn, and compares them with ``fleetrl compare``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cleanrl_side_by_side as side_by_side  # noqa: E402
from cleanrl_side_by_side import Sides  # noqa: E402

CLEANRL_PPG = os.path.join(HERE, "cleanrl", "ppg_procgen.py")
# a short job: 2 phases of 2 iterations, 4 envs x 32 steps, 2 minibatches, 2 auxiliary epochs of 2-rollout minibatches
LOCKSTEP = dict(num_envs=4, num_steps=32, num_minibatches=2, n_iteration=2, e_auxiliary=2, num_aux_rollouts=2, total_timesteps=4 * 32 * 4)


@dataclass
class Record:
    """One side's run: the initial weights, each iteration's batch, raw advantages and minibatch order, each auxiliary
    epoch's rollout order, every optimiser step's loss, and the weights after each phase."""

    initial: dict[str, Any] = field(default_factory=dict)
    batches: list[dict[str, Any]] = field(default_factory=list)
    raw_advantages: list[Any] = field(default_factory=list)
    normalized_advantages: list[Any] = field(default_factory=list)
    orders: list[Any] = field(default_factory=list)
    aux_orders: list[np.ndarray] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    aux_losses: list[float] = field(default_factory=list)
    phase_weights: list[list[Any]] = field(default_factory=list)


def fleetrl_record(env_id: str, seed: int) -> Record:
    """fleetrl's PPG on ``LOCKSTEP``'s job, recorded where its loop calls the engine."""
    import torch

    from fleetrl.algos import ppg, ppo
    from fleetrl.distributed import Dist

    record = Record()
    real = (torch.randperm, np.random.shuffle, Dist.normalize, ppo.ppo_loss, ppg.AuxiliaryPhase.__init__, ppg.AuxiliaryPhase.after_update,
            ppg.AuxiliaryPhase.distil, torch.Tensor.backward)
    randperm, shuffle, normalize, ppo_loss, aux_init, aux_call, distil, backward = real
    in_distil = [False]

    def record_randperm(n, *args, **kwargs):
        order = randperm(n, *args, **kwargs)
        record.orders.append(order.clone())
        return order

    def record_shuffle(x):
        shuffle(x)
        record.aux_orders.append(np.array(x))

    def record_normalize(self, x, *args, **kwargs):
        record.raw_advantages.append(x.clone())
        record.normalized_advantages.append(normalize(self, x, *args, **kwargs))
        return record.normalized_advantages[-1]

    def record_loss(*args, **kwargs):
        loss, stats = ppo_loss(*args, **kwargs)
        record.losses.append(loss.item())
        return loss, stats

    def record_init(self, run, agent, *args):
        record.initial = {k: v.clone() for k, v in agent.state_dict().items()}
        aux_init(self, run, agent, *args)

    def record_call(self, iteration, batch):
        record.batches.append({k: v.clone() for k, v in batch.items()})
        return aux_call(self, iteration, batch)

    def record_distil(self, rollouts):
        in_distil[0] = True
        try:
            stats = distil(self, rollouts)
        finally:
            in_distil[0] = False
        record.phase_weights.append([p.detach().clone() for p in self.agent.parameters()])
        return stats

    def record_backward(self, *args, **kwargs):
        if in_distil[0]:
            record.aux_losses.append(self.item())
        return backward(self, *args, **kwargs)

    torch.randperm, np.random.shuffle, Dist.normalize, ppo.ppo_loss = record_randperm, record_shuffle, record_normalize, record_loss
    ppg.AuxiliaryPhase.__init__, ppg.AuxiliaryPhase.after_update, ppg.AuxiliaryPhase.distil = record_init, record_call, record_distil
    torch.Tensor.backward = record_backward
    try:
        with tempfile.TemporaryDirectory() as runs:
            ppg.train(ppg.Args(env_id=env_id, seed=seed, torch_threads=1, cuda=False, env_backend="envpool", progress=False, precision="fp32",
                               memory_format="contiguous",  # CleanRL's layout: channels-last rounds convolutions its own way
                               actor_device="cpu", run_dir=os.path.join(runs, "run"), **LOCKSTEP))
    finally:
        torch.randperm, np.random.shuffle, Dist.normalize, ppo.ppo_loss = real[:4]
        ppg.AuxiliaryPhase.__init__, ppg.AuxiliaryPhase.after_update, ppg.AuxiliaryPhase.distil, torch.Tensor.backward = real[4:]
    return record


def cleanrl_replay(ours: Record, seed: int, fused_adam: bool = True, zeroed_aux_grads: bool = True, fleetrl_advantages: bool = False,
                   fleetrl_logprobs: bool = False) -> Record:
    """CleanRL's ppg_procgen.py update code on fleetrl's batches, in fleetrl's orders: its policy phase, rollout
    storage and auxiliary phase as its file writes them, with the switches above. Two more give it fleetrl's rounding:
    ``fleetrl_advantages`` (fleetrl's normalised advantages) and ``fleetrl_logprobs`` (log-probabilities and entropy by
    ``fleetrl.nets.categorical_logprob_entropy``)."""
    from types import SimpleNamespace

    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.optim as optim
    from torch import distributions as td
    from torch.distributions.categorical import Categorical

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from ppg_procgen import Agent, Args, flatten01, unflatten01  # CleanRL's, from its file (benchmarks/cleanrl/)

    args = Args(seed=seed, **{k: v for k, v in LOCKSTEP.items()})
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    args.num_phases = int(args.num_iterations // args.n_iteration)
    args.aux_batch_rollouts = int(args.num_envs * args.n_iteration)
    obs_shape = tuple(ours.batches[0]["obs"].shape[1:])
    envs = SimpleNamespace(single_observation_space=gym.spaces.Box(0, 255, obs_shape, np.uint8),
                           single_action_space=gym.spaces.Discrete(len(ours.initial["actor.bias"])))
    theirs = Record()
    torch.manual_seed(seed)  # TRY NOT TO MODIFY: seeding (fleetrl's run seeds torch alike before it makes its agent)
    agent = Agent(envs)
    if fleetrl_logprobs:  # fleetrl: the same quantities, computed as fleetrl.nets computes them
        from fleetrl.nets import categorical_logprob_entropy

        def get_action_and_value(x, action):
            hidden = agent.network(x / 255.0)
            logprob, entropy = categorical_logprob_entropy(agent.actor(hidden), action)
            return action, logprob, entropy, agent.critic(hidden.detach())

        agent.get_action_and_value = get_action_and_value
    theirs.initial = dict(zip(ours.initial, (p.detach().clone() for p in agent.state_dict().values())))
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-8, **({"fused": True} if fused_adam else {}))
    aux_obs = torch.zeros((args.num_steps, args.aux_batch_rollouts) + obs_shape, dtype=torch.uint8)  # Saves lot system RAM
    aux_returns = torch.zeros((args.num_steps, args.aux_batch_rollouts))
    iteration, aux_epoch = 0, 0
    for phase in range(1, args.num_phases + 1):
        # POLICY PHASE
        for update in range(1, args.n_iteration + 1):
            batch = ours.batches[iteration]
            b_obs, b_actions, b_logprobs = batch["obs"].float(), batch["actions"], batch["logprobs"]
            b_returns, b_values = batch["returns"], batch["values"]
            b_advantages = ours.raw_advantages[iteration]
            # PPG code does full batch advantage normalization
            if args.adv_norm_fullbatch:
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
            if fleetrl_advantages:  # fleetrl: its float64 statistics (over all ranks)
                b_advantages = ours.normalized_advantages[iteration]

            # Optimizing the policy and value network
            for epoch in range(args.e_policy):
                b_inds = ours.orders[iteration].numpy()  # fleetrl: its minibatch order (torch's RNG, not numpy's shuffle)
                for start in range(0, args.batch_size, args.minibatch_size):
                    end = start + args.minibatch_size
                    mb_inds = b_inds[start:end]

                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    mb_advantages = b_advantages[mb_inds]

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    newvalue = newvalue.view(-1)
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                    theirs.losses.append(loss.item())

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            # PPG Storage - Rollouts are saved without flattening for sampling full rollouts later:
            storage_slice = slice(args.num_envs * (update - 1), args.num_envs * update)
            aux_obs[:, storage_slice] = unflatten01(batch["obs"], (args.num_steps, args.num_envs))
            aux_returns[:, storage_slice] = unflatten01(b_returns, (args.num_steps, args.num_envs))
            iteration += 1

        # AUXILIARY PHASE
        aux_inds = np.arange(args.aux_batch_rollouts)

        # Build the old policy on the aux buffer before distilling to the network
        aux_pi = torch.zeros((args.num_steps, args.aux_batch_rollouts, envs.single_action_space.n))
        for i, start in enumerate(range(0, args.aux_batch_rollouts, args.num_aux_rollouts)):
            end = start + args.num_aux_rollouts
            aux_minibatch_ind = aux_inds[start:end]
            m_aux_obs = aux_obs[:, aux_minibatch_ind].to(torch.float32)
            m_obs_shape = m_aux_obs.shape
            m_aux_obs = flatten01(m_aux_obs)
            with torch.no_grad():
                pi_logits = agent.get_pi(m_aux_obs).logits.cpu().clone()
            aux_pi[:, aux_minibatch_ind] = unflatten01(pi_logits, m_obs_shape[:2])

        if zeroed_aux_grads:  # fleetrl: the policy phase's last gradients are not carried into the first auxiliary step
            optimizer.zero_grad()
        for auxiliary_update in range(1, args.e_auxiliary + 1):
            aux_inds = ours.aux_orders[aux_epoch].copy()  # fleetrl: its order (CleanRL: np.random.shuffle(aux_inds))
            aux_epoch += 1
            for i, start in enumerate(range(0, args.aux_batch_rollouts, args.num_aux_rollouts)):
                end = start + args.num_aux_rollouts
                aux_minibatch_ind = aux_inds[start:end]
                m_aux_obs = aux_obs[:, aux_minibatch_ind]
                m_aux_obs = flatten01(m_aux_obs)  # Sample full rollouts for PPG instead of random indexes
                m_aux_returns = aux_returns[:, aux_minibatch_ind].to(torch.float32)
                m_aux_returns = flatten01(m_aux_returns)

                new_pi, new_values, new_aux_values = agent.get_pi_value_and_aux_value(m_aux_obs)

                new_values = new_values.view(-1)
                new_aux_values = new_aux_values.view(-1)
                old_pi_logits = flatten01(aux_pi[:, aux_minibatch_ind])
                old_pi = Categorical(logits=old_pi_logits)
                kl_loss = td.kl_divergence(old_pi, new_pi).mean()

                real_value_loss = 0.5 * ((new_values - m_aux_returns) ** 2).mean()
                aux_value_loss = 0.5 * ((new_aux_values - m_aux_returns) ** 2).mean()
                joint_loss = aux_value_loss + args.beta_clone * kl_loss

                loss = (joint_loss + real_value_loss) / args.n_aux_grad_accum
                theirs.aux_losses.append(loss.item())
                loss.backward()

                if (i + 1) % args.n_aux_grad_accum == 0:
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()  # This cannot be outside, else gradients won't accumulate
        theirs.phase_weights.append([p.detach().clone() for p in agent.parameters()])
    return theirs


def compare(ours: Record, theirs: Record) -> dict[str, str]:
    """Each record: "identical", or the largest difference, relative for losses and absolute for weights."""
    gap = side_by_side.gap
    verdicts = {"initial weights": gap(list(ours.initial.values()), list(theirs.initial.values()), False),
                "policy-phase losses": gap(ours.losses, theirs.losses, True),
                "auxiliary losses": gap(ours.aux_losses, theirs.aux_losses, True)}
    for phase, (mine, other) in enumerate(zip(ours.phase_weights, theirs.phase_weights), 1):
        verdicts[f"weights after phase {phase}"] = gap(mine, other, False)
    return verdicts


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_record(opts.env_id, opts.seed)
    return side_by_side.both_roundings(
        f"lockstep (the update code), {opts.env_id}, seed {opts.seed}, {LOCKSTEP}",
        lambda fleetrl_rounding: compare(ours, cleanrl_replay(ours, opts.seed, fleetrl_advantages=fleetrl_rounding, fleetrl_logprobs=fleetrl_rounding)))


# ============================================================================ subprocess runs: speed and learning
def budget(env_id: str, opts: argparse.Namespace) -> list[str]:
    return ["--num-envs", str(opts.num_envs), "--n-iteration", str(opts.n_iteration)]


SIDES = Sides("ppg", CLEANRL_PPG, "ppg_procgen.py", budget, backend="envpool")
PPO = Sides("ppo", "", "", lambda env_id, opts: ["--num-envs", str(opts.num_envs)], backend="envpool")


def learn_against_ppo(opts: argparse.Namespace) -> None:
    """``fleetrl train ppg`` and ``fleetrl train ppo`` at equal steps, each seed, alternating, then ``fleetrl compare``."""
    import shlex
    import subprocess

    low, _, high = opts.seeds.partition("-")
    for i, seed in enumerate(range(int(low), int(high or low) + 1)):
        for sides in ((SIDES, PPO) if i % 2 == 0 else (PPO, SIDES)):
            r = side_by_side.run_one(sides, sides.algo, opts.env_id, seed, opts, "learn")
            print(f"{sides.algo} {opts.env_id} seed {seed}: last-20 mean {r['score']:.2f} ({r['episodes']} episodes), "
                  f"{r['wall_s'] / 60:.1f} min", flush=True)
    out = os.path.abspath(opts.out)
    compare = [sys.executable, "-m", "fleetrl", "compare", os.path.join(out, "learn", "ppg", opts.env_id),
               os.path.join(out, "learn", "ppo", opts.env_id), "--labels", "fleetrl ppg", "fleetrl ppo",
               "--out", os.path.join(out, "compare", opts.env_id)]
    print(f"$ {shlex.join(compare)}", flush=True)
    subprocess.run(compare, check=True)


def main() -> None:
    parser = side_by_side.parser(__doc__, "StarpilotEasy-v0", 65536, 0, "ppg_vs_cleanrl")
    parser.add_argument("--n-iteration", type=int, default=32, help="PPG's policy iterations per phase (both PPGs)")
    parser.add_argument("--num-envs", type=int, default=64, help="envs, every side")
    opts = parser.parse_args()
    if opts.lockstep:
        lockstep(opts)
    elif opts.speed:
        side_by_side.speed(SIDES, opts)
    else:
        learn_against_ppo(opts)


if __name__ == "__main__":
    main()
