"""PQN (parallelised Q-learning), discrete actions, classic control and Atari, read top to bottom as CleanRL's pqn.py
and pqn_atari_envpool.py.

Order: arguments, the Q-network, the rollout loop (epsilon-greedy), the Q(lambda) recurrence, the TD loss, then
training: setup, and each iteration's rollout, returns, minibatch epochs and logging. No replay buffer and no target
network: like PPO, each update trains on the rollout just collected, so the sampler's modes (the zero-lag split,
first-ready batches, ``--policy-lag 1``) and torchrun work as they do for PPO (fleetrl/algos/ppo.py).

Differences from CleanRL, each on purpose:
* time-limit truncation bootstraps from the greedy value of the final observation (CleanRL cuts the return there);
* exploration draws come from the sampler's RNG (checkpointed with the run): per env a uniform decides whether to
  explore and a second picks the random action, so a resumed run continues the same draws;
* epsilon follows each env's own step count times the number of envs: CleanRL's global_step in the serial loop, and
  each env's own schedule with first-ready batches;
* Atari reports the unclipped full-game score (the env layer); checkpoints, resume and SIGTERM as for every algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl import config, optim
from fleetrl.accel import autocast
from fleetrl.algos.ppo import minibatches
from fleetrl.algos.source import train_main
from fleetrl.args import ONPOLICY_RANGES, OnPolicyArgs, validate_onpolicy
from fleetrl.envs.spaces import check_action_space
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import layernorm_mlp, layernorm_nature_cnn
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.rollout import RolloutBuffer
from fleetrl.sampling.sampler import Due, Sampler, local_async_batch


# ============================================================================ arguments
@dataclass
class Args(OnPolicyArgs):
    """CleanRL's flags (experiment, then PQN's), then the engine's (fleetrl/args.py); None: the env family's default."""

    exp_name: str = "pqn"
    """the name of this experiment"""
    total_timesteps: int | None = None
    """total timesteps of the experiments [500k classic control, 10M Atari]"""
    num_envs: int | None = None
    """the number of parallel game environments [4; Atari 8]"""
    # Algorithm specific arguments; None: the env family's default (FAMILY_DEFAULTS)
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_steps: int = 128
    """the number of steps to run for each environment per update"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    anneal_lr: bool = True
    """Toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float | None = None
    """the ending epsilon for exploration [0.05; Atari 0.01]"""
    exploration_fraction: float | None = None
    """the fraction of `total_timesteps` it takes from start_e to end_e [0.5; Atari 0.1]"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    q_lambda: float = 0.65
    """the lambda for Q(lambda)"""


FAMILY_DEFAULTS = {  # CleanRL's pqn.py and pqn_atari_envpool.py; PQN has no network for continuous actions (MuJoCo)
    "classic": dict(total_timesteps=500_000, num_envs=4, end_e=0.05, exploration_fraction=0.5),
    "atari": dict(total_timesteps=10_000_000, num_envs=8, end_e=0.01, exploration_fraction=0.1, frame_stack=4),
}
AGENT_ROWS = False  # PettingZoo games refused: its Q(lambda) returns and loss have no live mask

RANGES = {  # what each numeric flag accepts once the family defaults are in, checked before anything starts
    **ONPOLICY_RANGES,
    "q_lambda": config.fraction("the lambda of the Q(lambda) returns (0: one-step Q-learning targets, 1: Monte Carlo "
                                "returns bootstrapped at the rollout's end)"),
    "gamma": config.fraction("the discount factor"),
    "learning_rate": config.positive("the optimizer's step size", config.COEF_MAX),
    "num_steps": config.count("steps each env takes per rollout"),
    "num_minibatches": config.count("minibatches each batch is split into"),
    "update_epochs": config.count("passes over each batch"),
    "start_e": config.fraction("the exploration probability at the start"),
    "end_e": config.fraction("the exploration probability at the end of the schedule"),
    "exploration_fraction": config.Range("the share of --total-timesteps over which epsilon falls", low=0, low_open=True, high=1),
    "max_grad_norm": config.positive("the gradient norm clipping threshold", config.COEF_MAX),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts (``world_size``: torchrun processes)."""
    validate_onpolicy(args, world_size, RANGES)  # the common flags, the sampler's and precision's
    per_process = args.num_envs // world_size * args.num_steps
    if per_process % args.num_minibatches:
        raise FleetError(f"The {per_process} transitions each process collects (--num-envs {args.num_envs} / {world_size} process(es) x "
                         f"--num-steps {args.num_steps}) do not split into --num-minibatches {args.num_minibatches} whole minibatches. "
                         f"Choose --num-minibatches that divides {per_process} (e.g. {', '.join(map(str, config.divisors(per_process)))}), "
                         f"or change --num-envs/--num-steps.")
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise FleetError(f"--total-timesteps {args.total_timesteps} is less than one batch (--num-envs x --num-steps = "
                         f"{args.num_envs * args.num_steps}); raise it.")


# ============================================================================ network
class QNetwork(nn.Module):
    """CleanRL's PQN Q-network: a LayerNorm MLP (120, 84) for vectors, the LayerNorm Nature CNN for Atari frames.

    Called as the engine's actors call an agent (fleetrl/sampling/acting.py): it returns the Q-values and the greedy
    value ``max_a Q``, which the Q(lambda) recurrence bootstraps from."""

    continuous = False  # the acting engine samples categorical actions from the first output
    greedy_value = True  # agent(x) is (network(x), its max): the engine acts from the network alone (sampling/acting.py)

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, impala: bool = False):
        super().__init__()
        self.num_actions = int(action_space.n)
        self.images = len(obs_shape) == 3
        self.network = (layernorm_nature_cnn(obs_shape[0], self.num_actions) if self.images
                        else layernorm_mlp(int(np.prod(obs_shape)), self.num_actions))
        self.compute_dtype = torch.float32  # set by the engine's precision choice (fleetrl/accel.py)
        self.epsilon = 0.0  # evaluation's exploration (policy_from_checkpoint)

    @property
    def actor(self) -> nn.Module:  # the acting engine reads the number of actions off its last layer
        return self.network

    def q_values(self, x: torch.Tensor) -> torch.Tensor:
        with autocast(x.device.type, self.compute_dtype):  # --precision: only the network runs in bf16
            return self.network(x.float() / 255.0 if self.images else x).float()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_values = self.q_values(x)
        return q_values, q_values.max(-1).values

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_values(x).max(-1).values

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy interface (fleetrl/policy.py), for evaluation: greedy; else epsilon-greedy at ``epsilon``."""
        actions = self.q_values(x).argmax(-1)
        if deterministic or self.epsilon == 0.0:
            return actions
        explore = torch.rand(actions.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(actions, self.num_actions), actions)


def linear_schedule(start_e: float, end_e: float, duration: float, t: np.ndarray) -> np.ndarray:
    slope = (end_e - start_e) / duration
    return np.maximum(slope * t + start_e, end_e)


# ============================================================================ rollout
def rollout(steps: Iterable[Due], epsilon: Callable[[np.ndarray], np.ndarray], env_steps: np.ndarray, num_actions: int) -> None:
    """CleanRL's rollout loop, epsilon-greedy: ``--num-steps`` times, every env acts on its observation and steps.

    The sampler schedules the envs as for PPO (all at once, two groups in turn, the first K ready, or in its own thread
    with ``--policy-lag 1``). ``env_steps``: each env's steps so far, which set its epsilon."""
    for due in steps:  # envs whose next action is due, with their observations and the sampler's noise for them
        env_steps[due.env_ids] += 1  # CleanRL's global_step += num_envs, before acting
        max_actions, values = due.actor.greedy(due.obs)  # CleanRL's argmax of the Q-values, and the Q-value there
        uniform = np.exp(-due.noise)  # the sampler's Exp(1) draws as uniforms in (0, 1]: its RNG, checkpointed
        random_actions = np.minimum(uniform[:, -1] * num_actions, num_actions - 1).astype(np.int64)
        explore = uniform[:, 0] < epsilon(env_steps[due.env_ids])
        actions = np.where(explore, random_actions, max_actions)
        due.store(obs=due.obs, actions=actions, values=values)
        due.send(actions)


# ============================================================================ Q(lambda) returns
def q_lambda_returns(b: RolloutBuffer, gamma: float, q_lambda: float) -> np.ndarray:
    """CleanRL's Q(lambda) targets over a ``(T, N)`` rollout, backwards, in float32 as CleanRL computes them.

    After transition t: 0 if the episode terminated there; the greedy value of the final observation if it was
    truncated there (unlike CleanRL); at an env's last transition of the rollout, the greedy value of its next
    observation; otherwise ``q_lambda`` times the next return plus ``1 - q_lambda`` times the next greedy value.
    ``env_ids``: with first-ready batches row t holds the envs that arrived t-th, each env's trajectory runs through the
    rows (as in ppo.gae); else column i is env i."""
    next_value = b.last_values.copy()  # per env: max_a Q of the observation after its latest transition seen
    next_return = b.last_values.copy()  # per env: the return from there
    at_end = np.ones_like(next_value, dtype=bool)  # per env: no later transition of it in this rollout
    returns = np.zeros_like(b.values)
    for t in reversed(range(b.rewards.shape[0])):
        env = slice(None) if b.env_ids is None else b.env_ids[t]
        mixed = q_lambda * next_return[env] + (1 - q_lambda) * next_value[env]
        after = np.where(at_end[env], next_value[env], mixed)
        after = np.where(b.terminated[t], 0.0, np.where(b.dones[t], b.final_values[t], after)).astype(np.float32)
        returns[t] = b.rewards[t] + gamma * after
        next_return[env], next_value[env], at_end[env] = returns[t], b.values[t], False
    return returns


# ============================================================================ loss
def td_loss(q_network: QNetwork, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean squared error between the Q(lambda) returns and the Q-values of the actions taken; and those Q-values."""
    old_val = q_network.q_values(mb["obs"]).gather(1, mb["actions"].long().unsqueeze(-1)).squeeze()
    return F.mse_loss(mb["returns"], old_val), old_val.detach()


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train PQN, in one process or under torchrun. ``explicit``: the flags given on the command line."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    with Run.start(args, explicit, FAMILY_DEFAULTS, validate, algo="pqn", lag_worker="sampler thread") as run:
        args, dist, device = run.args, run.dist, run.device
        batch_size = args.num_envs * args.num_steps  # over all ranks; each rank updates on its own share
        num_iterations = args.total_timesteps // batch_size

        async_batch = local_async_batch(args.async_batch, args.num_envs, run.local_num_envs)  # None: every env each step
        envs = run.make_envs(async_batch=async_batch, frame_stack=args.frame_stack)
        # a continuous action space: one paragraph naming the env, its space and the algorithms that train it
        check_action_space(args.env_id, envs.single_action_space, supported=("Discrete",), algo="PQN")
        q_network = QNetwork(envs.single_observation_space.shape, envs.single_action_space).to(device)
        dist.broadcast_parameters(q_network)  # every replica starts from rank 0's parameters
        accel = run.choose_accel(q_network, envs.single_observation_space, run.local_num_envs * args.num_steps // args.num_minibatches)
        loss_fn = accel.compiled(td_loss, q_network, dist)  # torch.compile with --compile (eager if it fails), else td_loss
        optimizer = optim.RAdam(q_network.parameters(), lr=args.learning_rate)  # torch's RAdam, bit for bit, in one flat step
        grad_sync = dist.gradient_sync(q_network.parameters())  # averages gradients over ranks, overlapping backward
        run.register(model=q_network, optimizer=optimizer)
        log = run.start_logging(envs, num_iterations, batch_size, notes={"precision": f"{accel.label}: {accel.reason}"})

        # epsilon-greedy acting in the sampler: each env's steps (from the resumed step), epsilon annealed linearly
        env_steps = np.full(run.local_num_envs, run.global_step // args.num_envs, dtype=np.int64)
        epsilon = partial(linear_schedule, args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps)
        act = partial(rollout, epsilon=lambda steps: epsilon(steps * args.num_envs), env_steps=env_steps,
                      num_actions=q_network.num_actions)
        sampler = run.closing(Sampler(envs, q_network, args.num_steps, rollout=act, device=device, seed=run.seed,
                                      env_seed=run.env_seed, timer=log.timer, actor_device=args.actor_device,
                                      saved_actor_device=run.remembered("actor_device"), policy_lag=args.policy_lag,
                                      async_batch=async_batch, global_step=run.global_step, global_envs=args.num_envs,
                                      verbose=dist.is_main))
        run.remember(actor_device=sampler.acts_on)
        run.register_per_rank(actor=sampler)  # each rank's exploration draws
        run.restore()  # a resumed run: its Q-network, optimiser and RNG streams, exactly as they were

        for iteration in run.iterations():
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate

            # ---------------------------------------------------------------- rollout
            buffer = sampler.collect()  # rollout() above: num_steps x num_envs epsilon-greedy transitions

            # ---------------------------------------------------------------- Q(lambda) targets
            with log.timer.learn:
                buffer.returns[:] = q_lambda_returns(buffer, args.gamma, args.q_lambda)

            # ---------------------------------------------------------------- optimizing the Q-network
            with log.timer.learn:
                q_network.train()
                flat = buffer.flat()
                batch = {k: flat[k].to(device) for k in ("obs", "actions", "returns")}
                for epoch in range(args.update_epochs):
                    for mb in minibatches(batch, args.num_steps, args.num_minibatches):  # this rank's share, shuffled
                        loss, old_val = loss_fn(q_network, mb)
                        optimizer.zero_grad()
                        grad_sync.backward(loss)  # under torchrun, gradients are averaged over ranks as backward goes
                        grad_sync.finish()
                        nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                        optimizer.step()
            sampler.weights_updated()  # the acting weights follow the learner

            # ---------------------------------------------------------------- logging
            run.end_iteration(iteration, buffer.global_step, buffer.episodes,
                              losses={"td_loss": loss.detach(), "q_values": old_val.mean()},
                              charts={"learning_rate": optimizer.param_groups[0]["lr"], "policy_lag": sampler.policy_lag,
                                      "epsilon": float(epsilon(buffer.global_step))})
        return run.finish(q_network)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: greedy, or epsilon-greedy at the run's final epsilon."""
    q_network = QNetwork(envs.single_observation_space.shape, envs.single_action_space)
    q_network.load_state_dict(state["model"])
    q_network.epsilon = float(state["args"]["end_e"])
    return policy_fn(q_network, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
