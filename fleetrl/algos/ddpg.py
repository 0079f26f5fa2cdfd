"""Deep Deterministic Policy Gradient (DDPG) for continuous actions, read as CleanRL's ddpg_continuous_action.py.

DDPG is where TD3 (fleetrl/algos/td3.py) started, and CleanRL's two files differ in two places only: DDPG has one
critic, and its TD target is that critic's value of the target actor's action as it is, with no smoothing noise
(TD3: the lesser of twin critics, of a noised action). CleanRL's DDPG already delays its actor (``--policy-frequency``
2), as TD3 does. So this file holds DDPG's flags and its target, and trains in TD3's loop with them: the deterministic
actor with Gaussian exploration noise, the uniform warm-up, the replay buffer, the critic update every step, the actor
and soft target updates every ``--policy-frequency`` steps (``td3.train``).

Differences from CleanRL, each on purpose, and the same as TD3's:
* a time-limit truncation is not a terminal state: the replay buffer keeps the true final observation to bootstrap from
  (CleanRL's DDPG does too, through ``final_observation``);
* the actor loss backpropagates into the action only, not into the critic's parameters (CleanRL fills their gradients
  and never uses them); the actor's gradients are the same;
* the target networks are copies of the networks (CleanRL builds two more and loads the weights: the same weights,
  but it draws torch's RNG for their discarded initial ones);
* exploration noise is drawn for each env (CleanRL's ``torch.normal(0, action_scale * exploration_noise)`` draws one
  vector for all envs; with its one env the two are the same, bit for bit), and warm-up actions come from the run's
  numpy RNG (CleanRL: the action space's own, unseeded by the run);
* Adam is torch's fused kernel (CleanRL: the default for-each one);
* under torchrun every rank has envs and a replay shard of its own, samples its share of --batch-size, and the
  critic and actor gradients are all-reduced before each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fleetrl import config
from fleetrl.algos import td3
from fleetrl.algos.source import train_main
from fleetrl.monitor import TrainResult


# ============================================================================ arguments
@dataclass
class Args(td3.DeterministicArgs):
    """CleanRL's DDPG flags: those it shares with TD3 (the env, --learning-rate, --exploration-noise,
    --policy-frequency), then the engine's (fleetrl/args.py)."""

    exp_name: str = "ddpg"
    """the name of this experiment"""


FAMILY_DEFAULTS = {  # CleanRL's ddpg_continuous_action.py; continuous control only
    "mujoco": dict(total_timesteps=1_000_000, num_envs=1, buffer_size=1_000_000, tau=0.005, batch_size=256, learning_starts=25_000),
}
AGENT_ROWS = False  # PettingZoo games refused: the replay buffer would store the blank rows of agents that left

RANGES = td3.DETERMINISTIC_RANGES


def validate(args: Args, world_size: int = 1) -> None:
    """Refuse a configuration that cannot run, before anything starts."""
    td3.validate(args, world_size, RANGES)


# ============================================================================ the critic's target
def ddpg_target(args: Args, target_actor: td3.Actor, qf_target, data, low_t: torch.Tensor, high_t: torch.Tensor) -> torch.Tensor:
    """The TD target: the target critic's value of the target actor's action (no smoothing noise, one critic)."""
    next_state_actions = target_actor(data.next_obs)
    qf1_next_target = qf_target(data.next_obs, next_state_actions)[0]
    return data.rewards + (1 - data.dones) * args.gamma * qf1_next_target


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """Train DDPG, in one process or under torchrun: TD3's loop with one critic and DDPG's target."""
    explicit = config.fields_differing_from_default(args) if explicit is None else explicit
    return td3.train(args, explicit, algo="ddpg", family_defaults=FAMILY_DEFAULTS, validate=validate, num_critics=1,
                     target=ddpg_target)


# ============================================================================ evaluation
policy_from_checkpoint = td3.policy_from_checkpoint  # the actor's action, plus exploration noise unless deterministic


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
