"""Network pieces and lean action distributions shared by the algorithms.

The distribution helpers replace ``torch.distributions`` on the hot path: building a
``Categorical`` or ``Normal`` object every step costs more than the tiny networks it wraps.
They compute the same quantities (checked against torch.distributions in the tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain ``std`` and constant bias, as in CleanRL."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float = 1.0, hidden: tuple[int, ...] = (64, 64),
        activation: type[nn.Module] = nn.Tanh, orthogonal: bool = True, init: Callable[[nn.Module], nn.Module] | None = None) -> nn.Sequential:
    """An MLP. ``orthogonal``: CleanRL's PPO initialisation, √2 gain inside and ``out_std`` on the last layer; else
    PyTorch's default, as CleanRL's dqn.py (the layers are made in order, so a seed gives CleanRL's weights). PPO's
    activation is Tanh; DQN passes ``nn.ReLU``. ``init``: applied to each layer as it is made instead (discrete SAC's
    :func:`kaiming_init`)."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_initialised(nn.Linear(in_dim, width), math.sqrt(2), orthogonal, init), activation()]
        in_dim = width
    layers.append(_initialised(nn.Linear(in_dim, out_dim), out_std, orthogonal, init))
    return nn.Sequential(*layers)


def kaiming_init(layer: nn.Module) -> nn.Module:
    """Kaiming-normal weights and zero biases, as CleanRL's sac_atari.py initialises every layer."""
    nn.init.kaiming_normal_(layer.weight)
    nn.init.constant_(layer.bias, 0.0)
    return layer


def _initialised(layer: nn.Module, std: float, orthogonal: bool, init: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
    if init is not None:
        return init(layer)
    return layer_init(layer, std) if orthogonal else layer


def network_obs_dtype(obs_shape: tuple[int, ...], dtype) -> np.dtype:
    """The dtype observations are stored and fed to the network in: uint8 images (3-D, for a CNN, which
    scales them) stay bytes; every other observation, a vector of any dtype (uint8, int, float64, bool)
    included, becomes float32 for the MLP."""
    return np.dtype(np.uint8) if len(obs_shape) == 3 and np.dtype(dtype) == np.uint8 else np.dtype(np.float32)


def network_input(obs: np.ndarray) -> np.ndarray:
    """A batch of observations ``(N, *obs_shape)`` in :func:`network_obs_dtype` (no copy when it is already)."""
    return obs if obs.dtype == np.uint8 and obs.ndim == 4 else obs.astype(np.float32, copy=False)


def nature_convs(in_channels: int, size: int = 84, orthogonal: bool = True,
                 init: Callable[[nn.Module], nn.Module] | None = None) -> tuple[nn.Sequential, int]:
    """The Nature CNN's three ReLU convolutions and the flatten (no scaling: the caller divides uint8 frames by 255),
    and the width of their output (3136 for 84x84 frames). Rainbow's dueling heads start here; NatureCNN adds a layer.
    ``init``: as :func:`mlp`'s."""
    gain = math.sqrt(2)
    convs = nn.Sequential(
        _initialised(nn.Conv2d(in_channels, 32, 8, stride=4), gain, orthogonal, init),
        nn.ReLU(),
        _initialised(nn.Conv2d(32, 64, 4, stride=2), gain, orthogonal, init),
        nn.ReLU(),
        _initialised(nn.Conv2d(64, 64, 3, stride=1), gain, orthogonal, init),
        nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        flat = convs(torch.zeros(1, in_channels, size, size)).shape[1]
    return convs, flat


class NatureCNN(nn.Module):
    """The DQN Nature CNN over stacked uint8 frames, ending in 512 ReLU features. ``orthogonal``: CleanRL's PPO
    initialisation (√2 gain); else PyTorch's default, as CleanRL's dqn_atari.py."""

    out_dim = 512

    def __init__(self, in_channels: int, size: int = 84, orthogonal: bool = True):
        super().__init__()
        convs, flat = nature_convs(in_channels, size, orthogonal)
        self.net = nn.Sequential(convs, _initialised(nn.Linear(flat, self.out_dim), math.sqrt(2), orthogonal), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float() / 255.0)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, normed_scale: float | None = None):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        if normed_scale is not None:  # made and rescaled one at a time, as ppg_procgen.py makes them
            layer_init_normed(self.conv0, (1, 2, 3), normed_scale)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        if normed_scale is not None:
            layer_init_normed(self.conv1, (1, 2, 3), normed_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def layer_init_normed(layer: nn.Module, norm_dim: int | tuple[int, ...], scale: float = 1.0) -> nn.Module:
    """PPG's initialisation (CleanRL's ppg_procgen.py): the layer's default weights rescaled so that each output's
    weights have norm ``scale`` (over ``norm_dim``), and zero biases. It draws nothing from torch's RNG."""
    with torch.no_grad():
        layer.weight.data *= scale / layer.weight.norm(dim=norm_dim, p=2, keepdim=True)
        layer.bias *= 0
    return layer


class ImpalaCNN(nn.Module):
    """The IMPALA CNN of CleanRL's ppo_procgen.py: three conv/max-pool/2-residual stages (16, 32, 32)
    over uint8 images (CHW, or HWC which is transposed), ending in 256 ReLU features. ``normed``: ppg_procgen.py's
    initialisation (:func:`layer_init_normed`: each stage's convolution to norm 1, the residual convolutions to
    sqrt(1 / sqrt(3) / sqrt(2)), the last layer to 1.4), made in its order, so a seed gives its weights."""

    out_dim = 256

    def __init__(self, obs_shape: tuple[int, ...], normed: bool = False):
        super().__init__()
        self.channels_last = obs_shape[-1] in (1, 3, 4) and obs_shape[0] not in (1, 3, 4)
        c, h, w = (obs_shape[2], obs_shape[0], obs_shape[1]) if self.channels_last else obs_shape
        conv_scale = float(np.sqrt(1 / np.sqrt(3) / np.sqrt(2)))  # "Not fully sure about the logic behind this but its used in PPG code"
        stages: list[nn.Module] = []
        for out_channels in (16, 32, 32):
            conv = nn.Conv2d(c, out_channels, 3, padding=1)
            stages += [layer_init_normed(conv, (1, 2, 3)) if normed else conv, nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(out_channels, conv_scale if normed else None), _ResidualBlock(out_channels, conv_scale if normed else None)]
            c, h, w = out_channels, (h + 1) // 2, (w + 1) // 2
        top = nn.Linear(c * h * w, self.out_dim)
        top = layer_init_normed(top, 1, scale=1.4) if normed else layer_init(top)
        self.net = nn.Sequential(*stages, nn.Flatten(), nn.ReLU(), top, nn.ReLU())

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


# --- distributional Q-values (C51; Rainbow) -------------------------------------------------


def categorical_q_values(logits: torch.Tensor, atoms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A distributional Q head's output ``(B, A * n_atoms)`` (or ``(B, A, n_atoms)``) as CleanRL's c51.py reads it:
    each action's probabilities over the fixed return ``atoms`` ``(B, A, n_atoms)``, and its Q-value, the expected
    return ``(B, A)``."""
    pmfs = torch.softmax(logits.view(logits.shape[0], -1, len(atoms)), dim=2)  # shape[0]: a traced graph keeps its batch free
    return pmfs, (pmfs * atoms).sum(2)


def categorical_projection(next_pmfs: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor, gamma: float | torch.Tensor,
                           atoms: torch.Tensor) -> torch.Tensor:
    """The C51 target: the distribution of ``rewards + gamma * Z'`` (``Z'``: ``next_pmfs`` ``(B, n_atoms)`` over
    ``atoms``; 0 after a terminal, ``dones`` 1) projected back onto ``atoms``, each shifted atom's mass split between
    its two neighbours. CleanRL's c51.py arithmetic, operation for operation (so the same inputs give the same bits),
    with its loop over the batch's rows (two ``index_add_`` each) made one ``index_add_`` over the flattened batch: each
    row's cells receive the same additions in the same order. ``gamma``: a number, or each transition's ``(B,)``
    discount (Rainbow's n-step ``gamma ** k``: CleanRL's ``gamma ** n`` multiplies in float32 too, so the same bits)."""
    n_atoms, v_min, v_max = len(atoms), float(atoms[0]), float(atoms[-1])
    discount = gamma.unsqueeze(1) if isinstance(gamma, torch.Tensor) else gamma
    next_atoms = rewards.unsqueeze(1) + discount * atoms * (1 - dones.unsqueeze(1))
    delta_z = atoms[1] - atoms[0]
    tz = next_atoms.clamp(v_min, v_max)
    b = (tz - v_min) / delta_z
    lower = b.floor().clamp(0, n_atoms - 1)
    upper = b.ceil().clamp(0, n_atoms - 1)
    # (lower == upper) handles b landing exactly on an atom: all its mass goes to that atom
    d_m_l = (upper + (lower == upper).float() - b) * next_pmfs
    d_m_u = (b - lower) * next_pmfs
    offset = torch.arange(len(next_pmfs), device=next_pmfs.device).unsqueeze(1) * n_atoms  # row i's cells in the flat view
    target_pmfs = torch.zeros_like(next_pmfs)
    target_pmfs.view(-1).index_add_(0, (lower.long() + offset).view(-1), d_m_l.view(-1))
    target_pmfs.view(-1).index_add_(0, (upper.long() + offset).view(-1), d_m_u.view(-1))
    return target_pmfs


# --- Rainbow's noisy dueling head (CleanRL's rainbow_atari.py) ------------------------------------------------------


class NoisyLinear(nn.Module):
    """A linear layer with learned Gaussian noise on its weights and biases (NoisyNet, Fortunato et al. 2018), which
    explores in place of epsilon-greedy. CleanRL's: independent noise for each weight (``std_init / sqrt(fan_in)``),
    drawn anew by :meth:`reset_noise` from torch's RNG (or a generator), which the algorithm calls before each update; made in CleanRL's
    order, so a seed gives its weights and noise. In eval mode it is the mean layer: evaluation plays without noise."""

    def __init__(self, in_features: int, out_features: int, std_init: float = 0.5):
        super().__init__()
        self.in_features, self.out_features, self.std_init = in_features, out_features, std_init
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.register_buffer("weight_epsilon", torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        self.register_buffer("bias_epsilon", torch.empty(out_features))
        self.reset_parameters()
        self.reset_noise()

    def reset_parameters(self) -> None:
        mu_range = 1 / math.sqrt(self.in_features)
        self.weight_mu.data.uniform_(-mu_range, mu_range)
        self.weight_sigma.data.fill_(self.std_init / math.sqrt(self.in_features))
        self.bias_mu.data.uniform_(-mu_range, mu_range)
        self.bias_sigma.data.fill_(self.std_init / math.sqrt(self.out_features))

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        self.weight_epsilon.normal_(generator=generator)
        self.bias_epsilon.normal_(generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return F.linear(x, self.weight_mu + self.weight_sigma * self.weight_epsilon, self.bias_mu + self.bias_sigma * self.bias_epsilon)
        return F.linear(x, self.weight_mu, self.bias_mu)


class NoisyDuelingHead(nn.Module):
    """Rainbow's distributional dueling head: a value stream and an advantage stream, each NoisyLinear, ReLU,
    NoisyLinear, giving per-atom logits ``value + advantage - mean advantage``, ``(B, num_actions, n_atoms)``
    (:func:`categorical_q_values` turns them into probabilities and Q-values). CleanRL's layers, in its order."""

    def __init__(self, in_dim: int, hidden: int, num_actions: int, n_atoms: int):
        super().__init__()
        self.num_actions, self.n_atoms = num_actions, n_atoms
        self.value_head = nn.Sequential(NoisyLinear(in_dim, hidden), nn.ReLU(), NoisyLinear(hidden, n_atoms))
        self.advantage_head = nn.Sequential(NoisyLinear(in_dim, hidden), nn.ReLU(), NoisyLinear(hidden, n_atoms * num_actions))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        value = self.value_head(h).view(-1, 1, self.n_atoms)
        advantage = self.advantage_head(h).view(-1, self.num_actions, self.n_atoms)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """New noise for every noisy layer, the value stream's first (CleanRL's order of draws), from ``generator``
        (default: torch's global RNG)."""
        for layer in self.modules():
            if isinstance(layer, NoisyLinear):
                layer.reset_noise(generator)


# --- PQN's Q-networks: LayerNorm after every hidden layer (CleanRL's pqn.py, pqn_atari_envpool.py) -----------------


def layernorm_mlp(in_dim: int, out_dim: int, hidden: tuple[int, ...] = (120, 84)) -> nn.Sequential:
    """Linear, LayerNorm, ReLU for each hidden layer, then a linear head; every Linear orthogonal with √2 gain, made in
    CleanRL's order (so a seed gives its weights)."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.LayerNorm(width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers, layer_init(nn.Linear(in_dim, out_dim)))


def layernorm_nature_cnn(in_channels: int, out_dim: int, size: int = 84) -> nn.Sequential:
    """The Nature CNN with a LayerNorm over each layer's output before its ReLU, then a linear head (CleanRL's
    pqn_atari_envpool.py; the caller scales uint8 frames by 1/255)."""
    layers: list[nn.Module] = []
    for out_channels, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
        size = (size - kernel) // stride + 1
        layers += [layer_init(nn.Conv2d(in_channels, out_channels, kernel, stride=stride)), nn.LayerNorm([out_channels, size, size]), nn.ReLU()]
        in_channels = out_channels
    flat = in_channels * size * size
    return nn.Sequential(*layers, nn.Flatten(), layer_init(nn.Linear(flat, 512)), nn.LayerNorm(512), nn.ReLU(),
                         layer_init(nn.Linear(512, out_dim)))
