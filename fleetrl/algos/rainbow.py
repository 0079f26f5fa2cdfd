"""Rainbow for discrete actions, Atari and classic control, read top to bottom as CleanRL's rainbow_atari.py.

Rainbow (Hessel et al. 2018) is C51 (c51.py) with five more pieces, all of CleanRL's: prioritised replay (``--prioritized-
replay-alpha``, its importance weights annealed from ``--prioritized-replay-beta`` to 1 over the run), ``--n-step``
returns, noisy linear layers that explore in place of epsilon-greedy, a dueling head (value and advantage streams) for
each atom, and double Q-learning (the online network picks the next action, the target network gives its
distribution). The replay buffer keeps the priorities and n-step returns (fleetrl/sampling/replay.py), the noisy dueling
head and the projection are in fleetrl/nets.py, and the loop is DQN's (dqn.py), given these pieces by keyword.

Differences from CleanRL, each on purpose (besides DQN's, dqn.py):
* the n-step returns of the buffer: an episode's last ``n - 1`` transitions are stored with their shorter returns
  (CleanRL's queue drops them at a termination), a time limit ends the return and bootstraps from the true final
  observation (CleanRL's queue runs on into the next episode), and the bootstrap is ``gamma ** k`` for the ``k`` steps
  taken; on steps without an episode end, the transitions, priorities, slots and weights are CleanRL's bit for bit;
* classic control with the same file: a 120-unit ReLU layer, then the noisy dueling streams of 84 units, and C51's
  classic defaults (CleanRL has Rainbow for Atari only);
* ``--start-e``/``--end-e`` default to 0 (CleanRL's file declares 1 and 0.01 but never uses them): noisy layers
  explore; give them to add epsilon-greedy on top;
* several envs and torchrun (each rank's buffer shard has its own sum tree; gradients are averaged; every rank draws
  the same noise, from a generator rank 0 seeds, so the replicas stay one network);
* ``--policy-lag 1`` is refused: the priorities come back from each update to the buffer in the acting process, and
  the noise is drawn where the update runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fleetrl import config
from fleetrl.algos import c51, dqn
from fleetrl.algos.source import train_main
from fleetrl.args import validate_offpolicy
from fleetrl.distributed import shared_generator
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import NoisyDuelingHead, categorical_projection, categorical_q_values, nature_convs
from fleetrl.policy import policy_fn
from fleetrl.sampling.acting import host_forward
from fleetrl.sampling.replay import PrioritizedBatch


# ============================================================================ arguments
@dataclass
class Args(c51.Args):
    """C51's flags (c51.py, dqn.py) with Rainbow's replay; None means "the default for the env family" (FAMILY_DEFAULTS)."""

    exp_name: str = "rainbow"
    """the name of this experiment"""
    learning_rate: float | None = None
    """the learning rate of the optimizer [2.5e-4; Atari 6.25e-5]"""
    target_network_frequency: int | None = None
    """the timesteps it takes to update the target network [500; Atari 8000]"""
    start_e: float = 0.0
    """the starting epsilon for exploration (0: the noisy layers explore)"""
    end_e: float | None = None
    """the ending epsilon for exploration [0]"""
    n_step: int = 3
    """the number of steps to look ahead for n-step Q learning"""
    prioritized_replay_alpha: float = 0.5
    """alpha parameter for prioritized replay buffer"""
    prioritized_replay_beta: float = 0.4
    """beta parameter for prioritized replay buffer"""
    prioritized_replay_eps: float = 1e-6
    """epsilon parameter for prioritized replay buffer"""


FAMILY_DEFAULTS = {  # CleanRL's rainbow_atari.py; classic control: C51's classic defaults (c51.py)
    "classic": {**c51.FAMILY_DEFAULTS["classic"], "end_e": 0.0},
    "atari": {**c51.FAMILY_DEFAULTS["atari"], "learning_rate": 6.25e-5, "target_network_frequency": 8000, "end_e": 0.0},
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = {  # what each flag accepts (after the family defaults are filled), checked before anything starts
    **c51.RANGES,
    "n_step": config.count("the steps of each return before it bootstraps", high=1000),
    "prioritized_replay_alpha": config.Range("how strongly priorities skew sampling (0: uniform)", low=0, high=100),
    "prioritized_replay_beta": config.fraction("the importance-sampling exponent at the start (annealed to 1)"),
    "prioritized_replay_eps": config.positive("what every priority gets added, so that every transition can be drawn", 1.0),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts: C51's checks, --policy-lag 1, and a buffer too
    small for n steps."""
    validate_offpolicy(args, world_size, RANGES)
    c51.check_atoms(args)
    if args.policy_lag:
        raise FleetError("fleetrl rainbow --policy-lag 1 would run the updates in a learner process, but each update's priorities go "
                         "back to the replay buffer in the acting process before the next batch is drawn, and the noise is drawn where "
                         "the update runs. Leave out --policy-lag (0): Rainbow updates in its own loop.")
    if args.n_step >= args.buffer_size // args.num_envs:
        raise FleetError(f"--n-step {args.n_step} needs each env's part of the replay buffer to hold more than {args.n_step} steps, and "
                         f"--buffer-size {args.buffer_size} over --num-envs {args.num_envs} gives {args.buffer_size // args.num_envs}. "
                         f"Raise --buffer-size or lower --n-step.")


# ============================================================================ network
class QNetwork(nn.Module):
    """CleanRL's NoisyDuelingDistributionalNetwork: the Nature CNN's convolutions (uint8 frames scaled by 1/255), or for
    vector observations one 120-unit ReLU layer, then the noisy dueling head over ``n_atoms`` returns (512 units wide;
    84 for vectors). PyTorch's default init and CleanRL's order, so a seed gives its weights. Called, it gives the
    Q-values (expected returns); in training mode through the current noise, in eval mode through the mean weights."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, n_atoms: int = 51, v_min: float = -10.0, v_max: float = 10.0):
        super().__init__()
        self.num_actions, self.n_atoms, self.pixels = num_actions, n_atoms, len(obs_shape) == 3
        self.register_buffer("atoms", torch.linspace(v_min, v_max, n_atoms))
        if self.pixels:
            self.network, width = nature_convs(obs_shape[0], obs_shape[1], orthogonal=False)
        else:
            self.network, width = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), 120), nn.ReLU()), 120
        self.head = NoisyDuelingHead(width, 512 if self.pixels else 84, num_actions, n_atoms)

    def distribution(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each action's probabilities over the atoms ``(B, A, n_atoms)``, and its Q-value ``(B, A)``."""
        return categorical_q_values(self.head(self.network(x.float() / 255.0 if self.pixels else x)), self.atoms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.distribution(x)[1]

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        self.head.reset_noise(generator)

    def q_values_on_host(self, device: torch.device) -> Callable[[np.ndarray], np.ndarray]:
        return host_forward(self, device)  # torch: the noisy layers act through their current noise

    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Greedy on the mean weights; with ``deterministic=False``, greedy through fresh noise, as in training."""
        if deterministic:
            return self(x).argmax(dim=1)
        self.reset_noise()
        self.head.train()
        try:
            return self(x).argmax(dim=1)
        finally:
            self.head.eval()


def make_q_network(args: Args, obs_shape: tuple[int, ...], num_actions: int) -> QNetwork:
    return QNetwork(obs_shape, num_actions, args.n_atoms, args.v_min, args.v_max)


# ============================================================================ loss
def rainbow_loss(q_network: QNetwork, target_network: QNetwork, data: PrioritizedBatch, args: Args) -> tuple[torch.Tensor, dict]:
    """CleanRL's Rainbow update on a prioritised n-step batch: new noise for both networks; the target network's
    distribution for the next action the online network picks (double Q), shifted by the n-step reward and discounted
    by ``gamma ** k``, projected onto the atoms; each sample's cross-entropy, weighted by its importance weight. Returns
    the loss, CleanRL's scalars (``losses/td_loss``, ``losses/q_values``) and each sample's new ``priorities``."""
    noise = shared_generator(q_network.atoms.device)  # under torchrun, the same noise on every rank (one process: None)
    q_network.reset_noise(noise)  # reset the noise for both networks
    target_network.reset_noise(noise)
    with torch.no_grad():
        next_dist, _ = target_network.distribution(data.next_obs)  # [B, num_actions, n_atoms]
        _, next_q_online = q_network.distribution(data.next_obs)  # double q-learning
        best_actions = torch.argmax(next_q_online, dim=1)
        next_pmfs = next_dist[torch.arange(len(best_actions)), best_actions]  # [B, n_atoms]
        target_pmfs = categorical_projection(next_pmfs, data.rewards, data.dones, data.discounts, target_network.atoms)

    dist, _ = q_network.distribution(data.obs)
    pred_dist = dist[torch.arange(len(data.actions)), data.actions]  # [B, n_atoms]
    log_pred = torch.log(pred_dist.clamp(min=1e-5, max=1 - 1e-5))
    loss_per_sample = -(target_pmfs * log_pred).sum(dim=1)
    loss = (loss_per_sample * data.weights).mean()
    q_values = (pred_dist.detach() * q_network.atoms).sum(dim=1)
    return loss, {"td_loss": loss.detach(), "q_values": q_values.mean(), "priorities": loss_per_sample.detach()}


def replay_options(args: Args) -> dict:
    """Rainbow's replay buffer: prioritised, with n-step returns (fleetrl/sampling/replay.py)."""
    return dict(n_step=args.n_step, gamma=args.gamma, alpha=args.prioritized_replay_alpha, beta=args.prioritized_replay_beta,
                priority_eps=args.prioritized_replay_eps)


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train Rainbow, in one process or under torchrun: DQN's loop (dqn.py) with Rainbow's pieces. ``explicit``: the
    flags given on the command line (they win over a resumed run's saved arguments)."""
    return dqn.train(args, explicit, algo="rainbow", family_defaults=FAMILY_DEFAULTS, validate=validate,
                     make_q_network=make_q_network, loss_fn=rainbow_loss, adam_eps=1.5e-4, replay_options=replay_options)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: greedy on the mean weights, or through fresh noise (stochastic)."""
    saved = state["args"]  # the run's flags, its family defaults filled in
    q_network = QNetwork(envs.single_observation_space.shape, int(envs.single_action_space.n), saved["n_atoms"], saved["v_min"], saved["v_max"])
    q_network.load_state_dict(state["q_network"])
    return policy_fn(q_network, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
