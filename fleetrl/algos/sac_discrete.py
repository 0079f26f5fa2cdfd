"""Soft Actor-Critic for discrete actions, Atari and classic control, read top to bottom as CleanRL's sac_atari.py.

Order: arguments, networks, then training: setup, the update (the twin soft Q-functions against the expected soft
value of the next state, then the categorical actor and the entropy coefficient, every --update-frequency steps; a
target copy every --target-network-frequency steps), the loop (act, step, store, update), logging. The engine
(vector envs, replay buffer, checkpoints, monitoring, torchrun) is called in a line each.

Differences from CleanRL, each on purpose:
* classic control too: the same loss on an MLP (120-84 ReLU, CleanRL's DQN width) in place of the Nature CNN;
* the replay buffer keeps each Atari frame once (a 1M buffer in under 8 GB) and bootstraps through time-limit
  truncation from the true final observation, as CleanRL's buffer does with ``handle_timeout_termination=False``;
* the update and target cadences count global steps (all envs of all ranks): with one env they fall on CleanRL's steps;
* warm-up actions come from numpy's global RNG, which the run seeds and checkpoints; Adam is fused (one kernel: the
  same update, rounded differently); alpha stays a tensor (CleanRL's ``.item()`` waits for the GPU every update);
* under torchrun each rank steps its own envs into its own replay shard and samples --batch-size / world size from
  it; the critic, actor and alpha gradients are averaged over ranks, so the replicas stay identical.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions.categorical import Categorical

from fleetrl import config, optim
from fleetrl.algos.source import train_main
from fleetrl.args import OFFPOLICY_RANGES, OffPolicyArgs, validate_offpolicy
from fleetrl.monitor import TrainResult
from fleetrl.nets import kaiming_init, mlp, nature_convs, network_input
from fleetrl.offpolicy import STEPS_PER_ITERATION, learning_starts, make_replay, num_iterations
from fleetrl.offpolicy import optimizer_step, soft_update, step_envs, times_due, uniform_actions
from fleetrl.policy import policy_fn
from fleetrl.run import Run


# ============================================================================ arguments
@dataclass
class Args(OffPolicyArgs):
    exp_name: str = "sac_discrete"
    """the name of this experiment"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment, with discrete actions (`module.path:EnvId-v0` imports your module first)"""
    total_timesteps: int | None = None
    """total timesteps of the experiments [Atari 5M; classic control 100k]"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 3e-4
    """the learning rate of the Q network network optimizer (and of the entropy coefficient's, with --autotune)"""
    update_frequency: int | None = None
    """the frequency of training updates [4]"""
    target_network_frequency: int | None = None
    """the frequency of updates for the target networks [Atari 8000; classic control 500]"""
    alpha: float = 0.2
    """Entropy regularization coefficient (its start value is 1 with --autotune)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""
    target_entropy_scale: float = 0.89
    """coefficient for scaling the autotune entropy target (of the uniform policy's entropy, log of the number of actions)"""


FAMILY_DEFAULTS = {  # CleanRL's sac_atari.py; classic control: its loss on an MLP, with the budget and cadences scaled down
    "atari": dict(total_timesteps=5_000_000, num_envs=1, buffer_size=1_000_000, tau=1.0, batch_size=64, learning_starts=20_000,
                  update_frequency=4, target_network_frequency=8000),
    "classic": dict(total_timesteps=100_000, num_envs=1, buffer_size=100_000, tau=1.0, batch_size=64, learning_starts=5_000,
                    update_frequency=4, target_network_frequency=500),
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = {
    **OFFPOLICY_RANGES,
    "policy_lr": config.positive("the policy optimizer's step size", config.COEF_MAX),
    "q_lr": config.positive("the Q networks' (and the entropy coefficient's) optimizer step size", config.COEF_MAX),
    "update_frequency": config.count("steps between updates"),
    "target_network_frequency": config.count("steps between target network updates"),
    "alpha": config.non_negative("the entropy regularization coefficient (without --autotune)", config.COEF_MAX),
    "target_entropy_scale": config.non_negative("the entropy target, as a fraction of the uniform policy's entropy", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    validate_offpolicy(args, world_size, RANGES)


# ============================================================================ networks
# NOTE: Sharing a CNN encoder between Actor and Critics is not recommended for SAC without stopping actor gradients
# (SAC+AE, https://arxiv.org/abs/1910.01741): the actor's gradients mess up the representation. Each has its own.
def discrete_head_network(obs_shape: tuple[int, ...], num_actions: int) -> nn.Sequential:
    """One output per action, every layer Kaiming-initialised as CleanRL's: on stacked uint8 frames the Nature CNN
    (convolutions, 512 ReLU, the head; the caller scales the frames); on vectors an MLP 120-84 ReLU."""
    if len(obs_shape) == 3:
        convs, flat = nature_convs(obs_shape[0], obs_shape[1], init=kaiming_init)
        return nn.Sequential(convs, kaiming_init(nn.Linear(flat, 512)), nn.ReLU(), kaiming_init(nn.Linear(512, num_actions)))
    return mlp(obs_shape[0], num_actions, hidden=(120, 84), activation=nn.ReLU, init=kaiming_init)


def scaled(x: torch.Tensor) -> torch.Tensor:
    """Atari's uint8 frames in [0, 1]; other observations as they are."""
    return x / 255.0 if x.dtype == torch.uint8 else x


class SoftQNetwork(nn.Module):
    """Q(s, .): one soft Q-value per action."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int):
        super().__init__()
        self.network = discrete_head_network(obs_shape, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(scaled(x))


class Actor(nn.Module):
    """A categorical policy over the actions, from logits."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int):
        super().__init__()
        self.network = discrete_head_network(obs_shape, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(scaled(x))

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, and every action's log-probability and probability (the adapted soft-Q loss uses them)."""
        logits = self(x)
        policy_dist = Categorical(logits=logits)
        action = policy_dist.sample()
        return action, F.log_softmax(logits, dim=1), policy_dist.probs

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy interface (fleetrl/policy.py): the most probable action, or a sample."""
        return self(x).argmax(dim=1) if deterministic else self.get_action(x)[0]


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train discrete SAC, in one process or under torchrun. ``explicit``: the flags given on the command line
    (they win over a resumed run's saved arguments)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # torchrun, resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="sac_discrete") as run:
        args, dist, device = run.args, run.dist, run.device
        envs = run.make_envs()  # this rank's envs; continuous actions were refused here
        obs_shape, num_actions = envs.single_observation_space.shape, int(envs.single_action_space.n)
        local_batch_size = args.batch_size // dist.world_size  # each rank's share of the global batch

        actor = Actor(obs_shape, num_actions).to(device)
        qf1, qf2 = SoftQNetwork(obs_shape, num_actions).to(device), SoftQNetwork(obs_shape, num_actions).to(device)
        for network in (actor, qf1, qf2):
            dist.broadcast_parameters(network)  # every replica starts from rank 0's parameters
        qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
        q_params = list(qf1.parameters()) + list(qf2.parameters())
        # TRY NOT TO MODIFY: eps=1e-4 increases numerical stability
        q_optimizer = optim.Adam(q_params, lr=args.q_lr, eps=1e-4, fused=True)
        actor_optimizer = optim.Adam(actor.parameters(), lr=args.policy_lr, eps=1e-4, fused=True)
        q_sync, actor_sync = dist.gradient_sync(q_params), dist.gradient_sync(actor.parameters())
        run.register(actor=actor, qf1=qf1, qf2=qf2, qf1_target=qf1_target, qf2_target=qf2_target,
                     q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

        # Automatic entropy tuning: towards a fraction of the uniform policy's entropy
        target_entropy = (-args.target_entropy_scale * torch.log(1 / torch.tensor(num_actions))).to(device)
        log_alpha = nn.Parameter(torch.zeros(1, device=device))
        if args.autotune:
            a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, eps=1e-4, fused=True)
            alpha_sync = dist.gradient_sync([log_alpha])
            run.register(log_alpha=nn.ParameterList([log_alpha]), a_optimizer=a_optimizer)

        rb = make_replay(run, envs)  # this rank's shard of --buffer-size transitions (Atari frames kept once)
        learn_from = learning_starts(run)
        log = run.start_logging(envs, num_iterations(args), args.num_envs * STEPS_PER_ITERATION)
        run.restore()  # a resumed run: networks, optimisers, alpha and RNG streams, exactly as they were
        alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)

        def update(data) -> dict[str, torch.Tensor]:
            """The twin critics, then the actor and alpha, on one sampled batch."""
            # CRITIC training
            with torch.no_grad():
                _, next_state_log_pi, next_state_action_probs = actor.get_action(data.next_obs)
                qf1_next_target, qf2_next_target = qf1_target(data.next_obs), qf2_target(data.next_obs)
                # we can use the action probabilities instead of MC sampling to estimate the expectation
                min_qf_next_target = next_state_action_probs * (torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi)
                min_qf_next_target = min_qf_next_target.sum(dim=1)  # adapt Q-target for discrete Q-function
                next_q_value = data.rewards + (1 - data.dones) * args.gamma * min_qf_next_target

            # use Q-values only for the taken actions
            taken = data.actions.long().unsqueeze(1)
            qf1_a_values, qf2_a_values = qf1(data.obs).gather(1, taken).view(-1), qf2(data.obs).gather(1, taken).view(-1)
            qf1_loss, qf2_loss = F.mse_loss(qf1_a_values, next_q_value), F.mse_loss(qf2_a_values, next_q_value)
            qf_loss = qf1_loss + qf2_loss
            optimizer_step(q_optimizer, q_sync, qf_loss)  # optimize the model (gradients averaged over ranks)

            # ACTOR training: no reparameterization, the expectation over the actions is computed exactly
            _, log_pi, action_probs = actor.get_action(data.obs)
            with torch.no_grad():
                min_qf_values = torch.min(qf1(data.obs), qf2(data.obs))
            actor_loss = (action_probs * ((alpha * log_pi) - min_qf_values)).mean()
            optimizer_step(actor_optimizer, actor_sync, actor_loss)

            stats = dict(qf1_values=qf1_a_values.detach().mean(), qf2_values=qf2_a_values.detach().mean(), qf1_loss=qf1_loss.detach(),
                         qf2_loss=qf2_loss.detach(), qf_loss=qf_loss.detach() / 2.0, actor_loss=actor_loss.detach())
            if args.autotune:  # reuse action probabilities for temperature loss
                alpha_loss = (action_probs.detach() * (-log_alpha.exp() * (log_pi + target_entropy).detach())).mean()
                optimizer_step(a_optimizer, alpha_sync, alpha_loss)
                alpha.copy_(log_alpha.detach().exp())
                stats["alpha_loss"] = alpha_loss.detach()
            return stats

        # ------------------------------------------------------------------------ the loop
        global_step, losses = run.global_step, {}  # global_step: env steps taken before this one, all envs of all ranks
        obs, _ = envs.reset(seed=run.env_seed)
        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            episodes = []  # (global step, return, length) finished on this rank
            for _ in range(STEPS_PER_ITERATION):
                # ALGO LOGIC: put action logic here: uniformly random actions below --learning-starts, then the policy's samples
                with log.timer.inference, torch.inference_mode():
                    explore = global_step < args.learning_starts
                    x = torch.as_tensor(network_input(obs), device=device)  # Atari frames stay bytes: the networks scale them
                    actions = uniform_actions(envs.single_action_space, run.local_num_envs) if explore else actor.get_action(x)[0].cpu().numpy()

                # TRY NOT TO MODIFY: execute the game, save data to the replay buffer, record finished episodes
                obs = step_envs(envs, rb, obs, actions, global_step + args.num_envs, episodes, log.timer)  # logged at the steps done

                # ALGO LOGIC: training.
                if global_step > learn_from:
                    with log.timer.learn:
                        for _ in range(times_due(global_step, args.num_envs, args.update_frequency)):
                            losses.update(update(rb.sample(local_batch_size)))
                        if times_due(global_step, args.num_envs, args.target_network_frequency):  # update the target networks
                            soft_update(qf1_target, qf1, args.tau)
                            soft_update(qf2_target, qf2, args.tau)
                global_step += args.num_envs

            run.end_iteration(iteration, global_step, episodes, losses={**losses, "alpha": alpha} if losses else {})
        return run.finish(nn.ModuleDict(dict(actor=actor, qf1=qf1, qf2=qf2)))  # under torchrun: replicas checked bit-identical


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: the most probable action (deterministic) or a sample."""
    actor = Actor(envs.single_observation_space.shape, int(envs.single_action_space.n))
    actor.load_state_dict(state["actor"])
    return policy_fn(actor.eval(), envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
