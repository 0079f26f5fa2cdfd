"""Soft Actor-Critic for continuous actions, read top to bottom as CleanRL's sac_continuous_action.py.

Order: arguments, networks, then training: setup, the update (critics, then every --policy-frequency steps as many
actor and entropy-coefficient updates, then the targets), the loop (act, step, store, update), logging. The engine
(vector envs, replay buffer, checkpoints, monitoring, torchrun) is called in a line each.

Differences from CleanRL, each on purpose:
* the replay buffer bootstraps through time-limit truncation, from the true final observation;
* qf1 and qf2 are one network running both critics in one batched matmul a layer (fleetrl/nets_continuous.py),
  and the actor loss computes no gradients for their parameters (CleanRL computes them, then zeroes them);
* warm-up actions come from numpy's global RNG, which the run seeds and checkpoints;
* torchrun: each rank steps its own envs into its own replay shard and samples --batch-size / world size from
  it; the critic, actor and alpha gradients are averaged over ranks, so the replicas stay identical.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fleetrl import config, optim
from fleetrl.algos.source import train_main
from fleetrl.args import OFFPOLICY_RANGES, OffPolicyArgs, validate_offpolicy
from fleetrl.monitor import TrainResult
from fleetrl.nets import gaussian_sample
from fleetrl.nets_continuous import HIDDEN, TwinQNetwork, add_action_rescaling, relu_trunk, twin_q_loss
from fleetrl.offpolicy import STEPS_PER_ITERATION, learning_starts, make_replay, num_iterations
from fleetrl.offpolicy import optimizer_step, soft_update, step_envs, uniform_actions
from fleetrl.policy import policy_fn
from fleetrl.run import Run


# ============================================================================ arguments
@dataclass
class Args(OffPolicyArgs):
    exp_name: str = "sac"
    """the name of this experiment"""
    env_id: str = "Hopper-v5"
    """the id of the environment, with continuous actions (`module.path:EnvId-v0` imports your module first)"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network's optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q networks' optimizer (and of the entropy coefficient's, with --autotune)"""
    policy_frequency: int = 2
    """update the policy every this many steps, this many times (delayed updates that keep the update ratio)"""
    target_network_frequency: int = 1  # Denis Yarats' implementation delays this by 2.
    """update the target networks every this many steps"""
    alpha: float = 0.2
    """the entropy regularization coefficient (its start value is 1 with --autotune)"""
    autotune: bool = True
    """tune the entropy coefficient automatically, towards an entropy of -(action dimensions)"""


FAMILY_DEFAULTS = {  # CleanRL's sac_continuous_action.py; continuous control only
    "mujoco": dict(total_timesteps=1_000_000, num_envs=1, buffer_size=1_000_000, tau=0.005, batch_size=256, learning_starts=5_000),
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = {
    **OFFPOLICY_RANGES,
    "policy_lr": config.positive("the policy optimizer's step size", config.COEF_MAX),
    "q_lr": config.positive("the Q networks' (and the entropy coefficient's) optimizer step size", config.COEF_MAX),
    "policy_frequency": config.count("steps between policy updates (each time this many are made)"),
    "target_network_frequency": config.count("steps between target network updates"),
    "alpha": config.non_negative("the entropy regularization coefficient (without --autotune)", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    validate_offpolicy(args, world_size, RANGES)


# ============================================================================ networks
LOG_STD_MAX = 2
LOG_STD_MIN = -5


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy: 256-256 ReLU, a mean and a state-dependent log-std in [-5, 2]."""

    def __init__(self, envs):
        super().__init__()
        action_dim = int(np.prod(envs.single_action_space.shape))
        self.trunk = relu_trunk(envs)  # fc1, fc2
        self.fc_mean = nn.Linear(HIDDEN, action_dim)
        self.fc_logstd = nn.Linear(HIDDEN, action_dim)
        add_action_rescaling(self, envs.single_action_space)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(x)
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # From SpinUp / Denis Yarats
        return mean, log_std

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample (mean + std * N(0, 1), squashed) and its log-probability, shape (B,)."""
        mean, log_std = self(x)
        x_t, log_prob = gaussian_sample(mean, log_std)
        y_t = torch.tanh(x_t)
        log_prob = log_prob - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6).sum(-1)  # Enforcing Action Bound
        return y_t * self.action_scale + self.action_bias, log_prob

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy interface (fleetrl/policy.py): a sample, or the squashed mean."""
        if deterministic:
            return torch.tanh(self(x)[0]) * self.action_scale + self.action_bias
        return self.get_action(x)[0]


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train SAC, in one process or under torchrun. ``explicit``: the flags given on the command line
    (they win over a resumed run's saved arguments)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # torchrun, resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="sac", wide_network=True) as run:
        args, dist, device = run.args, run.dist, run.device
        envs = run.make_envs()  # this rank's envs; discrete actions were refused here
        local_batch_size = args.batch_size // dist.world_size  # each rank's share of the global batch

        actor = Actor(envs).to(device)
        qf = TwinQNetwork(envs).to(device)  # qf1 and qf2
        dist.broadcast_parameters(actor)  # every replica starts from rank 0's parameters
        dist.broadcast_parameters(qf)
        qf_target = copy.deepcopy(qf)
        q_optimizer = optim.Adam(qf.parameters(), lr=args.q_lr, fused=True)
        actor_optimizer = optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True)
        q_sync, actor_sync = dist.gradient_sync(qf.parameters()), dist.gradient_sync(actor.parameters())
        run.register(actor=actor, qf=qf, qf_target=qf_target, q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

        # Automatic entropy tuning
        target_entropy = -float(np.prod(envs.single_action_space.shape))
        log_alpha = nn.Parameter(torch.zeros(1, device=device))
        if args.autotune:
            a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, fused=True)
            alpha_sync = dist.gradient_sync([log_alpha])
            run.register(log_alpha=nn.ParameterList([log_alpha]), a_optimizer=a_optimizer)

        rb = make_replay(run, envs)  # this rank's shard of --buffer-size transitions
        learn_from = learning_starts(run)
        log = run.start_logging(envs, num_iterations(args), args.num_envs * STEPS_PER_ITERATION)
        run.restore()  # a resumed run: networks, optimisers, alpha and RNG streams, exactly as they were
        alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)

        def update(data, step: int) -> dict[str, torch.Tensor]:
            """One critic update; every --policy-frequency steps as many actor (and alpha) updates; the targets."""
            with torch.no_grad():
                next_state_actions, next_state_log_pi = actor.get_action(data.next_obs)
                min_qf_next_target = qf_target(data.next_obs, next_state_actions).min(0).values - alpha * next_state_log_pi
                next_q_value = data.rewards + (1 - data.dones) * args.gamma * min_qf_next_target
            qf_loss, stats = twin_q_loss(qf, data.obs, data.actions, next_q_value)

            optimizer_step(q_optimizer, q_sync, qf_loss)  # optimize the model (gradients averaged over ranks)

            if step % args.policy_frequency == 0:  # TD 3 Delayed update support
                for _ in range(args.policy_frequency):  # compensate for the delay by doing 'actor_update_interval' instead of 1
                    pi, log_pi = actor.get_action(data.obs)
                    min_qf_pi = qf(data.obs, pi, frozen=True).min(0).values  # no gradient for the critics
                    actor_loss = (alpha * log_pi - min_qf_pi).mean()
                    optimizer_step(actor_optimizer, actor_sync, actor_loss)
                    stats["actor_loss"] = actor_loss.detach()

                    if args.autotune:
                        with torch.no_grad():
                            _, log_pi = actor.get_action(data.obs)
                        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
                        optimizer_step(a_optimizer, alpha_sync, alpha_loss)
                        alpha.copy_(log_alpha.detach().exp())
                        stats["alpha_loss"] = alpha_loss.detach()

            # update the target networks
            if step % args.target_network_frequency == 0:
                soft_update(qf_target, qf, args.tau)
            return stats

        # ------------------------------------------------------------------------ the loop
        global_step, losses = run.global_step, {}
        obs, _ = envs.reset(seed=run.env_seed)
        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            episodes = []  # (global step, return, length) finished on this rank
            for _ in range(STEPS_PER_ITERATION):
                # ALGO LOGIC: put action logic here. global_step counts the env steps taken before this one (all envs
                # of all ranks), as CleanRL's loop variable: uniformly random actions below --learning-starts
                with log.timer.inference, torch.inference_mode():
                    x = torch.as_tensor(obs, dtype=torch.float32, device=device)
                    explore = global_step < args.learning_starts
                    actions = uniform_actions(envs.single_action_space, run.local_num_envs) if explore else actor.get_action(x)[0].cpu().numpy()

                # TRY NOT TO MODIFY: execute the game, save data to the replay buffer, record finished episodes
                obs = step_envs(envs, rb, obs, actions, global_step + args.num_envs, episodes, log.timer)  # logged at the steps done

                # ALGO LOGIC: training.
                if global_step > learn_from:
                    with log.timer.learn:
                        losses.update(update(rb.sample(local_batch_size), global_step // args.num_envs))
                global_step += args.num_envs

            run.end_iteration(iteration, global_step, episodes, losses={**losses, "alpha": alpha} if losses else {})
        return run.finish(nn.ModuleDict(dict(actor=actor, qf=qf)))  # under torchrun: replicas checked bit-identical


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: the squashed mean (deterministic) or a sample."""
    actor = Actor(envs)
    actor.load_state_dict(state["actor"])
    return policy_fn(actor.eval(), envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
