"""Network pieces and lean action distributions shared by the algorithms.

The distribution helpers replace ``torch.distributions`` on the hot path: building a
``Categorical`` or ``Normal`` object every step costs more than the tiny networks it wraps.
They compute the same quantities (checked against torch.distributions in the tests).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain ``std`` and constant bias, as in CleanRL."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float = 1.0, hidden: tuple[int, ...] = (64, 64),
        activation: type[nn.Module] = nn.Tanh, orthogonal: bool = True) -> nn.Sequential:
    """An MLP. ``orthogonal``: CleanRL's PPO initialisation, √2 gain inside and ``out_std`` on the last layer; else
    PyTorch's default, as CleanRL's dqn.py (the layers are made in order, so a seed gives CleanRL's weights). PPO's
    activation is Tanh; DQN passes ``nn.ReLU``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_initialised(nn.Linear(in_dim, width), math.sqrt(2), orthogonal), activation()]
        in_dim = width
    layers.append(_initialised(nn.Linear(in_dim, out_dim), out_std, orthogonal))
    return nn.Sequential(*layers)


def _initialised(layer: nn.Module, std: float, orthogonal: bool) -> nn.Module:
    return layer_init(layer, std) if orthogonal else layer


def network_obs_dtype(obs_shape: tuple[int, ...], dtype) -> np.dtype:
    """The dtype observations are stored and fed to the network in: uint8 images (3-D, for a CNN, which
    scales them) stay bytes; every other observation, a vector of any dtype (uint8, int, float64, bool)
    included, becomes float32 for the MLP."""
    return np.dtype(np.uint8) if len(obs_shape) == 3 and np.dtype(dtype) == np.uint8 else np.dtype(np.float32)


def network_input(obs: np.ndarray) -> np.ndarray:
    """A batch of observations ``(N, *obs_shape)`` in :func:`network_obs_dtype` (no copy when it is already)."""
    return obs if obs.dtype == np.uint8 and obs.ndim == 4 else obs.astype(np.float32, copy=False)


class NatureCNN(nn.Module):
    """The DQN Nature CNN over stacked uint8 frames, ending in 512 ReLU features. ``orthogonal``: CleanRL's PPO
    initialisation (√2 gain); else PyTorch's default, as CleanRL's dqn_atari.py."""

    out_dim = 512

    def __init__(self, in_channels: int, size: int = 84, orthogonal: bool = True):
        super().__init__()
        gain = math.sqrt(2)
        convs = nn.Sequential(
            _initialised(nn.Conv2d(in_channels, 32, 8, stride=4), gain, orthogonal),
            nn.ReLU(),
            _initialised(nn.Conv2d(32, 64, 4, stride=2), gain, orthogonal),
            nn.ReLU(),
            _initialised(nn.Conv2d(64, 64, 3, stride=1), gain, orthogonal),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = convs(torch.zeros(1, in_channels, size, size)).shape[1]
        self.net = nn.Sequential(convs, _initialised(nn.Linear(flat, self.out_dim), gain, orthogonal), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float() / 255.0)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(nn.Module):
    """The IMPALA CNN of CleanRL's ppo_procgen.py: three conv/max-pool/2-residual stages (16, 32, 32)
    over uint8 images (CHW, or HWC which is transposed), ending in 256 ReLU features."""

    out_dim = 256

    def __init__(self, obs_shape: tuple[int, ...]):
        super().__init__()
        self.channels_last = obs_shape[-1] in (1, 3, 4) and obs_shape[0] not in (1, 3, 4)
        c, h, w = (obs_shape[2], obs_shape[0], obs_shape[1]) if self.channels_last else obs_shape
        stages: list[nn.Module] = []
        for out_channels in (16, 32, 32):
            stages += [nn.Conv2d(c, out_channels, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_channels), _ResidualBlock(out_channels)]
            c, h, w = out_channels, (h + 1) // 2, (w + 1) // 2
        self.net = nn.Sequential(*stages, nn.Flatten(), nn.ReLU(), layer_init(nn.Linear(c * h * w, self.out_dim)), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.net(x.float() / 255.0)


# --- categorical (discrete actions) ---------------------------------------------------------


def categorical_sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample actions by the Gumbel-max trick; return them with their log-probabilities."""
    log_probs = logits.log_softmax(-1)
    gumbel = -torch.empty_like(logits).exponential_().log()
    action = (log_probs + gumbel).argmax(-1)
    return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_logprob_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = logits.log_softmax(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy


# --- diagonal Gaussian (continuous actions) -------------------------------------------------


def gaussian_sample(mean: torch.Tensor, logstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    noise = torch.randn_like(mean)
    action = mean + logstd.exp() * noise
    logprob = (-0.5 * noise.square() - logstd - LOG_SQRT_2PI).sum(-1)
    return action, logprob


def gaussian_logprob_entropy(mean: torch.Tensor, logstd: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logstd = logstd.expand_as(mean)
    logprob = (-0.5 * ((action - mean) / logstd.exp()).square() - logstd - LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
    return logprob, entropy


def explained_variance(values: np.ndarray, returns: np.ndarray, allreduce=None) -> float:
    """1 - Var[returns - values] / Var[returns]; with ``allreduce`` (a sum over ranks), over all ranks' data."""
    y, d = returns.astype(np.float64), (returns - values).astype(np.float64)
    sums = np.array([y.size, y.sum(), (y * y).sum(), d.sum(), (d * d).sum()])
    if allreduce is not None:
        sums = allreduce(sums)
    n, sy, syy, sd, sdd = sums
    var_y = syy / n - (sy / n) ** 2
    var_d = sdd / n - (sd / n) ** 2
    return float("nan") if var_y <= 0 else float(1 - var_d / var_y)
