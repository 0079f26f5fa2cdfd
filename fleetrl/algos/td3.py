"""Twin Delayed DDPG (TD3) for continuous actions, read top to bottom as CleanRL's td3_continuous_action.py.

Order: arguments, networks, then training: setup, the update (critics with target policy smoothing, then every
--policy-frequency steps the actor on qf1 and the targets), the loop (act with exploration noise, step, store,
update), logging. The engine (vector envs, replay buffer, checkpoints, monitoring, torchrun) is called in a line each.

Differences from CleanRL, each on purpose:
* a time-limit truncation is not a terminal state: the replay buffer keeps the true final observation to bootstrap from;
* the twin critics are one batched network (fleetrl/nets_continuous.py), and the actor loss backpropagates into the
  action only, not into qf1's parameters (CleanRL fills their gradients and never uses them);
* exploration noise is drawn for each env (CleanRL draws one vector for all), target actions are clipped to each
  dimension's own bounds (CleanRL: the first dimension's), and warm-up actions come from the run's numpy RNG;
* under torchrun every rank has envs and a replay shard of its own, samples its share of --batch-size, and the
  critic and actor gradients are all-reduced before each step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fleetrl import config, optim
from fleetrl.algos.source import train_main
from fleetrl.args import OFFPOLICY_RANGES, OffPolicyArgs, validate_offpolicy
from fleetrl.monitor import TrainResult
from fleetrl.nets_continuous import HIDDEN, TwinQNetwork, add_action_rescaling, relu_trunk, twin_q_loss
from fleetrl.offpolicy import STEPS_PER_ITERATION, learning_starts, make_replay, num_iterations
from fleetrl.offpolicy import optimizer_step, soft_update, step_envs, uniform_actions
from fleetrl.policy import policy_fn
from fleetrl.run import Run


# ============================================================================ arguments
@dataclass
class DeterministicArgs(OffPolicyArgs):
    """The flags TD3 shares with DDPG (fleetrl/algos/ddpg.py), CleanRL's names and defaults for both."""

    env_id: str = "Hopper-v5"
    """the id of the environment (a Box action space; `module.path:EnvId-v0` imports your module first)"""
    learning_rate: float = 3e-4
    """the learning rate of the actor's and the critics' optimizers"""
    exploration_noise: float = 0.1
    """the std of the Gaussian noise added to the actor's actions while training, in half action ranges"""
    policy_frequency: int = 2
    """update the actor and the target networks every this many steps (delayed policy updates)"""


@dataclass
class Args(DeterministicArgs):
    exp_name: str = "td3"
    """the name of this experiment"""
    policy_noise: float = 0.2
    """the std of the noise added to the target policy's actions (target policy smoothing), in half action ranges"""
    noise_clip: float = 0.5
    """the bound of the target policy smoothing noise, in half action ranges"""


FAMILY_DEFAULTS = {  # CleanRL's td3_continuous_action.py; continuous control only
    "mujoco": dict(total_timesteps=1_000_000, num_envs=1, buffer_size=1_000_000, tau=0.005, batch_size=256, learning_starts=25_000),
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

DETERMINISTIC_RANGES = {  # DDPG's too
    **OFFPOLICY_RANGES,
    "learning_rate": config.positive("the optimizers' step size", config.COEF_MAX),
    "exploration_noise": config.non_negative("the std of the exploration noise, in half action ranges", config.COEF_MAX),
    "policy_frequency": config.count("steps between policy and target updates"),
}
RANGES = {
    **DETERMINISTIC_RANGES,
    "policy_noise": config.non_negative("the std of the target policy's smoothing noise, in half action ranges", config.COEF_MAX),
    "noise_clip": config.non_negative("the bound of the target policy's smoothing noise", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1, ranges: dict = RANGES) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    validate_offpolicy(args, world_size, ranges)


# ============================================================================ networks
class Actor(nn.Module):
    """A deterministic policy: 256-256 ReLU, tanh, rescaled onto the action bounds. Acting adds Gaussian
    exploration noise of std ``exploration_noise`` half action ranges."""

    def __init__(self, envs, exploration_noise: float = 0.1):
        super().__init__()
        self.trunk = relu_trunk(envs)  # fc1, fc2
        self.fc_mu = nn.Linear(HIDDEN, int(np.prod(envs.single_action_space.shape)))
        add_action_rescaling(self, envs.single_action_space)
        self.exploration_noise = exploration_noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc_mu(self.trunk(x))) * self.action_scale + self.action_bias

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy interface (fleetrl/policy.py): the action, plus exploration noise unless deterministic (unclipped)."""
        actions = self(x)
        if not deterministic:  # CleanRL's torch.normal(0, action_scale * exploration_noise), bit for bit, for each env
            actions += torch.randn_like(actions) * (self.action_scale * self.exploration_noise)
        return actions


# ============================================================================ the critics' target
def td3_target(args: Args, target_actor: Actor, qf_target: TwinQNetwork, data, low_t: torch.Tensor,
               high_t: torch.Tensor) -> torch.Tensor:
    """The TD target: the target actor's action plus clipped noise (target policy smoothing), within the bounds, and
    the lesser of the twin target critics' values of it (clipped double Q)."""
    clipped_noise = (torch.randn_like(data.actions) * args.policy_noise).clamp(
        -args.noise_clip, args.noise_clip
    ) * target_actor.action_scale
    next_state_actions = (target_actor(data.next_obs) + clipped_noise).clamp(low_t, high_t)
    min_qf_next_target = qf_target(data.next_obs, next_state_actions).min(0).values
    return data.rewards + (1 - data.dones) * args.gamma * min_qf_next_target


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None, *, algo: str = "td3", family_defaults: dict = FAMILY_DEFAULTS,
          validate: Callable = validate, num_critics: int = 2, target: Callable = td3_target) -> TrainResult:
    """Train TD3, in one process or under torchrun; ``explicit``: the flags given (they win over a resumed run's).

    DDPG (fleetrl/algos/ddpg.py) trains here too, with its own ``algo``, ``family_defaults`` and ``validate``, one
    critic (``num_critics``) and its ``target`` (the TD target, from the batch and the target networks)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # torchrun, resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, family_defaults, validate, algo=algo, wide_network=True) as run:
        args, dist, device = run.args, run.dist, run.device
        envs = run.make_envs()  # this rank's envs; discrete actions were refused here
        low, high = envs.single_action_space.low, envs.single_action_space.high

        actor = Actor(envs, args.exploration_noise).to(device)
        qf = TwinQNetwork(envs, num_critics=num_critics).to(device)  # qf1 and qf2 (DDPG: qf1)
        dist.broadcast_parameters(actor)  # every replica starts from rank 0's parameters
        dist.broadcast_parameters(qf)
        target_actor, qf_target = copy.deepcopy(actor), copy.deepcopy(qf)
        q_optimizer = optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True)
        actor_optimizer = optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
        q_sync, actor_sync = dist.gradient_sync(qf.parameters()), dist.gradient_sync(actor.parameters())
        run.register(actor=actor, qf=qf, target_actor=target_actor, qf_target=qf_target,
                     q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

        rb = make_replay(run, envs)  # this rank's shard of --buffer-size transitions
        learn_from = learning_starts(run)
        log = run.start_logging(envs, num_iterations(args), args.num_envs * STEPS_PER_ITERATION)
        run.restore()  # a resumed run: networks, optimisers and RNG streams, exactly as they were
        low_t, high_t = torch.as_tensor(low, device=device), torch.as_tensor(high, device=device)
        local_batch_size = args.batch_size // dist.world_size  # each rank's share of the global batch

        def update(data, step: int) -> dict[str, torch.Tensor]:
            """One critic update; every --policy-frequency steps one actor update and the targets."""
            with torch.no_grad():
                next_q_value = target(args, target_actor, qf_target, data, low_t, high_t)
            qf_loss, stats = twin_q_loss(qf, data.obs, data.actions, next_q_value)

            optimizer_step(q_optimizer, q_sync, qf_loss)  # optimize the model (gradients averaged over ranks)

            if step % args.policy_frequency == 0:
                actor_loss = -qf(data.obs, actor(data.obs), critics=slice(0, 1), frozen=True).mean()  # qf1 only
                optimizer_step(actor_optimizer, actor_sync, actor_loss)
                stats["actor_loss"] = actor_loss.detach()

                # update the target networks
                soft_update(target_actor, actor, args.tau)
                soft_update(qf_target, qf, args.tau)
            return stats

        # ------------------------------------------------------------------------ the loop
        obs, _ = envs.reset(seed=run.env_seed)
        global_step, losses = run.global_step, {}
        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            episodes = []  # (global step, return, length) finished on this rank
            for _ in range(STEPS_PER_ITERATION):
                # ALGO LOGIC: put action logic here. global_step counts the env steps taken before this one (all envs
                # of all ranks), as CleanRL's loop variable: warm-up below --learning-starts, updates after it
                with log.timer.inference:
                    if global_step < args.learning_starts:
                        actions = uniform_actions(envs.single_action_space, run.local_num_envs)
                    else:
                        with torch.inference_mode():  # the actor's action plus Gaussian exploration noise, clipped
                            actions = actor.act(torch.as_tensor(obs, dtype=torch.float32, device=device), deterministic=False)
                            actions = actions.cpu().numpy().clip(low, high)

                # TRY NOT TO MODIFY: execute the game, save data to the replay buffer, record finished episodes
                obs = step_envs(envs, rb, obs, actions, global_step + args.num_envs, episodes, log.timer)  # logged at the steps done

                # ALGO LOGIC: training.
                if global_step > learn_from:
                    with log.timer.learn:
                        losses.update(update(rb.sample(local_batch_size), global_step // args.num_envs))
                global_step += args.num_envs

            run.end_iteration(iteration, global_step, episodes, losses=losses)
        return run.finish(nn.ModuleDict(dict(actor=actor, qf=qf)))  # under torchrun: replicas checked bit-identical


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: the actor's action, plus exploration noise unless deterministic."""
    actor = Actor(envs, state["args"].get("exploration_noise", 0.1))
    actor.load_state_dict(state["actor"])
    return policy_fn(actor.eval(), envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
