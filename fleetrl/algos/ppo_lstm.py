"""PPO with an LSTM, CleanRL's ppo_atari_lstm.py on fleetrl's engine: PPO's loop, advantage and loss (ppo.py), with a
recurrent agent, a rollout that carries each env's state, and minibatches of whole env sequences.

Order: arguments, the network, the rollout loop, the minibatches, training (PPO's, with these three pieces).

As in CleanRL: an LSTM of 128 after the encoder (the Nature CNN over one 84x84 frame for Atari, since the LSTM
remembers; a 64-64 tanh MLP otherwise); each env's state is zeroed where its episode starts; a minibatch is every
step of ``--num-envs / --num-minibatches`` envs, in time order, from their states at the rollout's start.

Differences from CleanRL, each on purpose (besides PPO's, ppo.py):
* the state in flight (each env's, at the end of the latest rollout) is checkpointed, and a resumed run continues it;
* the sampler's modes keep each env's state across rollouts: the zero-lag split and ``--policy-lag 1`` (whose
  rollouts act with the weights of one update before, states included); first-ready batches (``--async-batch``)
  are refused, since their rows are arrival batches, not the steps a sequence needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl.accel import autocast
from fleetrl.algos import ppo
from fleetrl.algos.source import train_main
from fleetrl.errors import FleetError
from fleetrl.monitor import TrainResult
from fleetrl.nets import NatureCNN, categorical_logprob_entropy, categorical_sample, gaussian_logprob_entropy, gaussian_sample, layer_init
from fleetrl.policy import policy_fn
from fleetrl.sampling.sampler import Due

LSTM_SIZE = 128  # CleanRL's nn.LSTM(512, 128)


# ============================================================================ arguments
@dataclass
class Args(ppo.Args):
    """PPO's flags (ppo.py), CleanRL's ppo_atari_lstm.py defaults for Atari; None: the env family's default."""

    exp_name: str = "ppo_lstm"
    """the name of this experiment"""
    gae_lambda: float | None = None
    """the lambda for the general advantage estimation [0.95; classic control 0.8]"""
    normalize: bool | None = None
    """normalise observations and rewards with running statistics [on for MuJoCo and classic control, off otherwise]"""


FAMILY_DEFAULTS = {
    # (not PettingZoo games' families: AGENT_ROWS below)
    **{family: {**defaults, "gae_lambda": 0.95} for family, defaults in ppo.FAMILY_DEFAULTS.items() if not family.startswith("multiagent")},
    # CleanRL's ppo_atari_lstm.py: ppo_atari.py's, with one frame a step
    "atari": {**ppo.FAMILY_DEFAULTS["atari"], "frame_stack": 1, "gae_lambda": 0.95},
    # CleanRL has no recurrent classic-control file; RL Zoo's tuned RecurrentPPO for CartPoleNoVel-v1 (8 envs x 32 steps,
    # one minibatch, 20 epochs, lr 1e-3 annealed, gamma 0.98, lambda 0.8, no entropy bonus, normalised)
    "classic": dict(total_timesteps=500_000, learning_rate=1e-3, num_envs=8, num_steps=32, num_minibatches=1, update_epochs=20,
                    clip_coef=0.2, ent_coef=0.0, gamma=0.98, gae_lambda=0.8, normalize=True),
}
AGENT_ROWS = False  # PettingZoo games refused: an agent that leaves a game early would cut its row's sequence
RANGES = ppo.RANGES


def validate(args: Args, world_size: int = 1) -> None:
    """PPO's checks, and the recurrent minibatches': whole env sequences, so the envs of each process split evenly."""
    ppo.validate(args, world_size)
    local_num_envs = args.num_envs // world_size
    if local_num_envs % args.num_minibatches:
        raise FleetError(f"ppo_lstm's minibatches are whole env sequences: --num-minibatches {args.num_minibatches} must divide the "
                         f"{local_num_envs} envs of each process (--num-envs {args.num_envs}). Choose one of "
                         f"{[d for d in range(1, local_num_envs + 1) if local_num_envs % d == 0][:8]}, or change --num-envs.")
    if args.async_batch is not None and args.async_batch < args.num_envs:
        raise FleetError(f"ppo_lstm trains on whole env sequences, and --async-batch {args.async_batch} gives first-ready batches, "
                         f"whose rows are arrival batches, not steps of each env. Leave --async-batch out (the envs still step "
                         f"in two overlapped groups where the backend allows, and --policy-lag 1 overlaps learning).")


# ============================================================================ network
class Agent(nn.Module):
    """Encoder, LSTM, actor and critic heads. ``state_shape``: each env's state, the LSTM's hidden and cell stacked."""

    state_shape = (2, LSTM_SIZE)

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.Space, impala: bool = False):
        super().__init__()
        if impala:
            raise FleetError("ppo_lstm's encoder is CleanRL's Nature CNN; train Procgen with `fleetrl train ppo`.")
        self.continuous = isinstance(action_space, gym.spaces.Box)
        num_outputs = int(np.prod(action_space.shape)) if self.continuous else int(action_space.n)
        if len(obs_shape) == 3:
            self.encoder: nn.Module = NatureCNN(obs_shape[0])
            features = NatureCNN.out_dim
        else:
            features = 64
            self.encoder = nn.Sequential(layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(),
                                         layer_init(nn.Linear(64, features)), nn.Tanh())
        self.lstm = nn.LSTM(features, LSTM_SIZE)
        for name, param in self.lstm.named_parameters():  # CleanRL's initialisation
            nn.init.constant_(param, 0) if "bias" in name else nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(LSTM_SIZE, num_outputs), std=0.01)
        self.critic = layer_init(nn.Linear(LSTM_SIZE, 1), std=1.0)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, num_outputs))
        self.compute_dtype = torch.float32  # set by the engine's precision choice (fleetrl/accel.py)

    def unroll(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM over ``T`` steps of ``N`` envs (``x`` time-major, ``T * N`` rows) from ``state`` ``(N, 2, 128)``, each
        env's state zeroed where ``starts`` says its episode starts. Returns every step's output and the final state."""
        with autocast(x.device.type, self.compute_dtype):  # --precision: the encoder only
            features = self.encoder(x).float()
        n, lstm = state.shape[0], self.lstm
        # nn.LSTM's cell, written out: the input's part of the gates for every step in one product, then per step only
        # the recurrent product (one nn.LSTM call a step costs ~8x as much here, forward and backward)
        gates_in = (features @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + lstm.bias_hh_l0).reshape(-1, n, 4 * LSTM_SIZE)
        keep = (~starts.reshape(-1, n, 1)).float()  # CleanRL's (1 - done) * state
        h, c = state[:, 0], state[:, 1]
        outputs = []
        for t in range(gates_in.shape[0]):
            h, c = keep[t] * h, keep[t] * c
            i, f, g, o = (gates_in[t] + h @ lstm.weight_hh_l0.T).chunk(4, 1)  # nn.LSTM's gate order
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.cat(outputs), torch.stack([h, c], 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, starts: torch.Tensor | None = None):
        """One step of ``N`` envs: actor output (logits or Gaussian mean), value and the states after the step."""
        state = torch.zeros(len(x), *self.state_shape, device=x.device) if state is None else state
        starts = torch.zeros(len(x), dtype=torch.bool, device=x.device) if starts is None else starts
        hidden, state = self.unroll(x, state, starts)
        return self.actor(hidden), self.critic(hidden).squeeze(-1), state

    def evaluate(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Update: log-probability and entropy of a minibatch's actions and its values, unrolled over its sequences."""
        hidden, _ = self.unroll(mb["obs"], mb["initial_state"], mb["starts"])
        out, value = self.actor(hidden), self.critic(hidden).squeeze(-1)
        if self.continuous:
            logprob, entropy = gaussian_logprob_entropy(out, self.actor_logstd, mb["actions"])
        else:
            logprob, entropy = categorical_logprob_entropy(out, mb["actions"])
        return logprob, entropy, value

    def act(self, x: torch.Tensor, deterministic: bool, state: torch.Tensor, starts: torch.Tensor):
        """The policy interface (fleetrl/policy.py), for evaluation: actions and the states after the step."""
        out, _, state = self(x, state, starts)
        if deterministic:
            return (out if self.continuous else out.argmax(-1)), state
        return (gaussian_sample(out, self.actor_logstd) if self.continuous else categorical_sample(out))[0], state


# ============================================================================ rollout
def rollout(steps: Iterable[Due]) -> None:
    """PPO's rollout loop (ppo.py), carrying each env's LSTM state from one step to its next, across rollouts."""
    for due in steps:  # envs whose next action is due, with their observations and states
        action, logprob, value, state = due.actor.act(due.obs, due.noise, due.state, due.starts)
        due.store(obs=due.obs, actions=action, logprobs=logprob, values=value, states=due.state, starts=due.starts)
        due.keep_state(state)  # the state after this step, for these envs' next one
        due.send(action)


# ============================================================================ update
def sequence_minibatches(batch: dict[str, torch.Tensor], num_steps: int, num_minibatches: int) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of CleanRL's recurrent minibatches: the envs shuffled, each minibatch every step of an equal share of
    them, time-major (the order the LSTM unrolls), with their states at the rollout's start."""
    num_envs = len(batch["obs"]) // num_steps
    envs = torch.randperm(num_envs, device=batch["obs"].device)
    per_minibatch = num_envs // num_minibatches
    steps = torch.arange(num_steps, device=envs.device)[:, None] * num_envs
    for start in range(0, num_envs, per_minibatch):
        columns = envs[start : start + per_minibatch]
        mb = {k: v[(steps + columns).reshape(-1)] for k, v in batch.items() if k != "states"}
        mb["initial_state"] = batch["states"][columns]  # row t * num_envs + i, at t = 0
        yield mb


# ============================================================================ training
def train(args: Args, explicit: set[str] | None = None) -> TrainResult:
    """PPO's training loop (ppo.py) with the recurrent agent, its rollout and its sequence minibatches."""
    return ppo.train(args, explicit, algo="ppo_lstm", family_defaults=FAMILY_DEFAULTS, validate=validate, agent_type=Agent,
                     rollout=rollout, minibatches=sequence_minibatches)


# ============================================================================ evaluation
def policy_from_checkpoint(state: dict, envs, deterministic: bool = True):
    """The trained policy as ``(obs, starts) -> action``, carrying each env's state through its episodes."""
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    agent.load_state_dict(state["model"])
    return policy_fn(agent, envs, deterministic, obs_rms=state.get("obs_rms"))


# ============================================================================ command line
if __name__ == "__main__":  # python FILE.py [flags], torchrun FILE.py [flags]; `fleetrl train ./FILE.py` calls train()
    train_main(__name__)
