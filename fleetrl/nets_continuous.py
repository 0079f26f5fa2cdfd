"""What SAC and TD3 share: CleanRL's twin Q(s, a) critics, 256-256 ReLU trunk and action rescaling, the critics'
loss. (The steps of the off-policy loop that are not the algorithm are in fleetrl/offpolicy.py.)
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl.errors import UnsupportedSpaceError

HIDDEN = 256  # CleanRL's width for SAC's and TD3's actors and critics


# ============================================================================ networks
def relu_trunk(envs, hidden: int = HIDDEN) -> nn.Sequential:
    """fc1, ReLU, fc2, ReLU on the observation: the body of CleanRL's SAC and TD3 actors (PyTorch's default init)."""
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    return nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())


def add_action_rescaling(module: nn.Module, action_space: gym.spaces.Box) -> None:
    """CleanRL's ``action_scale`` and ``action_bias`` buffers: a tanh output in [-1, 1] maps onto [low, high]."""
    low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise UnsupportedSpaceError(
            f"The action space {action_space} is unbounded; SAC and TD3 squash their actions with tanh into [low, high], "
            f"which must be finite. Give the env's Box finite bounds in a wrapper in your env module."
        )
    module.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
    module.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))


class SoftQNetwork(nn.Module):
    """CleanRL's critic Q(s, a): fc1, ReLU, fc2, ReLU, fc3 on [obs, action] (PyTorch's default init)."""

    def __init__(self, in_dim: int, hidden: int = HIDDEN):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(in_dim, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """Q of the concatenated [obs, action] ``x``, shape (B,). ``frozen``: gradients reach ``x`` (the actor's action)
        but not the parameters, whose weight gradients would cost a third of the backward pass for nothing."""
        params = [p.detach() if frozen else p for p in (self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                                                        self.fc3.weight, self.fc3.bias)]
        x = F.relu(F.linear(x, params[0], params[1]))
        x = F.relu(F.linear(x, params[2], params[3]))
        return F.linear(x, params[4], params[5]).view(-1)


class TwinQNetwork(nn.Module):
    """qf1 and qf2: two :class:`SoftQNetwork` critics; ``forward`` returns the Q values of those chosen as (num, B)."""

    def __init__(self, envs, hidden: int = HIDDEN, num_critics: int = 2):
        super().__init__()
        in_dim = int(np.prod(envs.single_observation_space.shape) + np.prod(envs.single_action_space.shape))
        self.critics = nn.ModuleList([SoftQNetwork(in_dim, hidden) for _ in range(num_critics)])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, critics: slice = slice(None), frozen: bool = False) -> torch.Tensor:
        """``frozen``: no gradients for the critics' parameters, as when the actor loss backpropagates through them."""
        x = torch.cat([obs, actions], -1)
        return torch.stack([qf(x, frozen) for qf in self.critics[critics]])


def twin_q_loss(qf: TwinQNetwork, obs: torch.Tensor, actions: torch.Tensor, next_q_value: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critics' loss: each critic's mean squared TD error to ``next_q_value``, summed; with CleanRL's scalars
    (``qf1_*`` and ``qf2_*`` per critic, and ``qf_loss`` their mean, where there are two: DDPG's one critic has only
    ``qf1_values`` and ``qf1_loss``). One critic's is ``F.mse_loss``'s value and gradient bit for bit."""
    qf_a_values = qf(obs, actions)  # (critics, B)
    qf_losses = (qf_a_values - next_q_value).square().mean(1)
    qf_loss = qf_losses.sum()
    values = qf_a_values.detach().mean(1)
    stats = {}
    for i in range(len(qf_losses)):
        stats[f"qf{i + 1}_values"], stats[f"qf{i + 1}_loss"] = values[i], qf_losses[i].detach()
    if len(qf_losses) > 1:
        stats["qf_loss"] = qf_loss.detach() / len(qf_losses)
    return qf_loss, stats
