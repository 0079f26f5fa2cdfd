"""C51 for discrete actions, classic control and Atari, read top to bottom as CleanRL's c51.py and c51_atari.py.

C51 is DQN with a distribution over returns in place of one Q-value per action: ``--n-atoms`` fixed returns from
``--v-min`` to ``--v-max``, the network giving each action's probabilities over them. This file is DQN (dqn.py) plus
the pieces C51 changes, passed to DQN's loop by keyword: its flags and their defaults, the network, the loss (the
target distribution projected onto the atoms, then a cross-entropy) and Adam's epsilon. The loop is DQN's, CleanRL's
too: epsilon-greedy acting on the expected returns, env steps into the replay buffer, an update every
--train-frequency steps, the target network copied every --target-network-frequency steps.

Differences from CleanRL, each on purpose (besides DQN's, dqn.py: epsilon drawn from numpy's global RNG, fused Adam,
the true next observation at a time limit, Atari frames stored once, cadences counting the steps of all envs, torchrun,
``--policy-lag 1``, checkpoints and resume):
* the categorical projection is CleanRL's arithmetic with its loop over the batch's rows made one ``index_add_``
  (fleetrl/nets.py): the same bits, without 2 x 128 small kernel calls an update;
* a small MLP on the CPU acts in numpy (fleetrl/sampling/acting.py's ``host_categorical_q_values``: 23 µs a CartPole step
  against 97 through torch): CleanRL's softmax and expected returns to float32 rounding, and acting takes only their
  argmax (the lockstep's actions stay CleanRL's; a near-tie of two Q-values, within about 1e-5, could split them);
* ``--tau`` stays (DQN's flag): its default 1.0 is CleanRL's copy of the network, bit for bit;
* ``losses/q_values`` is logged from every update's batch (averaged over the iteration), not every 100th step's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fleetrl import config
from fleetrl.algos import dqn
from fleetrl.algos.source import train_main
from fleetrl.args import validate_offpolicy
from fleetrl.errors import FleetError
from fleetrl.learner import check_policy_lag
from fleetrl.monitor import TrainResult
from fleetrl.nets import categorical_projection, categorical_q_values
from fleetrl.policy import policy_fn
from fleetrl.sampling.acting import host_categorical_q_values
from fleetrl.sampling.replay import ReplayBatch


# ============================================================================ arguments
@dataclass
class Args(dqn.Args):
    """DQN's flags (dqn.py) with C51's atoms; None means "the default for the env family" (see FAMILY_DEFAULTS)."""

    exp_name: str = "c51"
    """the name of this experiment"""
    learning_rate: float | None = None
    """the learning rate of the optimizer [2.5e-4, Atari too]"""
    target_network_frequency: int | None = None
    """the timesteps it takes to update the target network [500; Atari 10000]"""
    n_atoms: int | None = None
    """the number of atoms [101; Atari 51]"""
    v_min: float | None = None
    """the return lower bound [-100; Atari -10]"""
    v_max: float | None = None
    """the return upper bound [100; Atari 10]"""


FAMILY_DEFAULTS = {  # CleanRL's c51.py (dqn.py's defaults and 101 atoms) and c51_atari.py
    "classic": {**dqn.FAMILY_DEFAULTS["classic"], "n_atoms": 101, "v_min": -100.0, "v_max": 100.0},
    "atari": {**dqn.FAMILY_DEFAULTS["atari"], "learning_rate": 2.5e-4, "target_network_frequency": 10_000,
              "n_atoms": 51, "v_min": -10.0, "v_max": 10.0},
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = {  # what each flag accepts (after the family defaults are filled), checked before anything starts
    **dqn.RANGES,
    "n_atoms": config.count("the atoms of each action's return distribution; a distribution needs two at least", low=2, high=100_000),
    "v_min": config.Range("the return of the first atom"),
    "v_max": config.Range("the return of the last atom"),
}


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts: DQN's checks, and atoms that span no returns."""
    validate_offpolicy(args, world_size, RANGES)
    check_policy_lag(args.policy_lag, world_size, "c51")
    check_atoms(args)


def check_atoms(args: Args) -> None:
    """Refuse atoms that span no returns (C51, Rainbow)."""
    if args.v_min >= args.v_max:
        raise FleetError(f"--v-min {args.v_min:g} is not below --v-max {args.v_max:g}: the {args.n_atoms} atoms of C51's return "
                         f"distribution are spread evenly from --v-min up to --v-max, so --v-min must be the lower. Give bounds that "
                         f"hold the returns you expect, e.g. --v-min -100 --v-max 100 (CleanRL's classic-control default; Atari: -10 and 10).")


# ============================================================================ network
class QNetwork(dqn.QNetwork):
    """CleanRL's C51 network: DQN's layers (an MLP 120-84 ReLU, or the Nature CNN; PyTorch's default init, so a seed
    gives CleanRL's weights) with ``n_atoms`` outputs per action, each action's probabilities over the fixed returns
    ``atoms``. Called, it gives the Q-values (the expected returns) that acting and evaluation take the argmax of."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, n_atoms: int = 101, v_min: float = -100.0, v_max: float = 100.0):
        super().__init__(obs_shape, num_actions * n_atoms)
        self.num_actions, self.n_atoms = num_actions, n_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, steps=n_atoms))

    def get_action(self, x: torch.Tensor, action: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """CleanRL's: the greedy action (or the given one) and its probabilities over the atoms."""
        # probability mass function for each action
        pmfs, q_values = categorical_q_values(self.network(x), self.atoms)
        if action is None:
            action = torch.argmax(q_values, 1)
        return action, pmfs[torch.arange(len(x)), action]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return categorical_q_values(self.network(x), self.atoms)[1]

    def q_values_on_host(self, device: torch.device) -> Callable[[np.ndarray], np.ndarray]:
        return host_categorical_q_values(self, device)  # a small MLP on the CPU in numpy (the softmax and expected return too)


def make_q_network(args: Args, obs_shape: tuple[int, ...], num_actions: int) -> QNetwork:
    return QNetwork(obs_shape, num_actions, args.n_atoms, args.v_min, args.v_max)


# ============================================================================ loss
def c51_loss(q_network: QNetwork, target_network: QNetwork, data: ReplayBatch, args: Args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CleanRL's C51 update on a sampled batch: the target network's distribution for its greedy next action, shifted by
    the reward and discounted, projected back onto the atoms; the loss is its cross-entropy with the distribution of the
    action taken. Returns the loss and the scalars CleanRL logs (``losses/loss``, ``losses/q_values``)."""
    with torch.no_grad():
        _, next_pmfs = target_network.get_action(data.next_obs)
        target_pmfs = categorical_projection(next_pmfs, data.rewards, data.dones, args.gamma, target_network.atoms)

    _, old_pmfs = q_network.get_action(data.obs, data.actions)
    loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
    old_val = (old_pmfs.detach() * q_network.atoms).sum(1)
    return loss, {"loss": loss.detach(), "q_values": old_val.mean()}


def adam_eps(args: Args) -> float:
    return 0.01 / args.batch_size  # CleanRL's c51.py and c51_atari.py


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train C51, in one process or under torchrun: DQN's loop (dqn.py) with C51's pieces. ``explicit``: the flags given
    on the command line (they win over a resumed run's saved arguments)."""
    return dqn.train(args, explicit, algo="c51", family_defaults=FAMILY_DEFAULTS, validate=validate,
                     make_q_network=make_q_network, loss_fn=c51_loss, adam_eps=adam_eps)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``obs -> action``: greedy on the expected returns, or epsilon-greedy with the run's final
    epsilon (CleanRL's c51_eval uses --end-e)."""
    saved = state["args"]  # the run's flags, its family defaults filled in
    q_network = QNetwork(envs.single_observation_space.shape, int(envs.single_action_space.n), saved["n_atoms"], saved["v_min"], saved["v_max"])
    q_network.load_state_dict(state["q_network"])
    q_network.epsilon = float(saved["end_e"])
    return policy_fn(q_network, envs, deterministic)


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
