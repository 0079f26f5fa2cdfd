"""PettingZoo parallel envs as rows of a vector (docs/multi-agent.md).

A game of A agents is A rows: the sampler, the buffers and the learner see an ordinary batch of ``--num-envs`` rows (as
CleanRL's ``ppo_pettingzoo_ma_atari.py`` counts them: 16 rows are 8 two-player games), and one network plays every agent.

Two layers:

* :class:`GameEnv`, one game as a gymnasium env whose observation, action, reward and flags have a leading axis of A
  agents. It runs wherever a Python env runs: in the trainer (sync backend) or in the async backend's worker processes,
  where its rows travel through shared memory as one env's arrays. An agent that has left the game (dead, finished)
  while the others play on gets a row of zeros and reports ``terminated`` on every step until the game ends, so the
  game is over when every row reports an end, and the backend resets it then (same-step autoreset).
* :class:`AgentRows`, the vector of games as a vector of rows, in the trainer: it reshapes, sends and receives whole
  games, keeps each agent's episode statistics from the raw rewards, clips rewards where the preprocessing asks, and says
  which rows hold a live agent (``info["live"]``, on steps where one does not): the sampler stores no transition for a
  row whose agent had left, and since the agent's last transition is marked terminated (or truncated), GAE never runs
  across the gap.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.errors import FleetError

_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def is_pettingzoo_id(env_id: str) -> bool:
    """A dotted module path with no ``-`` or ``:`` (``mpe2.simple_spread_v3``, ``pettingzoo.atari.pong_v3``,
    ``mypkg.my_game``); gymnasium ids carry a version after a dash (``CartPole-v1``)."""
    return bool(_MODULE_PATH.fullmatch(env_id))


def is_atari_game(env_id: str) -> bool:
    return env_id.startswith("pettingzoo.atari.")


def ale_rom_folder() -> str:
    """ale-py ships the ROMs PettingZoo's Atari games need (AutoROM would download them)."""
    import ale_py

    return os.path.join(os.path.dirname(ale_py.__file__), "roms")


def make_parallel_env(env_id: str, **kwargs: Any):
    """The PettingZoo parallel env that ``env_id`` names: its module's ``parallel_env(**kwargs)``, or its AEC ``env()``
    converted, where the game's agents move at once; else a clear error."""
    try:
        module = importlib.import_module(env_id)
    except ModuleNotFoundError as exc:
        hint = (" PettingZoo's own games need `pip install 'fleetrl[multiagent]'`" if env_id.split(".")[0] in ("pettingzoo", "mpe2")
                else "")
        raise FleetError(
            f"--env-id {env_id!r} names a PettingZoo module, and Python cannot import it ({exc}).{hint} Examples that work: "
            f"mpe2.simple_spread_v3, pettingzoo.atari.pong_v3, pettingzoo.butterfly.pistonball_v6; for your own game, a module "
            f"on the import path that defines parallel_env() (or PYTHONPATH pointing at its folder)."
        ) from None
    if is_atari_game(env_id):
        folder = ale_rom_folder()
        kwargs = {"auto_rom_install_path": os.path.dirname(folder), **kwargs}
    if hasattr(module, "parallel_env"):
        maker = module.parallel_env
    elif hasattr(module, "env"):
        maker = _converted_aec(module, env_id)
    else:
        raise FleetError(f"--env-id {env_id!r}: the module has neither parallel_env() nor env(), so it is not a PettingZoo "
                         f"environment. A PettingZoo module defines parallel_env() (simultaneous moves) or env() (turns).")
    try:
        return maker(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a missing ROM, a bad keyword: said in one paragraph
        if is_atari_game(env_id) and "rom" in str(exc).lower():
            raise FleetError(f"--env-id {env_id!r}: PettingZoo did not find the game's ROM ({exc}). fleetrl points it at the ROMs "
                             f"ale-py ships, in {ale_rom_folder()}; install ale-py 0.9 or newer (`pip install 'fleetrl[atari]'`), "
                             f"which has them.") from None
        raise FleetError(f"--env-id {env_id!r}: making the PettingZoo env failed: {type(exc).__name__}: {exc}") from None


def _converted_aec(module: Any, env_id: str):
    def make(**kwargs: Any):
        from pettingzoo.utils.conversions import aec_to_parallel

        aec = module.env(**kwargs)
        try:
            return aec_to_parallel(aec)
        except Exception as exc:  # noqa: BLE001 - PettingZoo refuses games whose agents take turns
            aec.close()
            raise FleetError(
                f"--env-id {env_id!r} is an AEC env (agents act in turn), and PettingZoo's aec_to_parallel wrapper cannot make "
                f"it a parallel one ({exc}). fleetrl's rows step every agent at once; it converts AEC envs whose metadata says "
                f"is_parallelizable. For a turn-based game, write a parallel_env() in which the agents not on turn pass."
            ) from None
    return make


def _shared_space(spaces: Sequence[gym.Space], agents: Sequence[str], env_id: str, what: str) -> tuple[gym.Space, bool]:
    """The one space every agent's row is given, and whether rows are padded to it: identical spaces as they are;
    vector observations of different lengths padded with zeros to the longest; anything else refused."""
    first = spaces[0]
    if all(s == first for s in spaces):
        return first, False
    boxes = all(isinstance(s, gym.spaces.Box) and len(s.shape) == 1 for s in spaces)
    if what == "observation" and boxes:
        width = max(s.shape[0] for s in spaces)
        dtype = np.result_type(*[s.dtype for s in spaces])
        low = np.full(width, -np.inf if dtype.kind == "f" else np.iinfo(dtype).min, dtype)
        high = np.full(width, np.inf if dtype.kind == "f" else np.iinfo(dtype).max, dtype)
        return gym.spaces.Box(low, high, (width,), dtype), True
    listed = "; ".join(f"{a}: {s}" for a, s in zip(agents, spaces))
    raise FleetError(
        f"--env-id {env_id!r}: its agents have different {what} spaces ({listed}), and one shared network cannot take them. "
        f"fleetrl pads vector observations of different lengths; {what} spaces that differ otherwise need a wrapper in your "
        f"game that gives every agent the same space (e.g. one action set, actions invalid for an agent ignored)."
    )


class GameEnv(gym.Env):
    """One PettingZoo parallel game as a gymnasium env of ``agent_rows`` rows (see the module's docstring).

    ``atari``: CleanRL's frames of ``ppo_pettingzoo_ma_atari.py``; ``image``: 84x84 frames of another image game
    (fleetrl/envs/multiagent_image.py). ``kwargs`` go to the game's ``parallel_env``."""

    def __init__(self, env_id: str, atari: bool = False, image: bool = False, frame_stack: int = 4, **kwargs: Any):
        self.env_id = env_id
        self.game = make_parallel_env(env_id, **kwargs)
        self.metadata = {**getattr(self.game, "metadata", {}), "render_fps": getattr(self.game, "metadata", {}).get("render_fps", 30)}
        self.render_mode = kwargs.get("render_mode")
        if atari or image:
            from fleetrl.envs.multiagent_image import ImagePreprocessing

            self.game = ImagePreprocessing(self.game, frame_stack, atari=atari)
        self.agents = list(self.game.possible_agents)
        self.agent_rows = len(self.agents)
        obs_spaces = [self.game.observation_space(a) for a in self.agents]
        act_spaces = [self.game.action_space(a) for a in self.agents]
        obs_space, self._padded = _shared_space(obs_spaces, self.agents, env_id, "observation")
        act_space, _ = _shared_space(act_spaces, self.agents, env_id, "action")
        if not isinstance(obs_space, gym.spaces.Box):
            raise FleetError(f"--env-id {env_id!r}: its observation space is {obs_space}; fleetrl's rows take Box observations "
                             f"(vectors or images).")
        self.row_observation_space, self.row_action_space = obs_space, act_space
        a = self.agent_rows
        self.observation_space = gym.spaces.Box(np.broadcast_to(obs_space.low, (a, *obs_space.shape)),
                                                np.broadcast_to(obs_space.high, (a, *obs_space.shape)), dtype=obs_space.dtype)
        if isinstance(act_space, gym.spaces.Discrete):
            self.action_space: gym.Space = gym.spaces.MultiDiscrete(np.full(a, act_space.n), start=np.full(a, act_space.start))
        elif isinstance(act_space, gym.spaces.Box):
            self.action_space = gym.spaces.Box(np.broadcast_to(act_space.low, (a, *act_space.shape)),
                                               np.broadcast_to(act_space.high, (a, *act_space.shape)), dtype=act_space.dtype)
        else:
            raise FleetError(f"--env-id {env_id!r}: its action space is {act_space}; fleetrl's rows take Discrete or Box actions.")
        self._zeros = np.zeros(self.observation_space.shape, self.observation_space.dtype)

    def _stack(self, observations: dict[str, Any]) -> np.ndarray:
        obs = self._zeros.copy()
        for k, agent in enumerate(self.agents):
            if agent in observations:
                row = np.asarray(observations[agent])
                if self._padded:
                    obs[k, : row.shape[0]] = row
                else:
                    obs[k] = row
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        observations, _ = self.game.reset(seed=seed, options=options)
        missing = [a for a in self.agents if a not in observations]
        if missing:
            raise FleetError(f"--env-id {self.env_id!r}: agents {missing} have no observation at reset. fleetrl gives each of the "
                             f"game's possible_agents a row, and needs every one present when a game starts.")
        return self._stack(observations), {}

    def step(self, actions: np.ndarray):
        playing = set(self.game.agents)
        observations, rewards, terminations, truncations, _ = self.game.step(
            {agent: actions[k] for k, agent in enumerate(self.agents) if agent in playing})
        a = self.agent_rows
        reward = np.zeros(a, np.float64)
        terminated = np.ones(a, bool)  # an agent that had left stays terminated until the game ends
        truncated = np.zeros(a, bool)
        for k, agent in enumerate(self.agents):
            if agent in playing:
                reward[k] = rewards.get(agent, 0.0)
                terminated[k] = bool(terminations.get(agent, agent not in observations))
                truncated[k] = bool(truncations.get(agent, False))
        if not self.game.agents:  # the game is over: an agent that ended with no flag ended by a time limit
            truncated |= ~(terminated | truncated)
        return self._stack(observations), reward, terminated, truncated, {}

    def render(self):
        try:
            return self.game.render()
        except NotImplementedError:
            raise FleetError(f"--env-id {self.env_id!r}: the game has no render(), so --capture-video has no frames to record. "
                             f"Leave --capture-video out, or give the game a render() for render_mode='rgb_array'.") from None

    def close(self) -> None:
        self.game.close()


class AgentRows:
    """A vector of games (any fleetrl backend that steps Python envs) as a vector of ``games.num_envs * agent_rows``
    rows, with fleetrl's vector interface (fleetrl/envs/vector.py). Row ``g * A + k`` is agent ``k`` of game ``g``, after
    every reset and every worker restart alike."""

    def __init__(self, games: Any, agents: Sequence[str], clip_rewards: bool = False):
        self.games, self.agent_names = games, list(agents)
        self.agent_rows = len(self.agent_names)
        self.num_games = games.num_envs
        self.num_envs = self.num_games * self.agent_rows
        obs, act = games.single_observation_space, games.single_action_space  # every agent's, stacked
        self.single_observation_space = gym.spaces.Box(obs.low[0], obs.high[0], dtype=obs.dtype)
        self.single_action_space = (gym.spaces.Discrete(int(act.nvec[0]), start=int(act.start[0]))
                                    if isinstance(act, gym.spaces.MultiDiscrete) else gym.spaces.Box(act.low[0], act.high[0], dtype=act.dtype))
        self.steps_in_background = games.steps_in_background
        self.clip_rewards = clip_rewards
        self._live = np.ones(self.num_envs, bool)  # per row: its observation is a live agent's
        self._return = np.zeros(self.num_envs, np.float64)  # per row: the agent's raw return and length so far
        self._length = np.zeros(self.num_envs, np.int64)

    def __getattr__(self, name: str) -> Any:  # backend, backend_reason, thread_plan, stepping, envs, ...: the games'
        if name == "games":
            raise AttributeError(name)
        return getattr(self.games, name)

    @property
    def async_batch(self) -> int:
        """First-ready batches in rows: the games' batches, whole games each."""
        return self.games.async_batch * self.agent_rows

    def rows(self, game_ids: np.ndarray) -> np.ndarray:
        return (np.asarray(game_ids, np.int64)[:, None] * self.agent_rows + np.arange(self.agent_rows)).reshape(-1)

    def games_of(self, env_ids: np.ndarray | Sequence[int] | None) -> np.ndarray | None:
        """The games whose rows ``env_ids`` are, all of each game's rows, in order; else a clear error."""
        if env_ids is None:
            return None
        ids = np.asarray(env_ids, np.int64).reshape(-1)
        games = ids[:: self.agent_rows] // self.agent_rows
        if len(ids) % self.agent_rows or not np.array_equal(self.rows(games), ids):
            raise FleetError(f"Rows {ids.tolist()} are not whole games: each game of {self.agent_rows} agents steps all its rows "
                             f"together, so send and receive rows game by game (rows g*{self.agent_rows} to g*{self.agent_rows}"
                             f"+{self.agent_rows - 1}).")
        return games

    def reset(self, seed: int | None = None):
        obs, info = self.games.reset(seed=seed)
        self._live[:], self._return[:], self._length[:] = True, 0.0, 0
        return obs.reshape(self.num_envs, *obs.shape[2:]), info

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions)
        return self._rows(*self.games.step(actions.reshape(self.num_games, self.agent_rows, *actions.shape[1:])),
                          np.arange(self.num_games))[:5]

    def send(self, actions: np.ndarray, env_ids: np.ndarray | Sequence[int] | None = None) -> None:
        games = self.games_of(env_ids)
        actions = np.asarray(actions)
        count = self.num_games if games is None else len(games)
        self.games.send(actions.reshape(count, self.agent_rows, *actions.shape[1:]), games)

    def recv(self, env_ids: np.ndarray | Sequence[int] | None = None):
        *result, game_ids = self.games.recv(self.games_of(env_ids))
        return self._rows(*result, game_ids)

    def split(self, count: int) -> list[np.ndarray]:
        return [self.rows(games) for games in self.games.split(count)]

    def close(self) -> None:
        self.games.close()

    def _rows(self, obs, reward, terminated, truncated, game_info, game_ids):
        a, rows = self.agent_rows, self.rows(game_ids)
        n = len(rows)
        obs = obs.reshape(n, *obs.shape[2:])
        reward, terminated, truncated = reward.reshape(n), terminated.reshape(n), truncated.reshape(n)
        live = self._live[rows]  # the rows whose agent acted on this step
        over = np.repeat(game_info["_final_obs"], a) if "_final_obs" in game_info else np.zeros(n, bool)
        ended = (terminated | truncated) & live  # agents whose own episode ends on this step
        self._return[rows] += np.where(live, reward, 0.0)
        self._length[rows] += live
        info: dict[str, Any] = {}
        if ended.any():
            final_obs = obs.copy()  # an agent that left a game that goes on: its row's observation is its last
            if over.any():
                final_obs[over] = game_info["final_obs"].reshape(n, *obs.shape[1:])[over]
            info["final_obs"], info["_final_obs"] = final_obs, ended
            info["episode"] = {"r": np.where(ended, self._return[rows], 0.0), "l": np.where(ended, self._length[rows], 0),
                               "agent": np.tile(np.arange(a), len(game_ids))}
            info["_episode"] = ended
            done_rows = rows[ended]
            self._return[done_rows], self._length[done_rows] = 0.0, 0
        now_live = ~(terminated | truncated) | over  # a game that ended has started again with every agent
        self._live[rows] = now_live
        if not now_live.all():
            info["live"] = now_live
        if self.clip_rewards:
            reward = np.clip(reward, -1.0, 1.0)
        return obs, reward, terminated & live, truncated & live, info, rows
