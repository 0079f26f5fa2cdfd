"""The acting policy the sampler calls every step: numpy observations in, numpy actions out.

An actor-critic here has ``trunk``, ``actor`` and ``critic`` modules, ``continuous`` and (for
Gaussian policies) ``actor_logstd``, plus ``act(x)`` and ``get_value(x)`` (see algos/ppo.py).

Two implementations with the same results:
* :class:`TorchActor` calls the network itself (CNNs, GPUs, anything).
* :class:`NumpyMLPActor` serves small MLPs on the CPU. At CartPole sizes a torch call costs
  ~100 µs of per-op overhead against ~1 µs of arithmetic, so it runs the same layers in numpy over
  views of the live parameters: no copy, and the optimiser's in-place updates are seen at once.
  Its log-probabilities agree with the learner's to float32 rounding (the tests check it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0.0)}


class TorchActor:
    def __init__(self, agent: nn.Module, device: torch.device):
        self.agent, self.device = agent, device

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        # uint8 images travel as bytes (the network scales them); any other observation as float32
        return torch.as_tensor(obs if obs.dtype == np.uint8 else obs.astype(np.float32, copy=False), device=self.device)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with torch.inference_mode():
            action, logprob, value = self.agent.act(self._tensor(obs))
            return action.cpu().numpy(), logprob.cpu().numpy(), value.cpu().numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.agent.get_value(self._tensor(obs)).cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        return {}  # sampling uses torch's global RNG, saved with the checkpoint

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _numpy_layers(seq: nn.Module) -> list | None:
    """(weight.T, bias) views and activation functions of a Linear/Tanh/ReLU Sequential, or None."""
    if not isinstance(seq, nn.Sequential):
        return None
    layers = []
    for module in seq:
        if isinstance(module, nn.Linear) and module.bias is not None:
            layers.append((module.weight.detach().numpy().T, module.bias.detach().numpy()))
        elif type(module) in _ACTIVATIONS:
            layers.append(_ACTIVATIONS[type(module)])
        else:
            return None
    return layers


def _forward(layers: list, x: np.ndarray) -> np.ndarray:
    for layer in layers:
        x = layer(x) if callable(layer) else x @ layer[0] + layer[1]
    return x


class NumpyMLPActor:
    def __init__(self, actor_layers: list, critic_layers: list, logstd: np.ndarray | None, seed: int):
        self.actor_layers, self.critic_layers, self.logstd = actor_layers, critic_layers, logstd
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = obs.astype(np.float32, copy=False)
        out = _forward(self.actor_layers, obs)
        value = _forward(self.critic_layers, obs)[:, 0]
        if self.logstd is not None:  # diagonal Gaussian
            noise = self.rng.standard_normal(out.shape, dtype=np.float32)
            action = out + np.exp(self.logstd) * noise
            logprob = (-0.5 * noise * noise - self.logstd - LOG_SQRT_2PI).sum(-1)
            return action, logprob.astype(np.float32), value
        # categorical, sampled by the Gumbel-max trick
        shifted = out - out.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        action = (log_probs - np.log(self.rng.exponential(size=out.shape))).argmax(-1)
        return action, np.take_along_axis(log_probs, action[:, None], -1)[:, 0], value

    def value(self, obs: np.ndarray) -> np.ndarray:
        return _forward(self.critic_layers, obs.astype(np.float32, copy=False))[:, 0]

    def state_dict(self) -> dict[str, Any]:
        return {"numpy_rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "numpy_rng" in state:
            self.rng.bit_generator.state = state["numpy_rng"]


def make_actor(agent: nn.Module, device: torch.device, seed: int) -> TorchActor | NumpyMLPActor:
    """The fastest exact acting path for this agent: numpy for small float32 MLPs on the CPU, else torch."""
    params = list(agent.parameters())
    on_cpu_fp32 = (device.type == "cpu" and getattr(agent, "compute_dtype", torch.float32) == torch.float32  # bf16 acts as it learns
                   and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params))
    if on_cpu_fp32 and isinstance(agent.trunk, nn.Identity):
        actor_layers, critic_layers = _numpy_layers(agent.actor), _numpy_layers(agent.critic)
        if actor_layers is not None and critic_layers is not None:
            logstd = agent.actor_logstd.detach().numpy()[0] if agent.continuous else None
            return NumpyMLPActor(actor_layers, critic_layers, logstd, seed)
    return TorchActor(agent, device)
