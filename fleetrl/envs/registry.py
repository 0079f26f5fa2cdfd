"""The one place that maps an env id to its family and its construction.

Families: ``classic`` (discrete actions, vector observations: CartPole, Acrobot, ...),
``atari`` (ALE ids, both ``BreakoutNoFrameskip-v4`` and ``ALE/Breakout-v5``), ``mujoco``
(continuous actions: HalfCheetah-v5, InvertedPendulum-v5, Pendulum-v1, ...) and ``procgen``
(EnvPool's ``BigfishEasy-v0``, ``CoinrunHard-v0``, ...). A custom env is
named ``module.path:EnvId-v0``: fleetrl imports the module (which registers the id), then makes it.
"""

from __future__ import annotations

import difflib
import importlib
import multiprocessing
import os
import re
import shlex
from dataclasses import dataclass
from typing import Callable, TypeVar

import gymnasium as gym

from fleetrl.envs import atari, memory, partial  # noqa: F401  (partial registers CartPoleNoVel-v1, memory ProofofMemory-v0)
from fleetrl.envs.bounded import ProbeHung, run_bounded
from fleetrl.envs.multiagent import GameEnv, is_atari_game, is_pettingzoo_id
from fleetrl.envs.spaces import check_action_space
from fleetrl.envs.wrappers import CheckOutputs, EpisodeStats
from fleetrl.errors import FleetError, UnsupportedSpaceError, require


T = TypeVar("T")
ENV_TIMEOUT_S = 60.0  # --env-timeout's default: an env built for its spaces gets as long as a worker's build (at least 30 s)

PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
                 "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
_PROCGEN_ID = re.compile(rf"({'|'.join(g.capitalize() for g in PROCGEN_GAMES)})(Easy|Hard|Memory|Exploration)?-v0")


def is_procgen_id(env_id: str) -> bool:
    return bool(_PROCGEN_ID.fullmatch(env_id))


def split_custom_id(env_id: str) -> tuple[str | None, str]:
    """`mypkg.envs:MyEnv-v0` -> ("mypkg.envs", "MyEnv-v0"); a plain id -> (None, id)."""
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        return module, name
    return None, env_id


def import_env_module(env_id: str) -> str:
    """Import the module a custom id names (it registers the env) and return the bare gymnasium id."""
    module, name = split_custom_id(env_id)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise FleetError(
                f"--env-id {env_id!r} asks fleetrl to import the module {module!r}, which failed: {exc}. "
                f"Make the module importable (install its package, or add its folder to PYTHONPATH)."
            ) from None
    return name


def env_id_for_checkpoint(saved: str, given: str | None, checkpoint: str, command: str) -> str:
    """The env id a checkpoint is used with: ``given`` (the command line's ``--env-id``) when there is one, else the
    checkpoint's ``saved`` one, unless that names a module (``module:Env-v0``). Importing a module runs its code, and a
    checkpoint may come from anyone (under ``python -m fleetrl`` a ``.py`` file beside it in the current folder is
    importable), so fleetrl imports a module only when the user names it. ``command``: the command to suggest, less
    the ``--env-id`` flag it needs."""
    if given is not None:
        return given
    module, _ = split_custom_id(saved)
    if is_pettingzoo_id(saved) and not saved.startswith(TRUSTED_GAME_PACKAGES):  # a user's PettingZoo module
        module = saved
    if module is None:
        return saved
    named = f" {shlex.quote(saved)}" if saved.isprintable() else ""
    raise FleetError(
        f"The checkpoint {checkpoint} was trained on the env id {saved!r}, which asks fleetrl to import the Python module "
        f"{module!r}, and importing runs its code. fleetrl imports a module only when you name it, never because a "
        f"checkpoint does. If you trust that module (where Python finds it: the current folder under `python -m fleetrl`, "
        f"then PYTHONPATH and your installed packages), name it yourself: {command} --env-id{named or ' MODULE:ENV_ID'}."
    )


TRUSTED_GAME_PACKAGES = ("pettingzoo.", "mpe2.")  # PettingZoo ids a checkpoint may name: installed packages, not a user's module


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The gymnasium spec of an id, or a clear error naming the closest registered ids."""
    name = import_env_module(env_id)
    if atari.is_atari_id(name):
        atari.register_ale()
    if memory.is_minigrid_id(name):
        memory.require_minigrid(env_id)  # registers MiniGrid's ids, or names the extra
    try:
        return gym.spec(name)
    except gym.error.Error:
        close = difflib.get_close_matches(name, list(gym.registry.keys()), n=5, cutoff=0.5)
        hint = f" The closest registered ids are: {', '.join(close)}." if close else ""
        raise FleetError(
            f"Unknown --env-id {env_id!r}: gymnasium has no environment registered under {name!r}.{hint} "
            f"For Atari install the 'atari' extra; for your own env pass 'your.module:YourEnv-v0'."
        ) from None


@dataclass(frozen=True)
class EnvFamily:
    name: str  # "classic" | "atari" | "mujoco" | "procgen" | "multiagent" | "multiagent-image"
    continuous: bool
    agents: int = 1  # a PettingZoo game's agents, each a row of the vector (fleetrl/envs/multiagent.py)
    agent_names: tuple[str, ...] = ()


MULTIAGENT_FAMILIES = ("multiagent", "multiagent-image")  # PettingZoo games: vector observations, or images (a CNN)


def built_and_read(make: Callable[[], gym.Env], read: Callable[[gym.Env], T], env_timeout: float | None = ENV_TIMEOUT_S,
                   name: str = "fleetrl-env-spaces") -> T:
    """``read(env)`` of an env built with ``make`` only for that, then closed, each call within its deadline (the build
    as long as an env worker's: ``env_timeout``, at least 30 s; 0 or None: forever). Raises :class:`ProbeHung` for a call
    that hangs, its thread left behind until the process exits (fleetrl/envs/bounded.py)."""

    def build_and_read(watch) -> T:
        env = watch.call("construction", make)
        try:
            return read(env)
        finally:
            watch.call("close", env.close)

    return run_bounded(build_and_read, env_timeout, name=name)


def read_built(make: Callable[[], gym.Env], read: Callable[[gym.Env], T], env_id: str, env_timeout: float | None = ENV_TIMEOUT_S) -> T:
    """:func:`built_and_read` for an env built to read its spaces: one that hangs ends it in one paragraph."""
    try:
        return built_and_read(make, read, env_timeout)
    except ProbeHung as hung:
        raise FleetError(f"{env_id} was built to read its spaces, and its {hung.what} gave no answer within {hung.timeout:g} s: it "
                         f"hangs (waiting for a server, a lock, a prompt?). Fix what it waits for, or give it longer with "
                         f"--env-timeout SECONDS (a build gets at least 30 s; 0 waits forever).") from None


def env_family(env_id: str, env_timeout: float | None = ENV_TIMEOUT_S) -> EnvFamily:
    """The family of ``env_id``; a classic or custom env is built once to read its action space, for at most
    ``env_timeout`` seconds (:func:`read_built`)."""
    if is_pettingzoo_id(env_id):
        return _multiagent_family(env_id, env_timeout)
    name = import_env_module(env_id)
    if is_procgen_id(name):
        require("envpool", "envpool", f"The Procgen environment {env_id!r}")
        return EnvFamily("procgen", continuous=False)
    if atari.is_atari_id(name):
        env_spec(env_id)  # registers ALE, or says which extra is missing
        return EnvFamily("atari", continuous=False)
    spec = env_spec(env_id)
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    if "mujoco" in entry:
        require("mujoco", "mujoco", f"The MuJoCo environment {env_id!r}")
        return EnvFamily("mujoco", continuous=True)
    make = (lambda: memory.make_minigrid(name)) if memory.is_minigrid_id(name) else (lambda: gym.make(name))
    action_space = read_built(make, lambda probe: probe.action_space, env_id, env_timeout)
    check_action_space(env_id, action_space)
    continuous = isinstance(action_space, gym.spaces.Box)
    # continuous-control envs outside MuJoCo (Pendulum, ...) take the MuJoCo defaults, as in CleanRL
    return EnvFamily("mujoco" if continuous else "classic", continuous)


def _multiagent_family(env_id: str, env_timeout: float | None) -> EnvFamily:
    """A PettingZoo game's family, from one game made here: its agents, and whether rows are images."""
    require("pettingzoo", "multiagent", f"The PettingZoo environment {env_id!r}")
    obs, act, agent_rows, agents = read_built(
        lambda: GameEnv(env_id, atari=is_atari_game(env_id)),
        lambda game: (game.row_observation_space, game.row_action_space, game.agent_rows, tuple(game.agents)), env_id, env_timeout)
    check_action_space(env_id, act)
    image = len(obs.shape) == 3
    if not image and len(obs.shape) != 1:
        raise UnsupportedSpaceError(f"--env-id {env_id!r}: its agents observe {obs}; fleetrl's rows take vectors or images "
                                    f"(height, width, channels).")
    return EnvFamily("multiagent-image" if image else "multiagent", isinstance(act, gym.spaces.Box), agents=agent_rows,
                     agent_names=agents)


@dataclass(frozen=True)
class EnvFactory:
    """A picklable recipe for one env of a vector (it can travel to a worker process).

    Every family but Atari (whose wrappers make the CNN's frames) is made fit for the networks here:
    observations that are not a 1-D Box (Dict, Tuple, Discrete, 2-D or 3-D Box) are flattened into a
    vector, which is said once, and :class:`fleetrl.envs.wrappers.CheckOutputs` stops the run with a clear
    error at a NaN or inf observation or reward, or at an observation of the wrong shape.
    """

    env_id: str
    family: str
    training: bool = True
    sticky_actions: float | None = None
    video_dir: str | None = None  # record this env's episodes to MP4 (--capture-video)
    video_every_episode: bool = False  # every episode (evaluation), else CleanRL's capped cubic schedule
    frame_stack: int = atari.FRAME_STACK  # Atari frames in an observation

    def __call__(self) -> gym.Env:
        render_mode = "rgb_array" if self.video_dir else None
        if self.family in MULTIAGENT_FAMILIES:  # one game; its agents are rows (AgentRows, in the trainer)
            env: gym.Env = GameEnv(self.env_id, atari=is_atari_game(self.env_id), frame_stack=self.frame_stack,
                                   image=self.family == "multiagent-image", **({"render_mode": render_mode} if render_mode else {}))
            if self.video_dir:
                from fleetrl.envs.video import VideoRecorder

                env = VideoRecorder(env, self.video_dir, episode_trigger=_every_episode if self.video_every_episode else None)
            return env
        name = import_env_module(self.env_id)
        if self.family == "atari":
            env = atari.make_atari(name, self.training, self.sticky_actions, render_mode, self.frame_stack)
        else:
            kwargs = {"render_mode": render_mode} if render_mode else {}  # custom envs may not take it
            minigrid = memory.is_minigrid_id(name)  # CleanRL's ppo_trxl wrapping: 84x84 images for its CNN
            env = EpisodeStats(memory.make_minigrid(name, render_mode) if minigrid else gym.make(name, **kwargs))
            space = env.observation_space
            if not minigrid and (not isinstance(space, gym.spaces.Box) or len(space.shape) != 1):  # Dict, Tuple, Discrete, 2-D, images
                env = _flattened(env, self.env_id)
            env = CheckOutputs(env, self.env_id)  # NaN/inf or a wrong shape: a clear error naming the env and the step
        if self.video_dir:
            from fleetrl.envs.video import VideoRecorder

            env = VideoRecorder(env, self.video_dir, episode_trigger=_every_episode if self.video_every_episode else None)
        return env


def _every_episode(episode_id: int) -> bool:
    return True


_ANNOUNCED: set[str] = set()  # env ids whose flattening this process has reported


def _flattened(env: gym.Env, env_id: str) -> gym.Env:
    """``env`` with its observations flattened into one vector for the MLP (said once per process)."""
    space = env.observation_space
    try:
        env = gym.wrappers.FlattenObservation(env)
    except Exception as exc:  # noqa: BLE001 - Text, Graph, Sequence, ...: gymnasium cannot flatten them
        env.close()
        raise UnsupportedSpaceError(
            f"--env-id {env_id!r} has observation space {space}, which fleetrl cannot flatten into a vector for its "
            f"networks ({type(exc).__name__}: {exc}). Give the env a Box, Discrete, Dict or Tuple observation space."
        ) from None
    # once, from the training process: not from each env worker, nor from every rank under torchrun
    if env_id not in _ANNOUNCED and multiprocessing.parent_process() is None and os.environ.get("RANK", "0") == "0":
        _ANNOUNCED.add(env_id)
        print(f"{env_id}: observation space {space} flattened to Box({env.observation_space.shape[0]},) for the network",
              flush=True)
    return env
