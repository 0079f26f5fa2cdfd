"""The policy interface: what acting and evaluation call, the same for every algorithm.

A trained network that acts implements :class:`Policy`: ``act(x, deterministic)`` maps a batch of
observations (as :func:`fleetrl.nets.network_input` makes them) to a batch of actions. A recurrent one (with
``state_shape``) takes and returns its state too: ``act(x, deterministic, state, starts) -> (actions, state)``. Each algorithm's
``policy_from_checkpoint`` rebuilds its network and returns :func:`policy_fn` of it, which is what
``fleetrl eval`` and the video recorder run, and what ``fleetrl export`` turns into one ONNX or TorchScript graph.
"""

from __future__ import annotations

from typing import Callable, Protocol

import gymnasium as gym
import numpy as np
import torch

from fleetrl.nets import network_input


class Policy(Protocol):
    def act(self, x: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions for a batch of observations: the most likely (argmax, the Gaussian's mean, the actor's output)
        with ``deterministic``, else sampled as in training (DQN: epsilon-greedy with the final epsilon)."""
        ...


def policy_fn(policy: Policy, envs, deterministic: bool = True, obs_rms: dict | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """``obs -> action`` for a vector env: observations normalised with a checkpoint's frozen statistics (``obs_rms``,
    its running mean and variance), the network run without gradients, Box actions clipped to the action space."""
    from fleetrl.sampling.normalize import ObsNormalizer

    space = envs.single_action_space
    obs_norm = None
    if obs_rms is not None:
        obs_norm = ObsNormalizer(envs.single_observation_space.shape)
        obs_norm.rms.load_state_dict(obs_rms)
        obs_norm.frozen = True
    if isinstance(policy, torch.nn.Module):
        policy.eval()

    state_shape = getattr(policy, "state_shape", None)  # a recurrent policy: its state per env, carried through episodes
    state = None if state_shape is None else torch.zeros((envs.num_envs, *state_shape))

    def act(obs: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
        nonlocal state
        if obs_norm is not None:
            obs = obs_norm.normalize(obs)
        x = torch.as_tensor(network_input(obs))
        with torch.inference_mode():
            if state is None:
                action = policy.act(x, deterministic)
            else:  # ``starts``: the observations that begin an episode (the policy zeroes their state)
                starts = torch.zeros(len(obs), dtype=torch.bool) if starts is None else torch.as_tensor(starts)
                action, state = policy.act(x, deterministic, state, starts)
        action = action.cpu().numpy()
        return np.clip(action, space.low, space.high) if isinstance(space, gym.spaces.Box) else action

    # what `fleetrl export` (fleetrl/export.py) builds the same computation from, as one graph
    act.network, act.obs_rms, act.deterministic = policy, obs_rms, deterministic
    return act
