"""The acting policy the sampler calls every step: numpy observations in, numpy actions out.

An actor-critic here has ``trunk``, ``actor`` and ``critic`` modules, ``continuous`` and (for
Gaussian policies) ``actor_logstd``; calling it returns the actor output (logits or Gaussian mean)
and the value, in fp32 (see algos/ppo.py).

Three implementations with the same results:
* :class:`TorchActor` calls the network itself (CNNs, GPUs, anything).
* :class:`NumpyMLPActor` serves small MLPs on the CPU. At CartPole sizes torch's per-op overhead is
  nearly all of a call (acting for 4 envs: 206 µs through torch, 43 µs in numpy; benchmarks/costs.py micro),
  so it runs the same layers in numpy over views of the module's parameters: no copy, and in-place
  updates of them are seen at once.
  Its log-probabilities agree with the learner's to float32 rounding (the tests check it).
* :class:`QValueActor` acts from Q-values alone, for an agent whose value is its Q-values' maximum (PQN's; the agent
  says so with ``greedy_value = True``). A float32 Linear/LayerNorm/ReLU network on the CPU runs as the torch functions
  its modules' ``forward`` calls, without the modules (:func:`host_q_values`): torch's own kernels, so the Q-values,
  actions and values are :class:`TorchActor`'s bit for bit, at about half its cost a CartPole step. numpy is not
  used there: its matmuls and LayerNorm round differently, and PQN's values feed its Q(lambda) returns.

A recurrent agent (one with ``state_shape``, e.g. an LSTM's stacked hidden and cell state per env) acts through
torch only: ``act(obs, noise, state, starts)`` also takes each env's state and whether its observation starts an
episode (the agent zeroes those states first), and returns the states after the step; ``value`` takes them too.

All draw their sampling noise from their own numpy Generator (:meth:`noise`), never from torch's
global RNG, and sample on the host with one function (:func:`sample`). So a rollout is reproducible
whichever thread or device acts, and the sampler can draw one step's noise for all envs at once and
hand each group of envs its slice: the same actions as stepping all envs together.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fleetrl.nets import network_input

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0.0)}

ActResult = tuple[np.ndarray, np.ndarray, np.ndarray]  # action, log-probability, value


def sample(out: np.ndarray, logstd: np.ndarray | None, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Actions and their log-probabilities from the actor output and pre-drawn noise.

    Gaussian (``logstd`` given): ``noise`` is standard normal. Categorical: ``noise`` is Exp(1), and
    ``-log(noise)`` is Gumbel noise (the Gumbel-max trick, as ``fleetrl.nets.categorical_sample``).
    """
    if logstd is not None:
        action = out + np.exp(logstd) * noise
        logprob = (-0.5 * noise * noise - logstd - LOG_SQRT_2PI).sum(-1)
        return action, logprob.astype(np.float32)
    shifted = out - out.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    action = (log_probs - np.log(noise)).argmax(-1)
    return action, np.take_along_axis(log_probs, action[:, None], -1)[:, 0]


class _Sampling:
    """The noise and its RNG state, shared by both actors."""

    def __init__(self, num_outputs: int, continuous: bool, seed: int):
        self.num_outputs, self.continuous = num_outputs, continuous
        self.rng = np.random.default_rng(seed)

    def noise(self, n: int) -> np.ndarray:
        """One step's sampling noise for ``n`` envs (row i for the i-th env acted on)."""
        if self.continuous:
            return self.rng.standard_normal((n, self.num_outputs), dtype=np.float32)
        return self.rng.exponential(size=(n, self.num_outputs))

    def state_dict(self) -> dict[str, Any]:
        return {"numpy_rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "numpy_rng" in state:  # checkpoints from before the torch actor had its own RNG carry none
            self.rng.bit_generator.state = state["numpy_rng"]


class TorchActor(_Sampling):
    def __init__(self, agent: nn.Module, device: torch.device, seed: int = 0):
        super().__init__(_num_outputs(agent), agent.continuous, seed)
        self.agent, self.device = agent, device
        self._staging: dict = {}  # pinned host buffers by (shape, dtype), CUDA only

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(network_input(obs))  # uint8 images travel as bytes (the CNN scales them), the rest as float32
        if self.device.type != "cuda":
            return x.to(self.device)
        # through pinned host memory the copy is a DMA that does not block the host; the result's copy back
        # (which waits for this stream) comes before the staging buffer is reused
        staging = self._staging.get((x.shape, x.dtype))
        if staging is None:
            staging = self._staging[(x.shape, x.dtype)] = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        staging.copy_(x)
        return staging.to(self.device, non_blocking=True)

    def act(self, obs: np.ndarray, noise: np.ndarray | None = None, state: np.ndarray | None = None,
            starts: np.ndarray | None = None) -> Any:
        """Actions, log-probabilities and values (and, for a recurrent agent given ``state``, the states after)."""
        with torch.inference_mode():
            if state is None:
                out, value = self.agent(self._tensor(obs))
            else:
                out, value, state = self.agent(self._tensor(obs), *self._recurrent(state, starts))
                state = state.cpu().numpy()
            host = torch.cat([out, value[:, None]], 1).cpu().numpy()  # one device-to-host copy
            logstd = self.agent.actor_logstd.detach()[0].cpu().numpy() if self.continuous else None
        action, logprob = sample(host[:, :-1], logstd, self.noise(len(obs)) if noise is None else noise)
        return (action, logprob, host[:, -1]) if state is None else (action, logprob, host[:, -1], state)

    def greedy(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The greedy actions (the argmax of the actor's output: PQN's Q-values) and the values of ``obs``."""
        with torch.inference_mode():
            out, value = self.agent(self._tensor(obs))
            host = torch.cat([out, value[:, None]], 1).cpu().numpy()
        return host[:, :-1].argmax(-1), host[:, -1]

    def value(self, obs: np.ndarray, state: np.ndarray | None = None, starts: np.ndarray | None = None) -> np.ndarray:
        with torch.inference_mode():
            if state is None:
                return self.agent.get_value(self._tensor(obs)).cpu().numpy()
            return self.agent(self._tensor(obs), *self._recurrent(state, starts))[1].cpu().numpy()

    def _recurrent(self, state: np.ndarray, starts: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        starts = np.zeros(len(state), bool) if starts is None else starts
        return torch.as_tensor(state, device=self.device), torch.as_tensor(starts, device=self.device)


def _num_outputs(agent: nn.Module) -> int:
    """Actions (categorical) or action dimensions (Gaussian): the width of the actor's last layer."""
    return [m for m in agent.actor.modules() if isinstance(m, nn.Linear)][-1].out_features


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


class NumpyMLPActor(_Sampling):
    def __init__(self, actor_layers: list, critic_layers: list, logstd: np.ndarray | None, seed: int):
        super().__init__(actor_layers[-1][0].shape[1], logstd is not None, seed)
        self.actor_layers, self.critic_layers, self.logstd = actor_layers, critic_layers, logstd

    def act(self, obs: np.ndarray, noise: np.ndarray | None = None) -> ActResult:
        obs = obs.astype(np.float32, copy=False)
        out = _forward(self.actor_layers, obs)
        value = _forward(self.critic_layers, obs)[:, 0]
        action, logprob = sample(out, self.logstd, self.noise(len(obs)) if noise is None else noise)
        return action, logprob, value

    def value(self, obs: np.ndarray) -> np.ndarray:
        return _forward(self.critic_layers, obs.astype(np.float32, copy=False))[:, 0]


def _host_layers(module: nn.Module, device: torch.device) -> list | None:
    """:func:`_numpy_layers` of a float32 Sequential on the CPU, else None (a CNN, a GPU, bf16: torch runs it)."""
    return _numpy_layers(module) if _fp32_on_cpu(module, device) else None


def _fp32_on_cpu(module: nn.Module, device: torch.device) -> bool:
    return device.type == "cpu" and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in module.parameters())


def host_forward(module: nn.Module, device: torch.device):
    """``module`` as a function from a numpy batch to a numpy array, for acting one step at a time (DQN's Q-values).

    A float32 Linear/Tanh/ReLU Sequential on the CPU runs in numpy over views of its parameters (DQN's Q-values for one
    CartPole: 12 µs against 46 µs through the torch module; benchmarks/costs.py micro), and the optimiser's in-place steps (and a resume's
    ``load_state_dict``, which copies in place) are seen at once. Anything else (a CNN, a GPU) runs in torch."""
    layers = _host_layers(module, device)
    if layers is not None:
        return lambda obs: _forward(layers, obs.astype(np.float32, copy=False))

    def torch_forward(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.as_tensor(network_input(obs), device=device)).float().cpu().numpy()

    return torch_forward


def host_categorical_q_values(module: nn.Module, device: torch.device):
    """A distributional Q-network's Q-values as :func:`host_forward` gives DQN's: numpy batch in, ``(N, actions)`` out.

    ``module.network`` gives each action's logits over the fixed returns ``module.atoms`` (``(N, actions * n_atoms)``),
    and ``module(x)`` the Q-values (C51's: :func:`fleetrl.nets.categorical_q_values`). Where numpy can run the network,
    the softmax over each action's atoms and the expected return ``sum(pmf * atoms)`` run in numpy float32 too; they
    agree with torch's to float32 rounding, and acting takes only their argmax. Else the whole module runs in torch."""
    layers = _host_layers(module.network, device)
    if layers is None or module.atoms.dtype != torch.float32:
        return host_forward(module, device)
    atoms = module.atoms.numpy()

    def q_values(obs: np.ndarray) -> np.ndarray:
        logits = _forward(layers, obs.astype(np.float32, copy=False)).reshape(len(obs), -1, len(atoms))
        pmfs = logits - logits.max(-1, keepdims=True)
        np.exp(pmfs, out=pmfs)
        pmfs /= pmfs.sum(-1, keepdims=True)  # the softmax over each action's atoms
        return pmfs @ atoms  # sum(pmf * atoms): each action's expected return

    return q_values


class QValueActor(_Sampling):
    """Acting from Q-values alone, for an agent whose ``agent(x)`` is ``(network(x), network(x).max(-1))`` (PQN's):
    :class:`TorchActor`'s draw over the Q-values, and their maximum as the value. ``q_values``: numpy batch in, out."""

    def __init__(self, q_values: Callable[[np.ndarray], np.ndarray], num_actions: int, seed: int):
        super().__init__(num_actions, False, seed)
        self.q_values = q_values

    def act(self, obs: np.ndarray, noise: np.ndarray | None = None) -> ActResult:
        q_values = self.q_values(obs)
        action, logprob = sample(q_values, None, self.noise(len(obs)) if noise is None else noise)
        return action, logprob, q_values.max(-1)

    def greedy(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The greedy actions and their Q-values (the values): :meth:`act` without the draw, which is most of its
        numpy work at CartPole sizes."""
        q_values = self.q_values(obs)
        actions = q_values.argmax(-1)
        return actions, q_values[np.arange(len(q_values)), actions]

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).max(-1)


_TORCH_ACTIVATIONS = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}  # what nn.Tanh and nn.ReLU call


def _torch_functions(seq: nn.Module) -> list | None:
    """A Linear/LayerNorm/Tanh/ReLU Sequential as the torch functions its modules' ``forward`` calls, given detached
    views of their parameters (in-place updates are seen), or None."""
    if not isinstance(seq, nn.Sequential):
        return None
    functions: list = []
    for module in seq:
        if type(module) is nn.Linear:
            functions.append(partial(F.linear, weight=module.weight.detach(),
                                     bias=None if module.bias is None else module.bias.detach()))
        elif type(module) is nn.LayerNorm:
            weight, bias = (None if p is None else p.detach() for p in (module.weight, module.bias))
            functions.append(partial(torch.layer_norm, normalized_shape=module.normalized_shape, weight=weight, bias=bias,
                                     eps=module.eps))
        elif type(module) in _TORCH_ACTIVATIONS:
            functions.append(_TORCH_ACTIVATIONS[type(module)])
        else:
            return None
    return functions


def host_q_values(network: nn.Module, device: torch.device) -> Callable[[np.ndarray], np.ndarray] | None:
    """A float32 Linear/LayerNorm/ReLU ``network`` on the CPU as a function from a numpy batch to its numpy Q-values, or
    None (a CNN, a GPU, bf16).

    It calls the functions the modules' ``forward`` calls, in order, on a tensor over the batch's memory: the same
    kernels, so the same bits as ``network(x)``, without the modules' call overhead (a CartPole step of PQN's 120-84
    LayerNorm MLP for 4 envs: about half of :class:`TorchActor`'s cost). numpy's matmuls and LayerNorm would be a
    little faster, but round differently (at K=120 every batch differed in the last bits), and PQN's values feed its
    Q(lambda) returns, which the lockstep with CleanRL requires bit for bit."""
    functions = _torch_functions(network) if _fp32_on_cpu(network, device) else None
    if functions is None:
        return None

    def q_values(obs: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(obs.astype(np.float32, copy=False))
        with torch.inference_mode():
            for function in functions:
                x = function(x)
        return x.numpy()

    return q_values


def make_actor(agent: nn.Module, device: torch.device, seed: int) -> TorchActor | NumpyMLPActor | QValueActor:
    """The fastest exact acting path for this agent: numpy for small float32 MLPs on the CPU (torch's functions without
    the modules for an agent acting from Q-values, ``greedy_value``), else torch.

    The actor reads ``agent``'s parameters as they are when it acts: give it a copy of the learner's
    network when the learner may change them meanwhile (see fleetrl/sampling/sampler.py)."""
    params = list(agent.parameters())
    on_cpu_fp32 = (device.type == "cpu" and getattr(agent, "compute_dtype", torch.float32) == torch.float32  # bf16 acts as it learns
                   and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params))
    if on_cpu_fp32 and isinstance(getattr(agent, "trunk", None), nn.Identity):
        actor_layers, critic_layers = _numpy_layers(agent.actor), _numpy_layers(agent.critic)
        if actor_layers is not None and critic_layers is not None:
            logstd = agent.actor_logstd.detach().numpy()[0] if agent.continuous else None
            return NumpyMLPActor(actor_layers, critic_layers, logstd, seed)
    if on_cpu_fp32 and getattr(agent, "greedy_value", False) and not getattr(agent, "images", False):
        q_values = host_q_values(agent.network, device)  # PQN's: the network's own torch functions, bit for bit
        if q_values is not None:
            return QValueActor(q_values, _num_outputs(agent), seed)
    return TorchActor(agent, device, seed)


def choose_actor_device(choice: str, learner: torch.device, time_acting: Callable[[torch.device], float],
                        cache_key: Callable[[], str], saved: str | None = None, timed: str = "acting") -> tuple[torch.device, str, str]:
    """Where the acting network runs (``--actor-device``): the device, why, and what a checkpoint remembers of it
    (``"cpu"`` or ``"learner"``, which a resume gives back as ``saved``).

    ``auto`` keeps what a resumed checkpoint acted on; else, with the learner on a GPU, it takes the faster of acting on
    the CPU and on the GPU (``time_acting(device)``: seconds a call), measured once on this machine and cached by
    ``cache_key()`` (fleetrl/accel.py's cache, as the precision is; ``timed`` names what was timed). So the same command acts on the same device on a
    quiet and a busy machine, and a resumed run acts where it did: CPU and GPU arithmetic differ in the last bits.
    """
    cpu = torch.device("cpu")
    if choice == "cpu":
        device, reason = cpu, "--actor-device cpu"
    elif choice == "learner":
        device, reason = learner, "--actor-device learner"
    elif saved in ("cpu", "learner"):
        device, reason = (cpu if saved == "cpu" else learner), f"auto: as the resumed checkpoint acted ({saved})"
    elif learner.type == "cpu":
        device, reason = cpu, "the learner is on the CPU"
    else:
        from fleetrl.accel import measured_once

        labels = {"cpu": cpu, "learner": learner}
        seconds, how = measured_once(cache_key(), lambda: {label: time_acting(d) for label, d in labels.items()})
        device = labels[min(seconds, key=seconds.get)]
        measured = ", ".join(f"{labels[label]} {t * 1e3:.2f} ms" for label, t in seconds.items())
        reason = f"auto: {how} {timed}: {measured}"
    return device, reason, "cpu" if device.type == "cpu" else "learner"
