"""Phasic Policy Gradient (PPG), discrete actions, Procgen and classic control, read top to bottom as CleanRL's
ppg_procgen.py, on PPO's engine (fleetrl/algos/ppo.py): its rollout, GAE, loss and update are PPO's.

Order: arguments, the network, then the auxiliary phase, then training. A phase is --n-iteration policy iterations
(PPO's, with --e-policy epochs and the advantages normalised over the whole batch), each of whose rollouts is kept;
then the auxiliary phase distils: --e-auxiliary epochs over those rollouts, whole env rollouts a minibatch, in which
the auxiliary value head regresses the returns (training the shared encoder), the value head does too, and a
behavioural-cloning KL keeps the policy where it was before the phase.

Differences from CleanRL, each on purpose (besides PPO's, ppo.py):
* the auxiliary phase starts from zeroed gradients (CleanRL's first auxiliary step adds the last policy minibatch's);
* classic control too, with a 64-64 tanh encoder; EnvPool's Procgen frames come channels first (the old ``procgen``
  package CleanRL uses gives them last and does not install here);
* Adam is fused, the minibatch order comes from torch's RNG, and the advantages are normalised in float64;
* --anneal-lr anneals over the whole run (CleanRL's counts the iteration within the phase);
* the rollouts of a phase are checkpointed with it, so a run stopped mid-phase resumes exactly: each policy
  iteration's rollouts are a tensor of their own, which a checkpoint writes straight from memory, never copied first;
  SIGTERM or Ctrl-C mid-phase writes them only up to --stop-rollouts-gb (a Procgen phase's 6.2 GB take 20-60 s to
  write here, past a scheduler's 30 s grace: benchmarks/costs.py preemption), else stops at once, and the run resumes,
  exactly too, from its last checkpoint (--checkpoint-every falls on phase ends), redoing the phase's iterations.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import distributions as td
from torch import nn
from torch.distributions.categorical import Categorical

from fleetrl import config, onpolicy, optim
from fleetrl.accel import autocast
from fleetrl.algos import ppo
from fleetrl.algos.source import train_main
from fleetrl.args import OnPolicyArgs
from fleetrl.distributed import split_evenly
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import ImpalaCNN, layer_init_normed, mlp
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.sampler import local_async_batch


# ============================================================================ arguments
@dataclass
class Args(OnPolicyArgs):
    """CleanRL's flags (experiment, PPO's, then PPG's), then the engine's (fleetrl/args.py); None: the env family's default."""

    exp_name: str = "ppg"
    """the name of this experiment"""
    total_timesteps: int | None = None
    """total timesteps of the experiments [25M Procgen, 500k classic control]"""
    num_envs: int | None = None
    """the number of parallel game environments [64; classic control 4]"""
    # Algorithm specific arguments; None: the env family's default (FAMILY_DEFAULTS)
    learning_rate: float | None = None
    """the learning rate of the optimizer [5e-4; classic control 2.5e-4]"""
    num_steps: int | None = None
    """the number of steps to run in each environment per policy rollout [256; classic control 128]"""
    anneal_lr: bool = False
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float | None = None
    """the discount factor gamma [0.999; classic control 0.99]"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int | None = None
    """the number of mini-batches [8; classic control 4]"""
    adv_norm_fullbatch: bool = True
    """Toggle full batch advantage normalization as used in PPG code"""
    clip_coef: float | None = None
    """the surrogate clipping coefficient [0.2]"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float | None = None
    """coefficient of the entropy [0.01]"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    normalize: bool | None = None
    """normalise observations (vectors only) and rewards with running statistics [on]"""
    stop_rollouts_gb: float = 1.0
    """on SIGTERM or Ctrl-C mid-phase, write the phase's stored rollouts with the checkpoint only up to this many GB per process (about 5 s to write); above it, stop at once without a checkpoint: the run resumes exactly from its last one, at a phase's end, redoing the iterations since"""
    checkpoint_every: int | None = None
    """write a checkpoint every this many iterations, a multiple of --n-iteration (default: --n-iteration, each phase's end, where the checkpoint holds no rollouts; another is rounded up to one), and always at the end"""

    # PPG specific arguments
    n_iteration: int = 32
    """N_pi: the number of policy update in the policy phase """
    e_policy: int = 1
    """E_pi: the number of policy update in the policy phase """
    v_value: int = 1
    """E_V: the number of policy update in the policy phase """
    e_auxiliary: int = 6
    """E_aux:the K epochs to update the policy"""
    beta_clone: float = 1.0
    """the behavior cloning coefficient"""
    num_aux_rollouts: int = 4
    """the number of mini batch in the auxiliary phase"""
    n_aux_grad_accum: int = 1
    """the number of gradient accumulation in mini batch"""

    norm_adv = False  # PPO's loss: no minibatch normalisation (a class attribute, not a flag)

    @property
    def update_epochs(self) -> int:  # PPO's update runs E_pi epochs
        return self.e_policy


FAMILY_DEFAULTS = {  # CleanRL's ppg_procgen.py (rewards normalised); classic control: ppo.py's settings, observations and rewards normalised
    "procgen": dict(total_timesteps=25_000_000, learning_rate=5e-4, num_envs=64, num_steps=256, num_minibatches=8, clip_coef=0.2,
                    ent_coef=0.01, gamma=0.999, normalize=True),
    "classic": dict(total_timesteps=500_000, learning_rate=2.5e-4, num_envs=4, num_steps=128, num_minibatches=4, clip_coef=0.2,
                    ent_coef=0.01, gamma=0.99, normalize=True),
}
AGENT_ROWS = False  # PettingZoo games refused: the auxiliary phase's stored rollouts and losses have no live mask

RANGES = {
    **{name: check for name, check in ppo.RANGES.items() if name != "update_epochs"},
    "stop_rollouts_gb": config.non_negative("the GB of stored rollouts a stop mid-phase writes with its checkpoint", 1e6),
    "checkpoint_every": config.count("iterations between checkpoints", optional=True,
                                     hint="Leave it out to checkpoint at each phase's end (every --n-iteration iterations)."),
    "n_iteration": config.count("policy iterations in a phase, before each auxiliary phase"),
    "e_policy": config.count("epochs over each batch in the policy phase"),
    "v_value": config.count("value epochs in the policy phase (CleanRL's PPG supports 1)", high=1),
    "e_auxiliary": config.count("epochs over the phase's rollouts in the auxiliary phase", low=0),
    "beta_clone": config.non_negative("the weight of the behavioural-cloning KL", config.COEF_MAX),
    "num_aux_rollouts": config.count("env rollouts in an auxiliary minibatch"),
    "n_aux_grad_accum": config.count("auxiliary minibatches whose gradients make one step"),
}


def validate(args: Args, world_size: int = 1) -> None:
    """PPO's checks (with PPG's ranges), then the auxiliary phase's, before anything starts."""
    ppo.validate(args, world_size, RANGES)
    args.checkpoint_every = phase_multiple(args.checkpoint_every, args.n_iteration)
    if args.async_batch is not None and args.async_batch != args.num_envs:
        raise FleetError(f"PPG keeps each env's whole rollout for its auxiliary phase, and --async-batch {args.async_batch} makes each "
                         f"step's row hold whichever envs were ready first. Leave --async-batch out (two env groups take turns) or "
                         f"set it to --num-envs {args.num_envs}.")
    if args.policy_lag:
        raise FleetError("PPG's auxiliary phase changes the weights between rollouts that --policy-lag 1 overlaps with training. "
                         "Leave --policy-lag at 0 for ppg.")
    split_evenly(args.num_aux_rollouts, world_size, "The env rollouts of an auxiliary minibatch", "--num-aux-rollouts")


def phase_multiple(checkpoint_every: int | None, n_iteration: int) -> int:
    """--checkpoint-every as a whole number of phases: a checkpoint mid-phase holds the phase's stored rollouts (up to
    6.4 GB at Procgen's defaults), which only a SIGTERM or the run's end should pay for. Rounded up, with a note."""
    if checkpoint_every is None:
        return n_iteration
    rounded = -(-checkpoint_every // n_iteration) * n_iteration
    if rounded != checkpoint_every and os.environ.get("RANK", "0") == "0":  # every torchrun rank validates; rank 0 says it
        print(f"fleetrl: note: --checkpoint-every {checkpoint_every} is rounded up to {rounded}, a multiple of --n-iteration "
              f"{n_iteration}: PPG checkpoints at a phase's end, where it holds no rollouts (a checkpoint mid-phase writes every "
              f"rollout stored in the phase). Pass a multiple of {n_iteration} to choose another.", file=sys.stderr, flush=True)
    return rounded


# ============================================================================ network
class Agent(ppo.Agent):
    """CleanRL's PPG agent: one encoder (the IMPALA CNN with PPG's initialisation; vectors: an MLP 64-64 tanh), a
    policy head, a value head on the encoder's features with their gradient stopped (so in the policy phase the value
    loss trains only that head), and an auxiliary value head, which trains the encoder in the auxiliary phase.
    PPO's acting, evaluation and value functions (ppo.Agent) read it as they read PPO's."""

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, impala: bool = False):
        nn.Module.__init__(self)  # PPO's layers are not made: these are PPG's
        self.continuous = False
        if len(obs_shape) == 3:
            self.trunk: nn.Module = ImpalaCNN(obs_shape, normed=True)
        else:
            self.trunk = nn.Sequential(mlp(int(np.prod(obs_shape)), 64, out_std=math.sqrt(2), hidden=(64,)), nn.Tanh())
        width = ImpalaCNN.out_dim if len(obs_shape) == 3 else 64
        self.actor = layer_init_normed(nn.Linear(width, int(action_space.n)), norm_dim=1, scale=0.1)
        self.critic = layer_init_normed(nn.Linear(width, 1), norm_dim=1, scale=0.1)
        self.aux_critic = layer_init_normed(nn.Linear(width, 1), norm_dim=1, scale=0.1)
        self.compute_dtype = torch.float32  # set by the engine's precision choice (fleetrl/accel.py)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and value, in fp32 (the value head reads the features with their gradient stopped)."""
        with autocast(x.device.type, self.compute_dtype):
            hidden = self.trunk(x)
            return self.actor(hidden).float(), self.critic(hidden.detach()).float().squeeze(-1)

    # PPG logic:
    def get_pi_value_and_aux_value(self, x: torch.Tensor) -> tuple[Categorical, torch.Tensor, torch.Tensor]:
        with autocast(x.device.type, self.compute_dtype):
            hidden = self.trunk(x)
            logits, value, aux_value = self.actor(hidden), self.critic(hidden.detach()), self.aux_critic(hidden)
        return Categorical(logits=logits.float()), value.float(), aux_value.float()

    def get_pi(self, x: torch.Tensor) -> Categorical:
        return Categorical(logits=self(x)[0])


def flatten01(arr: torch.Tensor) -> torch.Tensor:
    return arr.reshape((-1, *arr.shape[2:]))


def unflatten01(arr: torch.Tensor, targetshape: tuple[int, ...]) -> torch.Tensor:
    return arr.reshape((*targetshape, *arr.shape[1:]))


# ============================================================================ the auxiliary phase
class AuxiliaryPhase:
    """Keeps each policy iteration's rollouts (observations, in their own dtype, and returns, ``(num_steps, rollouts)``)
    and, after every --n-iteration-th iteration, distils. Checkpointed with the run (``run.register_shard``): the
    rollouts stored so far in the phase, none at a phase's end.

    The observations are one tensor per policy iteration, ``(num_steps, num_envs, *obs)``, not one for the phase:
    torch.save writes a tensor's whole storage, so a checkpoint of a phase-wide tensor would copy out the stored part
    first (6.4 GB more memory at Procgen's defaults, and its time); separate tensors are written as they are."""

    def __init__(self, run, agent: Agent, optimizer: torch.optim.Optimizer, grad_sync):
        self.run, self.args, self.dist, self.device = run, run.args, run.dist, run.device
        self.agent, self.optimizer, self.grad_sync = agent, optimizer, grad_sync
        self.num_envs = run.local_num_envs
        self.aux_batch_rollouts = self.num_envs * self.args.n_iteration  # this rank's
        self.aux_obs: list[torch.Tensor] = []  # one per policy iteration of the phase, made at the first rollout, in its observations' dtype (uint8 frames save RAM)
        self.aux_returns = torch.zeros((self.args.num_steps, self.aux_batch_rollouts))
        self.stored = 0  # rollouts kept in this phase
        run.register_shard(aux_rollouts=self)

    def after_update(self, iteration: int, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """After iteration ``iteration``'s policy update: keep its rollout; at a phase's end, the auxiliary phase."""
        args = self.args
        if not self.aux_obs:
            self.aux_obs = self._obs_storage(batch["obs"].shape[1:], batch["obs"].dtype)
        # PPG Storage - Rollouts are saved without flattening for sampling full rollouts later:
        storage_slice = slice(self.stored, self.stored + self.num_envs)
        self.aux_obs[self.stored // self.num_envs].copy_(unflatten01(batch["obs"], (args.num_steps, self.num_envs)))
        self.aux_returns[:, storage_slice] = unflatten01(batch["returns"], (args.num_steps, self.num_envs)).cpu()
        self.stored += self.num_envs
        if iteration % args.n_iteration:
            return {}
        if self.stored < self.aux_batch_rollouts and self.dist.is_main:
            print(f"fleetrl: the auxiliary phase distils the {self.stored} rollouts stored since the run resumed: the checkpoint "
                  f"held none of this phase's earlier ones (a checkpoint of another number of processes).", file=sys.stderr, flush=True)
        stats = self.distil(self.stored)
        self.stored = 0
        return stats

    def _stop_before_a_large_write(self) -> None:
        """The checkpoint of a stop (SIGTERM, Ctrl-C) mid-phase is not written if the phase's stored rollouts are more than
        --stop-rollouts-gb: writing them could outlast the grace before SIGKILL. The run stops at once instead, and its
        last checkpoint (at a phase's end, or where an earlier stop wrote its rollouts) resumes it exactly, redoing the
        iterations since. Asked as the checkpoint is written, whenever in the iteration the signal came."""
        stored_gb = sum(obs.nbytes for obs in self.aux_obs[: self.stored // self.num_envs]) / 1e9
        if stored_gb <= self.args.stop_rollouts_gb or not self.run.stop_requested():  # every rank decides alike
            return
        if self.dist.is_main:
            last = self.run.last_checkpoint
            print(f"fleetrl: stopping mid-phase without a checkpoint: the phase's {stored_gb:.1f} GB of stored rollouts (per process) "
                  f"are more than --stop-rollouts-gb {self.args.stop_rollouts_gb:g}, and writing them could outlast the grace before "
                  f"SIGKILL. " + (f"--resume auto continues, exactly, from the last checkpoint, {last}, redoing the iterations since."
                                  if last else "No checkpoint was written yet: --resume auto starts the run again."), file=sys.stderr, flush=True)
        raise self.run.stopped()  # exits as a stop does (143 for SIGTERM), naming the checkpoint that holds the run

    def _obs_storage(self, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        return [torch.zeros((self.args.num_steps, self.num_envs, *shape), dtype=dtype) for _ in range(self.args.n_iteration)]

    def rollouts(self, inds: np.ndarray) -> torch.Tensor:
        """The stored env rollouts ``inds`` (numbered in the order they were stored), ``(num_steps, len(inds), *obs)``."""
        return torch.stack([self.aux_obs[i // self.num_envs][:, i % self.num_envs] for i in inds], dim=1)

    def distil(self, rollouts: int) -> dict[str, torch.Tensor]:
        """--e-auxiliary epochs over the phase's ``rollouts`` env rollouts, --num-aux-rollouts of them a minibatch."""
        args, agent, optimizer, device = self.args, self.agent, self.optimizer, self.device
        num_aux_rollouts = args.num_aux_rollouts // self.dist.world_size  # this rank's share of a minibatch
        aux_inds = np.arange(rollouts)

        # Build the old policy on the aux buffer before distilling to the network
        aux_pi = torch.zeros((args.num_steps, rollouts, agent.actor.out_features))
        for start in range(0, rollouts, num_aux_rollouts):
            aux_minibatch_ind = aux_inds[start : start + num_aux_rollouts]
            m_aux_obs = self.rollouts(aux_minibatch_ind).to(device)
            with torch.no_grad():
                pi_logits = agent.get_pi(flatten01(m_aux_obs)).logits.cpu().clone()
            aux_pi[:, aux_minibatch_ind] = unflatten01(pi_logits, m_aux_obs.shape[:2])

        optimizer.zero_grad()  # the policy phase's last gradients are spent
        stats = {}
        for auxiliary_update in range(1, args.e_auxiliary + 1):
            np.random.shuffle(aux_inds)
            for i, start in enumerate(range(0, rollouts, num_aux_rollouts)):
                aux_minibatch_ind = aux_inds[start : start + num_aux_rollouts]
                m_aux_obs = flatten01(self.rollouts(aux_minibatch_ind).to(device))  # Sample full rollouts for PPG instead of random indexes
                m_aux_returns = flatten01(self.aux_returns[:, aux_minibatch_ind].to(torch.float32).to(device))

                new_pi, new_values, new_aux_values = agent.get_pi_value_and_aux_value(m_aux_obs)
                new_values, new_aux_values = new_values.view(-1), new_aux_values.view(-1)
                old_pi = Categorical(logits=flatten01(aux_pi[:, aux_minibatch_ind]).to(device))
                kl_loss = td.kl_divergence(old_pi, new_pi).mean()

                real_value_loss = 0.5 * ((new_values - m_aux_returns) ** 2).mean()
                aux_value_loss = 0.5 * ((new_aux_values - m_aux_returns) ** 2).mean()
                joint_loss = aux_value_loss + args.beta_clone * kl_loss

                loss = (joint_loss + real_value_loss) / args.n_aux_grad_accum
                loss.backward()  # accumulated; averaged over ranks at the step
                if (i + 1) % args.n_aux_grad_accum == 0:
                    self.grad_sync.finish()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()  # This cannot be outside, else gradients won't accumulate
                stats = {"aux/kl_loss": kl_loss.detach(), "aux/aux_value_loss": aux_value_loss.detach(),
                         "aux/real_value_loss": real_value_loss.detach()}
        return stats

    def state_dict(self) -> dict[str, torch.Tensor | int | list[torch.Tensor]]:
        """The stored rollouts: their observation tensors themselves (written from memory, not copied), the returns
        (small) copied out. For a stop's checkpoint with more than --stop-rollouts-gb of them it raises the run's stop
        instead, before any file of the checkpoint is opened (:meth:`_stop_before_a_large_write`)."""
        self._stop_before_a_large_write()
        return {"stored": self.stored, "aux_returns": self.aux_returns[:, : self.stored].clone(),
                "aux_obs": self.aux_obs[: self.stored // self.num_envs]}

    def load_state_dict(self, state: dict) -> None:
        stored, obs = int(state["stored"]), state["aux_obs"]
        if isinstance(obs, torch.Tensor):  # an earlier fleetrl's checkpoint: the phase's rollouts in one tensor
            obs = list(obs.split(self.num_envs, dim=1)) if stored else []
        if stored % self.num_envs or len(obs) != stored // self.num_envs or stored >= self.aux_batch_rollouts:
            raise FleetError(f"The checkpoint holds {stored} rollouts of an unfinished auxiliary phase, which does not fit this run's "
                             f"phase of --n-iteration {self.args.n_iteration} x {self.num_envs} envs per process. Resume it with the "
                             f"--n-iteration and --num-envs it was trained with.")
        self.stored = stored
        if stored:
            self.aux_obs = self._obs_storage(obs[0].shape[2:], obs[0].dtype)
            for mine, saved in zip(self.aux_obs, obs):
                mine.copy_(saved)  # from the mapped checkpoint file (fleetrl.checkpoint.load_shard): read once
            self.aux_returns[:, :stored] = state["aux_returns"]


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train PPG, in one process or under torchrun: the policy phase is PPO's iteration (fleetrl/algos/ppo.py: its
    rollout, GAE, loss and update) on the advantages normalised over the whole batch; after each iteration's update the
    auxiliary phase keeps the rollout and, every --n-iteration iterations, distils."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="ppg", lag_worker="sampler thread") as run:
        args, dist, device, family = run.args, run.dist, run.device, run.family
        batch_size = args.num_envs * args.num_steps  # global, over all ranks
        local_minibatch_size = run.local_num_envs * args.num_steps // args.num_minibatches
        num_iterations = args.total_timesteps // batch_size

        async_batch = local_async_batch(args.async_batch, args.num_envs, run.local_num_envs)  # None, or every env (validate)
        envs = run.make_envs(async_batch=async_batch, frame_stack=args.frame_stack)
        obs_shape = envs.single_observation_space.shape
        agent = Agent(obs_shape, envs.single_action_space, impala=family.name == "procgen").to(device)
        dist.broadcast_parameters(agent)  # every replica starts from rank 0's parameters
        accel = run.choose_accel(agent, envs.single_observation_space, local_minibatch_size)
        optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-8, fused=True)
        grad_sync = dist.gradient_sync(agent.parameters())  # averages gradients over ranks, overlapping backward
        run.register(model=agent, optimizer=optimizer)
        obs_norm, reward_norm = onpolicy.normalizers(run, obs_shape)  # --normalize: one set for all envs, checkpointed
        log = run.start_logging(envs, num_iterations, batch_size, notes={"precision": f"{accel.label}: {accel.reason}"})
        sampler = onpolicy.sampler(run, envs, agent, log, ppo.rollout, async_batch, obs_norm, reward_norm)
        auxiliary = AuxiliaryPhase(run, agent, optimizer, grad_sync)  # checkpointed with the run: the phase's rollouts
        loss_fn = accel.compiled(ppo.ppo_loss, agent, dist)  # torch.compile with --compile (eager if it fails)
        run.restore()  # a resumed run: its model, optimiser, statistics, stored rollouts and RNG streams

        for iteration in run.iterations():
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            # ---------------------------------------------------------------- the policy phase: PPO's iteration
            buffer = sampler.collect()
            with log.timer.learn:
                buffer.advantages[:] = ppo.gae(buffer, args.gamma, args.gae_lambda)
                buffer.returns[:] = buffer.advantages + buffer.values
            with log.timer.learn:
                batch = onpolicy.batch(buffer, device)
                if args.adv_norm_fullbatch:  # PPG code does full batch advantage normalization (over all ranks' batches)
                    batch["advantages"] = dist.normalize(batch["advantages"])
                stats = ppo.update(agent, optimizer, grad_sync, batch, loss_fn, args, dist)

                # ------------------------------------------------------------ the auxiliary phase
                stats.update(auxiliary.after_update(iteration, batch))  # store the rollout; at a phase's end, distil
            sampler.weights_updated()  # the acting weights follow the learner (and the auxiliary phase)

            # ---------------------------------------------------------------- logging
            stats["explained_variance"] = onpolicy.explained_variance(buffer, dist)
            run.end_iteration(iteration, buffer.global_step, buffer.episodes, losses=stats,
                              charts={"learning_rate": optimizer.param_groups[0]["lr"], "policy_lag": sampler.policy_lag})
        return run.finish(agent)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: the most probable action, or a sample, with the saved observation
    statistics frozen."""
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    agent.load_state_dict(state["model"])
    return policy_fn(agent, envs, deterministic, obs_rms=state.get("obs_rms"))


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
