"""`fleetrl eval`: run a trained checkpoint for N episodes and report the mean and std of the return."""

from __future__ import annotations

import importlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from fleetrl import checkpoint, config, runtime
from fleetrl.algos import eval_code
from fleetrl.envs import episode_stats, make_vector_env
from fleetrl.envs.registry import MULTIAGENT_FAMILIES, env_family, env_id_for_checkpoint
from fleetrl.errors import FleetError


@dataclass
class EvalArgs:
    checkpoint: tyro.conf.Positional[str]
    """a checkpoint file, or a run folder (its newest checkpoint is used)"""
    episodes: int = 10
    """how many episodes to run"""
    stochastic: bool = False
    """sample actions instead of taking the deterministic one (argmax, or the Gaussian mean)"""
    seed: int = 12345
    """seed of the evaluation episodes"""
    env_backend: str = "sync"
    """vector backend for the evaluation env"""
    json: bool = False
    """print the result as JSON"""
    capture_video: bool = False
    """record every evaluation episode as MP4 next to the checkpoint's run (`videos_eval`)"""
    env_id: str | None = None
    """the env to evaluate on [the checkpoint's]; a custom id (`module:Env-v0`) saved in a checkpoint is used only when given here too, since importing the module runs its code"""
    algo_file: str | None = None
    """the algorithm's file (./my_ppo.py) or module whose network rebuilds the policy [the checkpoint's: a built-in, or the file it records if that is yours and unchanged]"""
    opponent: str = "self"
    """PettingZoo games: who plays the agents other than --agent: `self` (the trained policy plays every agent), `random` (uniform actions), or `MODULE:FUNCTION`, a scripted player called with those agents' observations, returning their actions"""
    agent: int = 0
    """PettingZoo games, with --opponent other than self: the agent (its index in the game's possible_agents) that the trained policy plays"""


RANGES = {
    "episodes": config.count("how many episodes to run"),
    "seed": config.SEED,
}
VIDEO_PREFIX = "rl-video"  # the recorder's file names: rl-video-episode-{i}.mp4
HOW = "Pass a checkpoint file (a run's checkpoints/ckpt_*.pt) or a run folder that has one."


def evaluate(args: EvalArgs) -> dict:
    config.check_ranges(args, RANGES)
    state, path = load(args.checkpoint)
    train_args = state["args"]
    env_id = env_id_for_checkpoint(train_args["env_id"], args.env_id, str(path), f"fleetrl eval {shlex.quote(args.checkpoint)}")
    runtime.seed_everything(args.seed, True)
    runtime.set_torch_threads(None)
    algo = eval_code.for_checkpoint(state, str(path), args.algo_file)  # the code it was trained with, never a built-in in its place
    # videos go to the run folder: the parent of its checkpoints/ folder (or the folder of a file kept elsewhere)
    run_dir = checkpoint.run_folder_of(path) or path.parent
    video_dir = str(run_dir / "videos_eval") if args.capture_video else None
    # one env, without the training-only wrappers (episodic life, reward clipping)
    family = env_family(env_id)
    agents = family.agents if family.name in MULTIAGENT_FAMILIES else 0  # a PettingZoo game: one game, a row per agent
    if not agents and (args.opponent != "self" or args.agent != 0):
        raise FleetError(f"--opponent and --agent choose who plays a PettingZoo game's agents, and {env_id} has one agent. Leave them out.")
    if agents and not 0 <= args.agent < agents:
        raise FleetError(f"--agent {args.agent}: {env_id} has agents 0 to {agents - 1} ({', '.join(family.agent_names)}).")
    envs = make_vector_env(env_id, max(agents, 1), args.env_backend, training=False, sticky_actions=train_args.get("sticky_actions"),
                           video_dir=video_dir, every_episode=True, frame_stack=train_args.get("frame_stack"), family=family)
    returns, lengths = [], []
    per_agent: list[list[float]] = [[] for _ in range(agents)]
    try:
        try:
            policy = algo.policy_from_checkpoint(state, envs, deterministic=not args.stochastic)
        except (KeyError, RuntimeError, ValueError, TypeError) as exc:  # missing or misshapen tensors
            fix = ("The checkpoint is damaged or was edited: evaluate another checkpoint of its run." if env_id == train_args["env_id"]
                   else f"It was trained on {train_args['env_id']!r}: evaluate it on an env with the same observations and actions.")
            raise FleetError(f"The network in {path} does not fit {env_id} ({str(exc).splitlines()[0]}). {fix}") from None
        opponent = make_opponent(args.opponent, envs, args.seed) if agents else None
        others = np.arange(envs.num_envs) != args.agent  # the rows --opponent plays
        obs, _ = envs.reset(seed=args.seed)
        starts = np.ones(envs.num_envs, bool)  # a recurrent policy starts each episode from a fresh state
        while (len(per_agent[0]) if agents else len(returns)) < args.episodes:  # a game: every agent's episode ends once
            actions = policy(obs, starts)
            if opponent is not None:
                actions[others] = opponent(obs[others])
            obs, _, terminated, truncated, info = envs.step(actions)
            starts = terminated | truncated
            for episode_return, length, *agent in episode_stats(info, *(("agent",) if agents else ())):
                if agent:
                    per_agent[agent[0]].append(episode_return)
                if not agent or opponent is None or agent[0] == args.agent:  # the trained policy's episodes
                    returns.append(episode_return)
                    lengths.append(length)
    finally:
        envs.close()
    played = len(per_agent[0]) if agents else len(returns)  # episodes, or a PettingZoo game's games
    if video_dir:  # the autoreset after the last episode began one more video, of its reset frame only: no episode
        for extra in Path(video_dir).glob(f"{VIDEO_PREFIX}-episode-*.mp4"):
            if int(extra.stem.rsplit("-", 1)[1]) >= played:
                extra.unlink()
    result = {
        "checkpoint": str(path),
        "env_id": env_id,
        "global_step": state["global_step"],
        "episodes": played,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "mean_length": float(np.mean(lengths)),
        "returns": returns,
    }
    if agents:  # each agent's return in every game, and who played the others
        result["agent_returns"] = {name: per_agent[k] for k, name in enumerate(family.agent_names)}
        result["opponent"] = args.opponent
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['env_id']} @ step {result['global_step']:,}: return {result['mean_return']:.2f} ± {result['std_return']:.2f} "
              f"over {result['episodes']} episodes (mean length {result['mean_length']:.1f})")
        if agents:
            who = "the trained policy plays every agent" if args.opponent == "self" else \
                f"the trained policy plays {family.agent_names[args.agent]}, --opponent {args.opponent} the others"
            print(f"  {who}; per agent over {len(per_agent[0])} games: " +
                  ", ".join(f"{name} {np.mean(per_agent[k]):.2f}" for k, name in enumerate(family.agent_names)))
    return result


def make_opponent(spec: str, envs, seed: int):
    """``--opponent``: None for self-play, else ``obs -> actions`` for the rows the trained policy does not play."""
    if spec == "self":
        return None
    space = envs.single_action_space
    if spec == "random":
        rng = np.random.default_rng(seed)
        if hasattr(space, "n"):
            return lambda obs: rng.integers(int(space.n), size=len(obs)) + int(space.start)
        return lambda obs: rng.uniform(space.low, space.high, (len(obs), *space.shape)).astype(space.dtype)
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise FleetError(f"--opponent {spec!r}: give self, random, or MODULE:FUNCTION (a function on the import path that takes the "
                         f"other agents' observations, one row each, and returns their actions).")
    try:
        return getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise FleetError(f"--opponent {spec!r}: cannot load {function} from the module {module_name} ({exc}). Put the module on "
                         f"the import path (PYTHONPATH) and name a function that takes observations and returns actions.") from None


def load(source: str) -> tuple[dict, Path]:
    """The checkpoint to evaluate and its file: ``source`` is a file, or a run folder (its newest checkpoint
    that verifies). Anything else (a text file, an empty file, another format) is refused, saying what it is."""
    if Path(source).is_dir():
        state, path = checkpoint.load_checkpoint_and_path(source)
    else:
        path = checkpoint.resolve_checkpoint(source)
        state = checkpoint.load_checkpoint(path)
    train_args = state["args"]
    if not isinstance(train_args, dict) or not isinstance(train_args.get("env_id"), str) or not isinstance(state.get("algo", "ppo"), str):
        raise FleetError(f"{path} is not a fleetrl checkpoint (its saved arguments name no env id, or no algorithm). {HOW}")
    try:
        state["global_step"] = int(state["global_step"])
    except (KeyError, TypeError, ValueError, RuntimeError):
        raise FleetError(f"{path} is not a fleetrl checkpoint (it has no global step). {HOW}") from None
    return state, path
