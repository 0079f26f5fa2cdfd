"""DQN for discrete actions, classic control and Atari, read top to bottom as CleanRL's dqn.py and dqn_atari.py.

Order: arguments, network, then training: setup, and the loop (epsilon-greedy acting, env step, replay, the TD
update every --train-frequency steps, the target network every --target-network-frequency steps), logging. The
engine (vector envs, replay buffer, checkpoints, monitoring, torchrun) is called in a line each.

Differences from CleanRL, each on purpose:
* the replay buffer stores the true next observation at a time limit and bootstraps through it (dqn_atari.py's
  loses it), and keeps each Atari frame once (fleetrl/sampling/replay.py: a 1M buffer in under 8 GB, not 26);
* epsilon is drawn per env, and the update and target cadences count global steps (all envs of all ranks), so
  more envs keep CleanRL's updates per env step; with one env, epsilon and both cadences fall on CleanRL's steps;
* exploration draws from numpy's global RNG (seeded and checkpointed with the run), not Python's ``random`` and the
  action space's own RNG; Adam is fused (one kernel: the same update, rounded differently);
* under torchrun each rank acts in its own envs, keeps its own replay shard and samples --batch-size / world size
  transitions from it; gradients are averaged, so every replica takes the same step;
* Atari reports the unclipped full-game score (the env layer); checkpoints, resume and SIGTERM as for every algorithm;
* the update is a function the loop calls through ``learner``: in place by default, or with ``--policy-lag 1`` in a
  learner process on another core while acting goes on one update behind (fleetrl/learner.py; 2.3x on CartPole).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl import config, offpolicy, optim
from fleetrl.algos.source import train_main
from fleetrl.args import OFFPOLICY_RANGES, OffPolicyArgs, validate_offpolicy
from fleetrl.learner import check_policy_lag
from fleetrl.monitor import TrainResult
from fleetrl.nets import NatureCNN, mlp
from fleetrl.offpolicy import STEPS_PER_ITERATION, epsilon_greedy, optimizer_step, soft_update, step_envs, times_due
from fleetrl.policy import policy_fn
from fleetrl.run import Run
from fleetrl.sampling.acting import host_forward
from fleetrl.sampling.replay import ReplayBatch


# ============================================================================ arguments
@dataclass
class Args(OffPolicyArgs):
    exp_name: str = "dqn"
    """the name of this experiment"""

    # Algorithm specific arguments; None means "the default for the env family" (see FAMILY_DEFAULTS)
    total_timesteps: int | None = None
    """total timesteps of the experiments [500k classic control; Atari 10M]"""
    learning_rate: float | None = None
    """the learning rate of the optimizer [2.5e-4; Atari 1e-4]"""
    num_envs: int | None = None
    """the number of parallel game environments [1]"""
    buffer_size: int | None = None
    """the replay memory buffer size, over all processes [10k; Atari 1M]"""
    tau: float | None = None
    """the target network update rate [1.0: the target becomes a copy]"""
    target_network_frequency: int | None = None
    """the timesteps it takes to update the target network [500; Atari 1000]"""
    batch_size: int | None = None
    """the batch size of sample from the replay memory, over all processes [128; Atari 32]"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float | None = None
    """the ending epsilon for exploration [0.05; Atari 0.01]"""
    exploration_fraction: float | None = None
    """the fraction of `total-timesteps` it takes from start-e to go end-e [0.5; Atari 0.1]"""
    learning_starts: int | None = None
    """timestep to start learning [10k; Atari 80k]"""
    train_frequency: int | None = None
    """the frequency of training, in timesteps [10; Atari 4]"""

    # fleetrl: engine settings
    policy_lag: int = 0
    """0: act with the newest weights (CleanRL); 1: the updates run in a learner process on another core and acting is one update behind (CPU, one process)"""


FAMILY_DEFAULTS = {  # CleanRL's dqn.py and dqn_atari.py; DQN has no network for continuous actions (MuJoCo) or Procgen
    "classic": dict(total_timesteps=500_000, learning_rate=2.5e-4, num_envs=1, buffer_size=10_000, tau=1.0, target_network_frequency=500,
                    batch_size=128, end_e=0.05, exploration_fraction=0.5, learning_starts=10_000, train_frequency=10),
    "atari": dict(total_timesteps=10_000_000, learning_rate=1e-4, num_envs=1, buffer_size=1_000_000, tau=1.0, target_network_frequency=1000,
                  batch_size=32, end_e=0.01, exploration_fraction=0.1, learning_starts=80_000, train_frequency=4),
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = {  # what each flag accepts (after the family defaults are filled), checked before anything starts
    **OFFPOLICY_RANGES,
    "learning_rate": config.positive("the optimizer's step size", config.COEF_MAX),
    "target_network_frequency": config.count("timesteps between target network updates"),
    "start_e": config.fraction("the exploration probability at the start"),
    "end_e": config.fraction("the exploration probability once the schedule ends"),
    "exploration_fraction": config.Range("the share of --total-timesteps over which epsilon falls", low=0, low_open=True, high=1),
    "train_frequency": config.count("timesteps between updates"),
    "policy_lag": config.count("0: every step acts with the newest weights; 1: the updates run in a learner process, acting one "
                               "update behind", low=0, high=1),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts (the buffer, batch and start checks are shared
    by the off-policy algorithms)."""
    validate_offpolicy(args, world_size, RANGES)
    check_policy_lag(args.policy_lag, world_size, "dqn")


# ============================================================================ network
class QNetwork(nn.Module):
    """CleanRL's Q-network: one value per action. Vector observations: an MLP 120-84 ReLU; stacked Atari frames: the
    Nature CNN (uint8 frames in, scaled inside). PyTorch's default initialisation, as CleanRL's dqn.py and
    dqn_atari.py: a seed gives CleanRL's initial weights (issue 22 measured PPO's orthogonal init here, benchmarks/
    vs_cleanrl.py dqn)."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int):
        super().__init__()
        if len(obs_shape) == 3:
            self.network = nn.Sequential(NatureCNN(obs_shape[0], orthogonal=False), nn.Linear(NatureCNN.out_dim, num_actions))
        else:
            self.network = mlp(int(np.prod(obs_shape)), num_actions, hidden=(120, 84), activation=nn.ReLU, orthogonal=False)
        self.num_actions = num_actions
        self.epsilon = 0.0  # the exploration of stochastic evaluation (policy_from_checkpoint sets it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    def q_values_on_host(self, device: torch.device) -> Callable[[np.ndarray], np.ndarray]:
        """numpy observations -> numpy Q-values, for acting a step at a time (a small MLP on the CPU runs in numpy)."""
        return host_forward(self.network, device)

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Greedy actions; with ``deterministic=False``, epsilon-greedy."""
        actions = self(x).argmax(dim=1)
        if deterministic or self.epsilon == 0.0:
            return actions
        explore = torch.rand(actions.shape, device=actions.device) < self.epsilon
        return torch.where(explore, torch.randint_like(actions, self.num_actions), actions)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


# ============================================================================ loss
def td_loss(q_network: QNetwork, target_network: QNetwork, data: ReplayBatch, args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CleanRL's TD loss on a sampled batch, and the scalars it logs (``losses/td_loss``, ``losses/q_values``)."""
    with torch.no_grad():
        target_max, _ = target_network(data.next_obs).max(dim=1)
        td_target = data.rewards + args.gamma * target_max * (1 - data.dones)
    old_val = q_network(data.obs).gather(1, data.actions.unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(td_target, old_val)
    return loss, {"td_loss": loss.detach(), "q_values": old_val.detach().mean()}


def make_q_network(args: Args, obs_shape: tuple[int, ...], num_actions: int) -> QNetwork:
    return QNetwork(obs_shape, num_actions)


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None, algo="dqn", family_defaults: dict = FAMILY_DEFAULTS,
          validate: Callable[..., None] = validate, make_q_network: Callable[..., nn.Module] = make_q_network,
          loss_fn: Callable[..., tuple] = td_loss, adam_eps: float | Callable[[Args], float] = 1e-8,
          replay_options: Callable[[Args], dict] = lambda args: {}) -> TrainResult:
    """Train DQN, in one process or under torchrun. ``explicit``: the flags given on the command line (they win over
    a resumed run's saved arguments). A variant (C51, Rainbow) passes the pieces it changes: its name, its flags'
    defaults and checks, ``make_q_network(args, obs_shape, num_actions)``, ``loss_fn(q_network, target_network, batch,
    args) -> (loss, scalars)``, Adam's ``adam_eps`` (a number, or a function of the args) and ``replay_options(args)``,
    make_replay's keywords (Rainbow's n-step and prioritised replay; a prioritised loss returns each sample's new
    priority as the scalar ``priorities``)."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    # torchrun, resume, defaults, seeds, device, stop signals; everything opened below is closed however the run ends
    with Run.start(args, explicit, family_defaults, validate, algo=algo, lag_worker="learner process") as run:
        args, dist, device = run.args, run.dist, run.device
        envs = run.make_envs()  # this rank's envs; a continuous action space was refused here
        obs_shape, num_actions = envs.single_observation_space.shape, int(envs.single_action_space.n)
        num_iterations = offpolicy.num_iterations(args)  # STEPS_PER_ITERATION vector steps each
        local_batch_size = args.batch_size // dist.world_size  # each rank's share of a batch

        q_network = make_q_network(args, obs_shape, num_actions).to(device)
        dist.broadcast_parameters(q_network)  # every replica starts from rank 0's parameters
        eps = adam_eps(args) if callable(adam_eps) else adam_eps
        optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=eps, fused=True)  # one kernel for all params
        grad_sync = dist.gradient_sync(q_network.parameters())  # averages gradients over ranks
        q_values_of = q_network.q_values_on_host(device)  # numpy -> numpy; small MLPs on the CPU act in numpy
        target_network = make_q_network(args, obs_shape, num_actions).to(device)
        target_network.load_state_dict(q_network.state_dict())
        rb = offpolicy.make_replay(run, envs, **replay_options(args))  # this rank's shard, its memory checked against what is free
        run.register(q_network=q_network, target_network=target_network, optimizer=optimizer)

        def td_update(data: ReplayBatch) -> dict[str, torch.Tensor]:  # one gradient step on a sampled batch
            loss, scalars = loss_fn(q_network, target_network, data, args)
            optimizer_step(optimizer, grad_sync, loss)  # optimize the model (gradients averaged over ranks)
            return scalars  # read once an iteration

        def update_target() -> None:  # the same arithmetic on every rank: the replicas stay identical
            soft_update(target_network, q_network, args.tau)  # tau * q_network + (1 - tau) * target_network

        learner = run.learner(td_update, update_target, acting=q_network)  # here, or with --policy-lag 1 in a process of its own
        log = run.start_logging(envs, num_iterations, STEPS_PER_ITERATION * args.num_envs)
        run.restore()  # a resumed run: its networks, optimiser and RNG streams, exactly as they were
        learning_starts = offpolicy.learning_starts(run)  # a resume without the buffer refills it first
        exploration_steps = args.exploration_fraction * args.total_timesteps

        # TRY NOT TO MODIFY: start the game
        global_step, epsilon, losses = run.global_step, args.start_e, {}
        obs, _ = envs.reset(seed=run.env_seed)
        for iteration in run.iterations():  # to the last (from a resumed checkpoint's); --stop-at-return ends it early
            episodes = []  # (global step, return, length) of the episodes this rank finished
            for _ in range(STEPS_PER_ITERATION):
                # ALGO LOGIC: epsilon-greedy; each env explores with probability epsilon (the network runs only if one does not).
                # global_step counts the env steps taken before this one (all envs of all ranks), as CleanRL's loop variable
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
                with log.timer.inference:
                    actions = epsilon_greedy(q_values_of, obs, epsilon, num_actions)

                # TRY NOT TO MODIFY: execute the game, save the data to the replay buffer (the true next obs at a time limit)
                obs = step_envs(envs, rb, obs, actions, global_step + args.num_envs, episodes, log.timer)  # logged at the steps done

                # ALGO LOGIC: training
                if global_step > learning_starts:
                    if rb.priorities is not None:  # anneal PER beta to 1 over the run (CleanRL's rainbow_atari.py)
                        rb.beta = min(1.0, rb.beta_start + global_step * (1.0 - rb.beta_start) / args.total_timesteps)
                    for _ in range(times_due(global_step, args.num_envs, args.train_frequency)):
                        with log.timer.learn:
                            data = rb.sample(local_batch_size)
                            losses = learner(td_update, data)
                            if data.indices is not None:  # prioritised replay: each sample's new priority, from its loss
                                rb.update_priorities(data.indices, losses.pop("priorities"))

                    # update target network
                    if times_due(global_step, args.num_envs, args.target_network_frequency):
                        learner(update_target)
                global_step += args.num_envs

            charts = {"epsilon": epsilon} if rb.priorities is None else {"beta": rb.beta}
            run.end_iteration(iteration, global_step, episodes, losses=losses, charts=charts)
        return run.finish(q_network)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: greedy, or epsilon-greedy with the run's final epsilon
    (CleanRL evaluates DQN with epsilon 0.05)."""
    q_network = QNetwork(envs.single_observation_space.shape, int(envs.single_action_space.n))
    q_network.load_state_dict(state["q_network"])
    q_network.eval()
    q_network.epsilon = float(state["args"]["end_e"])  # the run's --end-e, its family default filled in
    return policy_fn(q_network, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
