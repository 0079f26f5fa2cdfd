"""Which observation and action spaces the algorithms take, checked once the envs are built.

Observations reach the algorithms as one array per env. Python envs are made so by
:class:`fleetrl.envs.registry.EnvFactory`, which flattens Dict, Tuple, Discrete and multi-dimensional
Box observations into a 1-D Box (and says so once). A 1-D observation of any dtype feeds an MLP as
float32; a 3-D one is an image for a CNN, kept as bytes when it is uint8 (:func:`fleetrl.nets.network_obs_dtype`).
Actions: PPO samples from a categorical (Discrete) or a diagonal Gaussian (a 1-D Box); DQN and discrete SAC take
Discrete, SAC, TD3 and DDPG a 1-D Box.
"""

from __future__ import annotations

import gymnasium as gym

from fleetrl.errors import UnsupportedSpaceError

SUPPORTED_ACTIONS = {"ppo": ("Discrete", "Box"), "ppg": ("Discrete",), "ppo_rnd": ("Discrete",), "dqn": ("Discrete",), "c51": ("Discrete",), "rainbow": ("Discrete",), "sac": ("Box",), "sac_discrete": ("Discrete",), "td3": ("Box",), "ddpg": ("Box",)}
# which algorithm to use instead, when the action space is one fleetrl trains with another algorithm
_OTHER_ALGOS = {"Discrete": "`fleetrl train ppo`, `dqn` or `sac_discrete`", "Box": "`fleetrl train ppo`, `sac`, `td3` or `ddpg`"}

# how to train an env whose action space is not supported, by the space's class name
_ACTION_HINTS = {
    "MultiDiscrete": "wrap the env in your module so that it takes one Discrete(prod(nvec)) action, "
                     "the index of a combination of the sub-actions",
    "MultiBinary": "wrap the env in your module so that it takes one Discrete(2**n) action whose bits are the n "
                   "binary actions (or a Box(0, 1, (n,)) thresholded at 0.5)",
}


def check_action_space(env_id: str, space: gym.Space, supported: tuple[str, ...] | None = None, algo: str = "ppo") -> None:
    """Refuse an action space that ``algo`` cannot sample from, naming the env, the space and what is supported.

    ``supported``: class names of the spaces taken (default: ``SUPPORTED_ACTIONS[algo]``); subclasses count."""
    supported = tuple(supported or SUPPORTED_ACTIONS.get(algo, SUPPORTED_ACTIONS["ppo"]))
    names = {cls.__name__ for cls in type(space).__mro__}
    what = f"fleetrl's {algo.upper()} supports {' and '.join(supported)} action spaces"
    if not names & set(supported):
        hint = _ACTION_HINTS.get(type(space).__name__)
        other = next((algos for name, algos in _OTHER_ALGOS.items() if name in names), None)
        raise UnsupportedSpaceError(f"--env-id {env_id!r} has action space {space}; {what} only."
                                    + (f" To train it, {hint}." if hint else "")
                                    + (f" Train it with {other}." if other and not hint else ""))
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        raise UnsupportedSpaceError(
            f"--env-id {env_id!r} has action space {space}, whose actions start at {int(space.start)}; {what}, with "
            f"Discrete actions numbered from 0. Shift the action by {int(space.start)} in a wrapper in your env module."
        )
    if isinstance(space, gym.spaces.Box) and len(space.shape) != 1:
        raise UnsupportedSpaceError(
            f"--env-id {env_id!r} has action space {space} of shape {space.shape}; {what}, with Box actions a 1-D vector. "
            f"Reshape the action in a wrapper in your env module."
        )


def check_observation_space(env_id: str, space: gym.Space) -> None:
    """Refuse observations the networks cannot take: anything but a Box of 1 (vector) or 3 (image) dimensions.

    Python envs are flattened by :class:`fleetrl.envs.registry.EnvFactory`, so this only fires for a native
    backend (ale, envpool) whose env gives structured observations."""
    if not isinstance(space, gym.spaces.Box):
        raise UnsupportedSpaceError(
            f"--env-id {env_id!r} gives observations as {space}, and fleetrl's networks take one array per env. "
            f"The sync and async backends build the env in Python and flatten Dict and Tuple observations into a vector; "
            f"this backend cannot. Use --env-backend sync or async."
        )
    if len(space.shape) not in (1, 3):
        raise UnsupportedSpaceError(
            f"--env-id {env_id!r} gives observations of shape {space.shape} ({space}); fleetrl's networks take 1-D "
            f"vectors (an MLP) or 3-D images (a CNN). The sync and async backends flatten other shapes into a vector; "
            f"use one of them."
        )


def check_spaces(env_id: str, obs_space: gym.Space, action_space: gym.Space, algo: str = "ppo") -> None:
    """What the trainer calls right after building the envs: a clear :class:`UnsupportedSpaceError` naming the
    env and the space, before any network is built, when ``algo`` cannot take these spaces."""
    check_observation_space(env_id, obs_space)
    check_action_space(env_id, action_space, algo=algo)


def check_same_spaces(index: int, env: gym.Env, observation_space: gym.Space, action_space: gym.Space) -> None:
    """The one check that env ``index`` of a vector has env 0's spaces: every backend stores all envs' observations and
    actions in one array, so they must agree (gymnasium's vector envs refuse the same)."""
    if env.observation_space == observation_space and env.action_space == action_space:
        return
    from fleetrl.errors import FleetError

    which = [f"observation space {env.observation_space} (env 0: {observation_space})"] if env.observation_space != observation_space else []
    which += [f"action space {env.action_space} (env 0: {action_space})"] if env.action_space != action_space else []
    raise FleetError(f"Env {index} of the vector has {' and '.join(which)}: all envs of a vector must share their spaces, since "
                     f"their observations and actions are stored as one batch. Build every env with the same function and "
                     f"arguments (an env that differs, e.g. another game or a different observation wrapper, belongs in a "
                     f"vector of its own), or wrap them so their spaces agree (e.g. gymnasium.wrappers.ResizeObservation or "
                     f"FlattenObservation).")
