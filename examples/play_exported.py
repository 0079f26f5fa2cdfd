"""Play a policy that `fleetrl export` wrote, without fleetrl or torch: ONNX Runtime, numpy and gymnasium, plus what the
env itself needs (ale-py and OpenCV for Atari, PettingZoo for its games), imported only where that env is played.

    python examples/play_exported.py runs/RUN/exported/ckpt_000000004096.onnx --episodes 10 --seed 1 [--json]

It builds the env that the model's metadata names, as `fleetrl eval` builds it, seeds the episodes as eval does (the
first reset takes --seed; every later reset takes none, so the env's own generator goes on) and counts each episode's
return and length as eval does. With --json it prints the same JSON as `fleetrl eval CHECKPOINT --json`.
docs/export.md, "Playing without fleetrl".
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort

METADATA_KEY = "fleetrl"  # the key `fleetrl export` writes its JSON under (ONNX metadata_props)
METADATA_VERSION = 1  # the metadata format this player reads
TRUSTED_GAME_PACKAGES = ("pettingzoo.", "mpe2.")  # PettingZoo ids a model may name; any other module only with --env-id


class Refused(Exception):
    """Bad input: one line on stderr, exit status 2."""


# ---------------------------------------------------------------------------------------------------- the policy
class ExportedPolicy:
    """The ONNX graph and its metadata: ``act(obs, starts)`` is eval's deterministic action for a batch of rows; a
    recurrent graph's state is carried here from step to step, from zeros, and zeroed by the graph where ``starts``."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise Refused(f"{path}: no such file. Pass the .onnx file that `fleetrl export` wrote (RUN/exported/ckpt_STEP.onnx).")
        try:
            self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - not ONNX, truncated, another format: said in one line
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise Refused(f"{path}: ONNX Runtime cannot load it as a model ({reason}). Pass the .onnx file that `fleetrl export` "
                          f"wrote.") from None
        raw = self.session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
        if raw is None:
            raise Refused(f"{path} has no fleetrl metadata (metadata_props[{METADATA_KEY!r}]), so nothing says which env it plays "
                          f"or how: play a file that `fleetrl export RUN_OR_CHECKPOINT` wrote.")
        try:
            self.meta: dict[str, Any] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise Refused(f"{path}: its fleetrl metadata is not JSON ({exc}); export the checkpoint again.") from None
        if self.meta.get("format_version") != METADATA_VERSION:
            raise Refused(f"{path}: its metadata is format {self.meta.get('format_version')!r}, and this player reads format "
                          f"{METADATA_VERSION}; use the play_exported.py of the fleetrl that exported it.")
        self.obs_shape = tuple(self.meta["observation_space"]["shape"])
        self.obs_dtype = np.dtype(self.meta["inputs"][0]["dtype"])
        self.recurrent = self.meta.get("recurrent")
        self.output_names = [o["name"] for o in self.meta["outputs"]]
        space = self.meta["action_space"]
        if space["type"] not in ("Discrete", "Box"):
            raise Refused(f"{path}: its actions are {space['type']}, and this player plays Discrete and Box actions.")
        self.action_dtype = np.dtype(space["dtype"]) if space["type"] == "Box" else None
        self.state: np.ndarray | None = None

    def start(self, rows: int) -> None:
        """A fresh state for ``rows`` rows (a recurrent policy's initial state is zeros, as the metadata says)."""
        if self.recurrent:
            self.state = np.zeros((rows, *self.recurrent["state_shape"]), np.float32)

    def act(self, obs: np.ndarray, starts: np.ndarray) -> list:
        feeds = {"obs": np.asarray(obs, self.obs_dtype)}
        if self.recurrent:
            feeds.update(state=self.state, starts=np.asarray(starts, bool))
        outputs = dict(zip(self.output_names, self.session.run(None, feeds)))
        if self.recurrent:
            self.state = outputs["state_out"]
        action = outputs["action"]
        if self.action_dtype is not None:  # Box: the graph has clipped it already
            return list(action.astype(self.action_dtype))
        return [int(a) for a in action]


# ---------------------------------------------------------------------------------------------------- the envs
class EpisodeStats(gym.Wrapper):
    """fleetrl's episode statistics: the return (the sum of the rewards as floats) and the length of an episode, in
    ``info["episode"]`` as it ends; where it sits in a chain decides what it counts (Atari: agent steps, the full game)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._return, self._length = 0.0, 0

    def reset(self, **kwargs):
        self._return, self._length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._length += 1
        if terminated or truncated:
            info = {**info, "episode": {"r": self._return, "l": self._length}}
        return obs, reward, terminated, truncated, info


class CartPoleNoVel(gym.ObservationWrapper):
    """fleetrl's own ``CartPoleNoVel-v1`` (fleetrl/envs/partial.py, registered when fleetrl is imported): CartPole-v1
    observing its cart position and pole angle only."""

    VISIBLE = [0, 2]

    def __init__(self, render_mode: str | None = None):
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        super().__init__(CartPoleEnv(render_mode=render_mode))
        high = self.env.observation_space.high[self.VISIBLE]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def observation(self, obs):
        return obs[self.VISIBLE]


FLEETRL_IDS = {"CartPoleNoVel-v1": dict(entry_point=CartPoleNoVel, max_episode_steps=500, reward_threshold=475.0)}


def gym_make(name: str, steps: dict[str, Any], **kwargs: Any) -> gym.Env:
    """``gym.make``, or one line saying why not: an id gymnasium does not know, or an env of another kind than the model's."""
    if name in FLEETRL_IDS and name not in gym.registry:
        gym.register(name, **FLEETRL_IDS[name])
    try:
        return gym.make(name, **kwargs)
    except Exception as exc:  # noqa: BLE001 - unknown ids, and envs that refuse the Atari keywords, say it in their own words
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Refused(f"gymnasium cannot make {name!r} as the model's kind of env ({steps['kind']}): {reason}. Pass an --env-id of "
                      f"that kind, or install the package that registers it.") from None


def gymnasium_env(env_id: str, steps: dict[str, Any]) -> gym.Env:
    """Classic control, MuJoCo and custom ids: ``gym.make``, the statistics innermost, observations flattened as fleetrl
    flattens any that are not a 1-D Box (the metadata says whether; for another --env-id, its space says)."""
    module, _, name = env_id.rpartition(":")
    if module:  # a custom id: its module registers the env
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise Refused(f"--env-id {env_id!r}: importing the module {module!r} failed ({exc}); make it importable (PYTHONPATH).") from None
    env = EpisodeStats(gym_make(name, steps))
    flatten = steps.get("flatten_observation") if steps.get("gymnasium_id") == name else None
    if flatten is None:
        space = env.observation_space
        flatten = not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1)
    return gym.wrappers.FlattenObservation(env) if flatten else env


# Atari: fleetrl's evaluation chain (fleetrl/envs/atari.py, make_atari(training=False)), wrapper for wrapper, so that
# the frames and the counts are the same bit for bit.
class NoopReset(gym.Wrapper):
    """Each game starts after 1..noop_max no-ops, drawn from the env's own generator."""

    def __init__(self, env: gym.Env, noop_max: int):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.unwrapped.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """The action repeated ``skip`` frames, the rewards summed, the last ``pool`` frames max-pooled."""

    def __init__(self, env: gym.Env, skip: int, pool: int):
        super().__init__(env)
        self.skip, self.pool = skip, pool
        self._frames = np.zeros((pool, *env.observation_space.shape), dtype=np.uint8)

    def step(self, action):
        total_reward, terminated, truncated, info = 0.0, False, False, {}
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i >= self.skip - self.pool:
                self._frames[i - (self.skip - self.pool)] = obs
            total_reward += float(reward)
            if terminated or truncated:
                break
        if i < self.skip - 1:  # the episode ended early: the pool was not filled, the last frame is the observation
            return obs, total_reward, terminated, truncated, info
        return self._frames.max(axis=0), total_reward, terminated, truncated, info


class FireReset(gym.Wrapper):
    """FIRE, then action 2, after each reset, for games that wait for FIRE to start."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class FireAfterLifeLoss(gym.Wrapper):
    """After a lost life, the hidden steps training's reset takes then (their rewards count)."""

    def __init__(self, env: gym.Env, hidden_steps: list[int]):
        super().__init__(env)
        self.hidden_steps, self._lives = hidden_steps, 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._lives = self.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            for hidden in self.hidden_steps:
                if terminated or truncated:
                    break
                obs, hidden_reward, terminated, truncated, info = self.env.step(hidden)
                reward += hidden_reward
        self._lives = self.unwrapped.ale.lives()
        return obs, reward, terminated, truncated, info


class Resize(gym.ObservationWrapper):
    """The grayscale screen scaled to size x size with OpenCV's area interpolation."""

    def __init__(self, env: gym.Env, size: int, cv2):
        super().__init__(env)
        self.size, self.cv2 = size, cv2
        self.observation_space = gym.spaces.Box(0, 255, (size, size), dtype=np.uint8)

    def observation(self, obs):
        return self.cv2.resize(obs, (self.size, self.size), interpolation=self.cv2.INTER_AREA)


def default_sticky_actions(env_id: str) -> float:
    """ALE's: 0.25 for the `ALE/...-v5` ids, 0 for the `NoFrameskip-v4` ones (fleetrl/envs/atari.py)."""
    return 0.25 if env_id.startswith("ALE/") and env_id.endswith("-v5") else 0.0


def sticky_actions(env_id: str, steps: dict[str, Any]) -> float:
    """The sticky-action probability eval plays with: the one training set (``sticky_actions_flag``), else the game's own
    default (fleetrl/envs/atari.py), which is the model's value on the model's own game."""
    if steps.get("sticky_actions_flag") is not None:
        return float(steps["sticky_actions_flag"])
    return default_sticky_actions(env_id) if env_id != steps["gymnasium_id"] else steps["repeat_action_probability"]


def atari_env(env_id: str, steps: dict[str, Any]) -> gym.Env:
    """The chain in the metadata's order, with its values."""
    try:
        import ale_py
        import cv2
    except ImportError as exc:
        raise Refused(f"Atari needs ale-py and OpenCV, and {exc.name} is missing: pip install ale-py opencv-python-headless.") from None
    if steps["resize"]["interpolation"] != "cv2.INTER_AREA":
        raise Refused(f"the model's frames are resized with {steps['resize']['interpolation']}, and this player knows cv2.INTER_AREA.")
    gym.register_envs(ale_py)
    env = gym_make(env_id, steps, obs_type=steps["obs_type"], frameskip=1, repeat_action_probability=sticky_actions(env_id, steps),
                   full_action_space=steps["full_action_space"], max_num_frames_per_episode=steps["max_num_frames_per_episode"])
    fire = "FIRE" in env.unwrapped.get_action_meanings()  # the game's, as fleetrl decides it (another --env-id may differ)
    chain = {
        "noop_reset": lambda e: NoopReset(e, steps["noop_max"]),
        "max_and_skip": lambda e: MaxAndSkip(e, steps["frame_skip"], steps["max_pool_last"]),
        "episode_statistics": EpisodeStats,
        "fire_reset": lambda e: FireReset(e) if fire else e,
        "fire_after_life_loss": lambda e: FireAfterLifeLoss(e, steps["life_loss_steps"]) if fire else e,
        "resize": lambda e: Resize(e, steps["resize"]["size"], cv2),
        "frame_stack": lambda e: gym.wrappers.FrameStackObservation(e, steps["frame_stack"]),
    }
    unknown = [name for name in steps["order"] if name not in chain]
    if unknown:
        raise Refused(f"the model's Atari preprocessing has steps this player does not know ({', '.join(unknown)}); use the "
                      f"play_exported.py of the fleetrl that exported it.")
    for name in steps["order"]:
        env = chain[name](env)
    return env


class GameRows:
    """A PettingZoo parallel game as fleetrl gives it to eval (fleetrl/envs/multiagent.py: GameEnv in a vector, and
    AgentRows): one row per agent in possible_agents' order, zeros for an agent that has left, vector observations
    padded with zeros to the widest; each agent's own episode counted from the raw rewards; the game reset (without a
    seed) once every agent's episode has ended."""

    def __init__(self, module_name: str, dtype: np.dtype):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise Refused(f"--env-id {module_name!r}: Python cannot import it ({exc}); pip install pettingzoo (and mpe2 for the MPE "
                          f"games).") from None
        if hasattr(module, "parallel_env"):
            self.game = module.parallel_env()
        elif hasattr(module, "env"):  # an AEC game whose agents move at once, converted as fleetrl converts it
            from pettingzoo.utils.conversions import aec_to_parallel

            self.game = aec_to_parallel(module.env())
        else:
            raise Refused(f"--env-id {module_name!r} has neither parallel_env() nor env(): it is not a PettingZoo game.")
        self.agents = list(self.game.possible_agents)
        shapes = {tuple(self.game.observation_space(agent).shape) for agent in self.agents}
        # a row as fleetrl gives it: the agents' shared shape, or vectors padded to the widest
        if len(shapes) == 1:
            self.row_shape = shapes.pop()
        elif all(len(shape) == 1 for shape in shapes):
            self.row_shape = (max(shape[0] for shape in shapes),)
        else:
            raise Refused(f"--env-id {module_name!r}: its agents observe differently shaped arrays ({sorted(shapes)}), which fleetrl "
                          f"does not train on.")
        self.row_action_space = self.game.action_space(self.agents[0])  # fleetrl trains games whose agents share it
        a = len(self.agents)
        self._zeros = np.zeros((a, *self.row_shape), dtype)
        self._live = np.ones(a, bool)
        self._return = np.zeros(a, np.float64)
        self._length = np.zeros(a, np.int64)

    def _stack(self, observations: dict[str, Any]) -> np.ndarray:
        obs = self._zeros.copy()
        for k, agent in enumerate(self.agents):
            if agent in observations:
                row = np.asarray(observations[agent])
                obs[k][tuple(slice(0, n) for n in row.shape)] = row  # a narrower row padded with zeros
        return obs

    def reset(self, seed: int | None = None) -> np.ndarray:
        observations, _ = self.game.reset(seed=seed)
        self._live[:], self._return[:], self._length[:] = True, 0.0, 0
        return self._stack(observations)

    def step(self, actions: list) -> tuple[np.ndarray, list[tuple[int, float, int]], np.ndarray]:
        """The next observations, the (agent, return, length) of each agent episode that ended, and the rows that
        begin an episode on the next step."""
        playing = set(self.game.agents)
        observations, rewards, terminations, truncations, _ = self.game.step(
            {agent: actions[k] for k, agent in enumerate(self.agents) if agent in playing})
        a = len(self.agents)
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
        over = bool(np.all(terminated | truncated))
        ended = (terminated | truncated) & self._live  # agents whose own episode ends on this step
        self._return += np.where(self._live, reward, 0.0)
        self._length += self._live
        finished = [(k, float(self._return[k]), int(self._length[k])) for k in np.flatnonzero(ended)]
        self._return[ended], self._length[ended] = 0.0, 0
        self._live = ~(terminated | truncated) | over
        if over:
            observations, _ = self.game.reset()
        return self._stack(observations), finished, ended

    def close(self) -> None:
        self.game.close()


def trusted_env_id(meta: dict[str, Any], given: str | None) -> str:
    """The env id to play: ``--env-id``, else the metadata's, unless that names a module to import (a custom id, a user's
    PettingZoo game): importing runs its code, so as in fleetrl the user must name it."""
    if given is not None:
        return given
    env_id = meta["env_id"]
    steps = meta["preprocessing"]
    custom = steps.get("module") if steps["kind"] == "gymnasium" else None
    if steps["kind"] == "pettingzoo" and not env_id.startswith(TRUSTED_GAME_PACKAGES):
        custom = env_id
    if custom:
        raise Refused(f"the model plays {env_id!r}, which asks to import the Python module {custom!r}, and importing runs its code: "
                      f"if you trust it, name it yourself with --env-id {env_id}.")
    return env_id


# ---------------------------------------------------------------------------------------------------- the episodes
def play_single(env: gym.Env, policy: ExportedPolicy, episodes: int, seed: int) -> tuple[list[float], list[int]]:
    """eval's loop on one env: the first reset seeded, each later one not (same-step autoreset)."""
    obs, _ = env.reset(seed=seed)
    policy.start(1)
    starts = np.ones(1, bool)
    returns, lengths = [], []
    while len(returns) < episodes:
        (action,) = policy.act(np.asarray(obs, policy.obs_dtype)[None], starts)
        obs, _, terminated, truncated, info = env.step(action)
        starts = np.array([terminated or truncated])
        if terminated or truncated:
            if "episode" in info:
                returns.append(info["episode"]["r"])
                lengths.append(info["episode"]["l"])
            obs, _ = env.reset()
    return returns, lengths


def play_game(game: GameRows, policy: ExportedPolicy, episodes: int, seed: int) -> tuple[list[float], list[int], list[list[float]]]:
    """eval's loop on one PettingZoo game with ``--opponent self``: the policy plays every row; ``episodes`` games."""
    obs = game.reset(seed=seed)
    policy.start(len(game.agents))
    starts = np.ones(len(game.agents), bool)
    returns, lengths, per_agent = [], [], [[] for _ in game.agents]
    while len(per_agent[0]) < episodes:
        obs, finished, starts = game.step(policy.act(obs, starts))
        for agent, episode_return, length in finished:
            per_agent[agent].append(episode_return)
            returns.append(episode_return)
            lengths.append(length)
    return returns, lengths, per_agent


def check_fits(shape: tuple, action_space: gym.Space, policy: ExportedPolicy, env_id: str) -> None:
    """The env's rows and actions are the model's (eval refuses a network that does not fit the env)."""
    space = policy.meta["action_space"]
    if isinstance(action_space, gym.spaces.Discrete):
        fits = space["type"] == "Discrete" and (int(action_space.n), int(action_space.start)) == (space["n"], space["start"])
    else:
        fits = isinstance(action_space, gym.spaces.Box) and space["type"] == "Box" and list(action_space.shape) == space["shape"]
    if tuple(shape) != policy.obs_shape or not fits:
        raise Refused(f"{env_id} observes rows of shape {tuple(shape)} and takes actions {action_space}, and the model takes "
                      f"{policy.obs_shape} and gives {space['type']} actions ({space.get('n', space.get('shape'))}): play it on "
                      f"an env like the one it was exported for ({policy.meta['env_id']}).")


def play(model: str, env_id: str | None, episodes: int, seed: int) -> dict[str, Any]:
    """Play ``episodes`` episodes (a PettingZoo game: games) and return `fleetrl eval --json`'s result."""
    policy = ExportedPolicy(model)
    meta, steps = policy.meta, policy.meta["preprocessing"]
    family, kind = meta["family"], steps["kind"]
    named = env_id or meta["env_id"]  # refusals first: they import nothing
    if family == "multiagent-image" or (kind == "pettingzoo" and steps.get("image")):
        raise Refused(f"{named} is a PettingZoo image game, whose frames (and agent indicator channels) are fleetrl's own "
                      f"preprocessing (fleetrl/envs/multiagent_image.py, docs/export.md), which this player does not reproduce; "
                      f"play it with `fleetrl eval`.")
    if kind == "envpool":
        raise Refused(f"{named} is a Procgen env, whose frames come from EnvPool's C++ envs, which this player does not build; "
                      f"play it with `fleetrl eval`.")
    env_id = trusted_env_id(meta, env_id)
    result: dict[str, Any] = {"checkpoint": meta["checkpoint"], "env_id": env_id, "global_step": meta["global_step"]}
    if kind == "pettingzoo":
        game = GameRows(env_id, policy.obs_dtype)
        try:
            check_fits(game.row_shape, game.row_action_space, policy, env_id)
            returns, lengths, per_agent = play_game(game, policy, episodes, seed)
        finally:
            game.close()
        played = len(per_agent[0])
    elif kind in ("gymnasium", "atari"):
        name = env_id.rpartition(":")[2] if kind == "atari" else env_id
        env = atari_env(name, steps) if kind == "atari" else gymnasium_env(env_id, steps)
        try:
            check_fits(env.observation_space.shape, env.action_space, policy, env_id)
            returns, lengths = play_single(env, policy, episodes, seed)
        finally:
            env.close()
        played = len(returns)
    else:
        raise Refused(f"the model's env family {family!r} (preprocessing {kind!r}) is one this player cannot build; play it with "
                      f"`fleetrl eval`.")
    result.update(episodes=played, mean_return=float(np.mean(returns)), std_return=float(np.std(returns)),
                  mean_length=float(np.mean(lengths)), returns=returns)
    if kind == "pettingzoo":
        result["agent_returns"] = {name: per_agent[k] for k, name in enumerate(game.agents)}
        result["opponent"] = "self"
    return result


def summary(result: dict[str, Any]) -> str:
    """eval's lines."""
    line = (f"{result['env_id']} @ step {result['global_step']:,}: return {result['mean_return']:.2f} ± {result['std_return']:.2f} "
            f"over {result['episodes']} episodes (mean length {result['mean_length']:.1f})")
    if "agent_returns" in result:
        per_agent = ", ".join(f"{name} {np.mean(r):.2f}" for name, r in result["agent_returns"].items())
        line += f"\n  the trained policy plays every agent; per agent over {result['episodes']} games: {per_agent}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="play_exported.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .onnx file `fleetrl export` wrote")
    parser.add_argument("--env-id", help="the env to play on [the model's]; needed for an id that names a module to import")
    parser.add_argument("--episodes", type=int, default=10, help="how many episodes to play (a PettingZoo game: games) [10]")
    parser.add_argument("--seed", type=int, default=12345, help="the seed of the first reset, as `fleetrl eval --seed` [12345]")
    parser.add_argument("--json", action="store_true", help="print `fleetrl eval --json`'s JSON")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: play at least 1")
    try:
        result = play(args.model, args.env_id, args.episodes, args.seed)
    except Refused as refused:
        print(f"play_exported.py: {refused}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
