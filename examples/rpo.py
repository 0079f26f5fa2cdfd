# rpo.py: your own copy of fleetrl's ppo (fleetrl 0.1.0), made by `fleetrl new rpo --from ppo` on 2026-12-06.
# Change anything. Run it: python rpo.py --env-id ENV, torchrun --nproc-per-node 2 rpo.py ..., fleetrl train ./rpo.py ...
# It imports only the engine's public names, listed with what stays stable in fleetrl's docs/engine.md.
"""RPO (Rahman & Xue, 2022), CleanRL's rpo_continuous_action.py: PPO whose update evaluates the actions under a Gaussian
mean moved by U(-rpo_alpha, rpo_alpha) noise per element; the rollout samples from the policy unchanged.
(Discrete actions have no mean to move: they train as PPO.)

Order: arguments, networks, the rollout loop, the advantage recurrence, the loss, then training: setup, and each
iteration's rollout, advantages, update and logging. The engine (vector envs, the sampler that schedules the envs,
rollout buffer, normalisation, checkpoints, monitoring) is called in a few lines each.

Differences from CleanRL, each on purpose:
* time-limit truncation bootstraps from the value of the final observation;
* episode statistics come from the env layer, so Atari reports the unclipped full-game score;
* observation/reward normalisation statistics live here (one set for all envs) and are checkpointed;
* checkpoints are atomic and checksummed; SIGTERM/Ctrl-C checkpoint and stop; a resumed run continues the same
  learner and RNG streams on fresh episodes (``--resume``, docs/reliability.md).
* RPO's defaults are CleanRL's rpo_continuous_action.py's where they differ from its PPO's (exp_name "rpo", 8M steps
  on MuJoCo); the noise is drawn as CleanRL draws it (float32 from torch's CPU generator, then moved to the device).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl import config, optim
from fleetrl.accel import autocast
from fleetrl.algos.source import train_main
from fleetrl.args import ONPOLICY_RANGES, OnPolicyArgs, validate_onpolicy
from fleetrl.distributed import Dist
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import (ImpalaCNN, NatureCNN, categorical_logprob_entropy, categorical_sample, explained_variance,
                          gaussian_logprob_entropy, gaussian_sample, layer_init, mlp)
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer
from fleetrl.sampling.rollout import RolloutBuffer
from fleetrl.sampling.sampler import Due, Sampler, local_async_batch


# ============================================================================ arguments
@dataclass
class Args(OnPolicyArgs):
    """CleanRL's flags (experiment, then PPO's), then the engine's (fleetrl/args.py); None: the env family's default."""

    exp_name: str = "rpo"
    """the name of this experiment"""
    total_timesteps: int | None = None
    """total timesteps of the experiments [500k classic control, 10M Atari, 8M MuJoCo]"""
    num_envs: int | None = None
    """the number of parallel game environments [4; Atari 8; MuJoCo 1]"""
    # Algorithm specific arguments; None: the env family's default (FAMILY_DEFAULTS)
    learning_rate: float | None = None
    """the learning rate of the optimizer [2.5e-4; MuJoCo 3e-4]"""
    num_steps: int | None = None
    """the number of steps to run in each environment per policy rollout [128; MuJoCo 2048]"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float | None = None
    """the discount factor gamma [0.99; Procgen 0.999]"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int | None = None
    """the number of mini-batches [4; MuJoCo 32]"""
    update_epochs: int | None = None
    """the K epochs to update the policy [4; MuJoCo 10]"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float | None = None
    """the surrogate clipping coefficient [0.2; Atari 0.1]"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float | None = None
    """coefficient of the entropy [0.01; MuJoCo 0.0]"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    normalize: bool | None = None
    """normalise observations and rewards with running statistics [on for MuJoCo, off otherwise]"""
    rpo_alpha: float = 0.5
    """the alpha parameter for RPO"""


FAMILY_DEFAULTS = {  # CleanRL's ppo.py, ppo_atari.py and rpo_continuous_action.py
    "classic": dict(total_timesteps=500_000, learning_rate=2.5e-4, num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4, clip_coef=0.2, ent_coef=0.01),
    "atari": dict(total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8, num_steps=128, num_minibatches=4, update_epochs=4, clip_coef=0.1, ent_coef=0.01, frame_stack=4),
    "mujoco": dict(total_timesteps=8_000_000, learning_rate=3e-4, num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, clip_coef=0.2, ent_coef=0.0, normalize=True),
    "procgen": dict(total_timesteps=25_000_000, learning_rate=5e-4, num_envs=64, num_steps=256, num_minibatches=8, update_epochs=3, clip_coef=0.2, ent_coef=0.01, gamma=0.999),
}
for _defaults in FAMILY_DEFAULTS.values():
    _defaults.setdefault("gamma", 0.99)
    _defaults.setdefault("normalize", False)


# what each numeric flag accepts (after the family defaults are filled), checked before anything starts
RANGES = {
    **ONPOLICY_RANGES,
    "learning_rate": config.positive("the optimizer's step size", config.COEF_MAX),
    "num_steps": config.count("steps each env takes per rollout"),
    "gamma": config.fraction("the discount factor"),
    "gae_lambda": config.fraction("the GAE lambda"),
    "num_minibatches": config.count("minibatches each batch is split into"),
    "update_epochs": config.count("passes over each batch"),
    "clip_coef": config.positive("the surrogate clipping range", config.COEF_MAX),
    "ent_coef": config.non_negative("the weight of the entropy bonus", config.COEF_MAX),
    "vf_coef": config.non_negative("the weight of the value loss", config.COEF_MAX),
    "max_grad_norm": config.positive("the gradient norm clipping threshold", config.COEF_MAX),
    "rpo_alpha": config.non_negative("the bound of the uniform noise on the Gaussian mean in the update", config.COEF_MAX),
    "target_kl": config.positive("the KL divergence that stops an update early", config.COEF_MAX, optional=True,
                                 hint="Leave it out to never stop early."),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts. ``world_size``: the torchrun
    processes, each of which holds ``--num-envs / world_size`` envs and splits its own batch into minibatches."""
    validate_onpolicy(args, world_size, RANGES)  # the common flags, and the sampler's and precision's
    local_num_envs = args.num_envs // world_size
    batch_size, local_batch_size = args.num_envs * args.num_steps, local_num_envs * args.num_steps
    if local_batch_size % args.num_minibatches:
        held = f" (each of the {world_size} processes holds {local_batch_size})" if world_size > 1 else ""
        raise FleetError(f"The batch of --num-envs {args.num_envs} x --num-steps {args.num_steps} = {batch_size} samples{held} does not "
                         f"split into --num-minibatches {args.num_minibatches} whole minibatches. Choose --num-minibatches that divides "
                         f"{local_batch_size} (e.g. {', '.join(map(str, config.divisors(local_batch_size)))}), or change --num-envs/--num-steps.")
    if args.norm_adv and batch_size // args.num_minibatches < 2:  # the std of one sample is undefined: a NaN loss
        raise FleetError(
            f"--num-minibatches {args.num_minibatches} leaves 1 sample per minibatch (a batch of {batch_size}), and advantage "
            f"normalisation divides by each minibatch's standard deviation, which needs at least 2. Use fewer minibatches, "
            f"more --num-envs/--num-steps, or --no-norm-adv."
        )
    if args.total_timesteps < batch_size:
        raise FleetError(f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size}); raise it.")


# ============================================================================ networks
class Agent(nn.Module):
    """Actor-critic. Vector observations: separate 64-64 tanh MLPs for actor and critic.
    Images: a shared Nature CNN (Atari) or IMPALA CNN (Procgen). Continuous actions: a Gaussian with a state-independent log-std.
    ``rpo_alpha``: the bound of RPO's noise on the Gaussian mean in ``evaluate`` (the update) only."""

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, impala: bool = False, rpo_alpha: float = 0.0):
        super().__init__()
        self.rpo_alpha = rpo_alpha
        self.continuous = isinstance(action_space, gym.spaces.Box)
        num_outputs = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if len(obs_shape) == 3:
            self.trunk: nn.Module = ImpalaCNN(obs_shape) if impala else NatureCNN(obs_shape[0])
            self.actor = layer_init(nn.Linear(self.trunk.out_dim, num_outputs), std=0.01)
            self.critic = layer_init(nn.Linear(self.trunk.out_dim, 1), std=1.0)
        else:
            self.trunk = nn.Identity()
            self.actor = mlp(int(np.prod(obs_shape)), num_outputs, out_std=0.01)
            self.critic = mlp(int(np.prod(obs_shape)), 1, out_std=1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, num_outputs))
        self.compute_dtype = torch.float32  # set by the engine's precision choice (fleetrl/accel.py)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actor output (logits or Gaussian mean) and value, in fp32 whatever the network ran in."""
        with autocast(x.device.type, self.compute_dtype):  # --precision: only the network runs in bf16
            hidden = self.trunk(x)
            return self.actor(hidden).float(), self.critic(hidden).float().squeeze(-1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        with autocast(x.device.type, self.compute_dtype):
            return self.critic(self.trunk(x)).float().squeeze(-1)

    def evaluate(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Update: log-probability and entropy of a minibatch's actions, and the values of its observations."""
        out, value, action = *self(mb["obs"]), mb["actions"]
        if self.continuous:  # new to RPO: the mean moves by U(-alpha, alpha), drawn as CleanRL does (float32, CPU RNG)
            out = out + torch.FloatTensor(out.shape).uniform_(-self.rpo_alpha, self.rpo_alpha).to(out.device)
            logprob, entropy = gaussian_logprob_entropy(out, self.actor_logstd, action)
        else:
            logprob, entropy = categorical_logprob_entropy(out, action)
        return logprob, entropy, value

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy interface (fleetrl/policy.py), for evaluation: the Gaussian mean or the most likely action, or a
        sample. (Training rollouts sample in the engine, fleetrl/sampling/acting.py, from the same forward.)"""
        out, _ = self(x)
        if deterministic:
            return out if self.continuous else out.argmax(-1)
        return (gaussian_sample(out, self.actor_logstd) if self.continuous else categorical_sample(out))[0]


# ============================================================================ rollout
def rollout(steps: Iterable[Due]) -> None:
    """CleanRL's rollout loop: ``--num-steps`` times, every env acts on its observation and steps.

    The sampler decides which envs are due at each turn: all of them (CleanRL's serial loop), one of two groups that
    step while the other acts (the zero-lag split, the same batch), or the first K ready (``--async-batch``); with
    ``--policy-lag 1`` it runs this loop in its own thread while the learner trains (docs/sampling.md). Rewards, dones,
    the final observations' values at time limits and the episodes are stored when the envs' results arrive."""
    for due in steps:  # envs whose next action is due, with their observations
        action, logprob, value = due.actor.act(due.obs, due.noise)  # the acting copy of the agent samples
        due.store(obs=due.obs, actions=action, logprobs=logprob, values=value)
        due.send(action)  # the envs step (in the background where the backend can)


# ============================================================================ advantage
def gae(b: RolloutBuffer, gamma: float, gae_lambda: float) -> np.ndarray:
    """Generalised advantage estimation over a ``(T, N)`` rollout, backwards, as CleanRL's recurrence.

    The value after transition t is: 0 if the episode terminated there; the value of the final observation if it was
    truncated there (a time limit is not the end of the task, so it bootstraps, unlike CleanRL); otherwise the value
    of the env's next observation. The advantage trace stops at every episode end. ``env_ids``: with first-ready
    batches row t holds the envs that arrived t-th, so each env carries its own next value and trace through the rows
    (its last transition bootstraps from ``last_values[env]``); else column i is env i."""
    next_value = np.array(b.last_values, dtype=np.float64)  # per env: the value after its latest transition seen
    trace = np.zeros_like(next_value)  # per env: the advantage of its next transition
    advantages = np.zeros_like(b.values)
    for t in reversed(range(b.rewards.shape[0])):
        env = slice(None) if b.env_ids is None else b.env_ids[t]
        after = np.where(b.dones[t], b.final_values[t], next_value[env]) * (1.0 - b.terminated[t])
        delta = b.rewards[t] + gamma * after - b.values[t]
        trace[env] = delta + (1.0 - b.dones[t]) * (gamma * gae_lambda) * trace[env]
        advantages[t] = trace[env]
        next_value[env] = b.values[t]
    return advantages


# ============================================================================ loss
def ppo_loss(agent: Agent, mb: dict[str, torch.Tensor], args: Args, dist: Dist) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate objective, the (clipped) value loss and the entropy bonus on one minibatch.

    Under torchrun each rank holds 1/W of the global minibatch; advantages are normalised with
    all-reduced figures, so the averaged gradient is the gradient of the global minibatch.
    """
    newlogprob, entropy, newvalue = agent.evaluate(mb)
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    mb_advantages = mb["advantages"]
    if args.norm_adv:
        mb_advantages = dist.normalize(mb_advantages)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb["returns"]) ** 2
        v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - mb["returns"]) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = {"value_loss": v_loss, "policy_loss": pg_loss, "entropy": entropy_loss,
             "old_approx_kl": old_approx_kl, "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, {k: v.detach() for k, v in stats.items()}


# ============================================================================ update
def minibatches(batch: dict[str, torch.Tensor], num_steps: int, num_minibatches: int) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of CleanRL's minibatches: the rollout's transitions shuffled, in ``num_minibatches`` slices."""
    n = len(batch["obs"])
    b_inds = torch.randperm(n, device=batch["obs"].device)
    shuffled = {k: v[b_inds] for k, v in batch.items()}  # one gather per epoch; minibatches are views
    for start in range(0, n, n // num_minibatches):
        yield {k: v[start : start + n // num_minibatches] for k, v in shuffled.items()}


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None, *, algo: str = "rpo", family_defaults: dict = FAMILY_DEFAULTS,
          validate: Callable = validate, agent_type: type = Agent, rollout: Callable = rollout,
          minibatches: Callable = minibatches) -> TrainResult:
    """Train RPO, in one process or under torchrun. ``explicit``: the flags given on the command line
    (they win over a resumed run's saved arguments). The keywords are what a variant changes (fleetrl/algos/ppo_lstm.py:
    a recurrent agent, a rollout that carries its state, minibatches of whole env sequences)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # torchrun, resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, family_defaults, validate, algo=algo, lag_worker="sampler thread") as run:
        args, dist, device, family = run.args, run.dist, run.device, run.family
        batch_size = args.num_envs * args.num_steps  # global, over all ranks
        local_batch_size = run.local_num_envs * args.num_steps
        local_minibatch_size = local_batch_size // args.num_minibatches  # each rank's 1/W of a global minibatch
        num_iterations = args.total_timesteps // batch_size

        async_batch = local_async_batch(args.async_batch, args.num_envs, run.local_num_envs)  # None: every env each step
        envs = run.make_envs(async_batch=async_batch, frame_stack=args.frame_stack)
        obs_shape = envs.single_observation_space.shape
        agent = agent_type(obs_shape, envs.single_action_space, impala=family.name == "procgen", rpo_alpha=args.rpo_alpha).to(device)
        dist.broadcast_parameters(agent)  # every replica starts from rank 0's parameters
        # precision and memory format: measured once on this machine (or as the resumed run had them), explained
        accel = run.choose_accel(agent, envs.single_observation_space, local_minibatch_size)
        loss_fn = accel.compiled(ppo_loss, agent, dist)  # torch.compile with --compile (eager if it fails), else ppo_loss
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # one kernel for all params
        grad_sync = dist.gradient_sync(agent.parameters())  # averages gradients over ranks, overlapping backward
        run.register(model=agent, optimizer=optimizer)  # what checkpoints hold, besides every rank's RNG streams
        # --normalize (MuJoCo's default): one set of observation and reward statistics for all envs of all ranks
        # (their sums are all-reduced every step, or once an iteration with --policy-lag 1)
        obs_norm = ObsNormalizer(obs_shape, dist.allreduce_sum_np) if args.normalize else None
        reward_norm = RewardNormalizer(run.local_num_envs, args.gamma, dist.allreduce_sum_np) if args.normalize else None
        if args.normalize:
            run.register(obs_rms=obs_norm.rms, reward_rms=reward_norm.rms)
        log = run.start_logging(envs, num_iterations, batch_size, notes={"precision": f"{accel.label}: {accel.reason}"})

        # the rollout engine: acting weights, sampling RNG, buffers; serial, split, first-ready or one update behind
        sampler = run.closing(Sampler(envs, agent, args.num_steps, rollout=rollout, device=device, seed=run.seed, env_seed=run.env_seed,
                                      timer=log.timer, actor_device=args.actor_device, saved_actor_device=run.remembered("actor_device"),
                                      policy_lag=args.policy_lag, async_batch=async_batch, obs_norm=obs_norm, reward_norm=reward_norm,
                                      global_step=run.global_step, global_envs=args.num_envs, verbose=dist.is_main))  # closing: its thread, the envs
        run.remember(actor_device=sampler.acts_on)  # where auto acts, measured once (or as the resumed run did): a resume keeps it
        run.register_per_rank(actor=sampler)  # each rank's sampling noise
        run.restore()  # a resumed run: its model, optimiser, statistics and RNG streams, exactly as they were

        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ---------------------------------------------------------------- rollout
            buffer = sampler.collect()  # rollout() above, num_steps x num_envs transitions (or the one a sampler thread ran)

            # ---------------------------------------------------------------- advantage
            with log.timer.learn:
                buffer.advantages[:] = gae(buffer, args.gamma, args.gae_lambda)
                buffer.returns[:] = buffer.advantages + buffer.values

            # ---------------------------------------------------------------- update
            with log.timer.learn:
                agent.train()
                batch = {k: v.to(device) for k, v in buffer.flat().items()}
                clipfracs = []
                for epoch in range(args.update_epochs):
                    for mb in minibatches(batch, args.num_steps, args.num_minibatches):  # this rank's 1/W of each
                        loss, stats = loss_fn(agent, mb, args, dist)
                        optimizer.zero_grad()
                        grad_sync.backward(loss)  # under torchrun, gradients are averaged over ranks as backward goes
                        # wait for the averaged gradients; the loss and KL too, so every rank decides alike
                        loss_and_kl = grad_sync.finish(torch.stack([loss.detach(), stats["approx_kl"]]))
                        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                        optimizer.step()
                        clipfracs.append(stats["clipfrac"])
                    if args.target_kl is not None and loss_and_kl[1] > args.target_kl:
                        break
            sampler.weights_updated()  # the acting weights follow the learner: a versioned copy, swapped between rollouts

            # ---------------------------------------------------------------- logging
            stats["clipfrac"], stats["loss"] = torch.stack(clipfracs).mean(), loss_and_kl[0]  # a non-finite loss stops the run
            stats["explained_variance"] = explained_variance(buffer.values.ravel(), buffer.returns.ravel(), dist.allreduce_sum_np)
            run.end_iteration(iteration, buffer.global_step, buffer.episodes, losses=stats,  # and SPS, perf, resources, checkpoints
                          charts={"learning_rate": optimizer.param_groups[0]["lr"], "policy_lag": sampler.policy_lag})
        return run.finish(agent)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``, with the saved normalisation statistics frozen."""
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space, impala=state.get("family") == "procgen")
    agent.load_state_dict(state["model"])
    return policy_fn(agent, envs, deterministic, obs_rms=state.get("obs_rms"))


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
