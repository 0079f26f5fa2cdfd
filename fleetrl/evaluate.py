"""`fleetrl eval`: run a trained checkpoint for N episodes and report the mean and std of the return."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass

import numpy as np
import tyro

from fleetrl import checkpoint, runtime
from fleetrl.envs import episode_stats, make_vector_env
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


def evaluate(args: EvalArgs) -> dict:
    if args.episodes <= 0:
        raise FleetError(f"--episodes must be positive, got {args.episodes}.")
    path = checkpoint.resolve_checkpoint(args.checkpoint)  # a run folder means its newest checkpoint
    state = checkpoint.load_checkpoint(path)
    train_args = state["args"]
    runtime.seed_everything(args.seed, True)
    runtime.set_torch_threads(None)
    algo = importlib.import_module(f"fleetrl.algos.{state.get('algo', 'ppo')}")
    # one env, without the training-only wrappers (episodic life, reward clipping)
    video_dir = str(path.parent.parent / "videos_eval") if args.capture_video else None
    envs = make_vector_env(train_args["env_id"], 1, args.env_backend, training=False, sticky_actions=train_args.get("sticky_actions"),
                           video_dir=video_dir, every_episode=True)
    policy = algo.policy_from_checkpoint(state, envs, deterministic=not args.stochastic)
    returns, lengths = [], []
    obs, _ = envs.reset(seed=args.seed)
    try:
        while len(returns) < args.episodes:
            obs, _, _, _, info = envs.step(policy(obs))
            for episode_return, length in episode_stats(info):
                returns.append(episode_return)
                lengths.append(length)
    finally:
        envs.close()
    result = {
        "checkpoint": str(path),
        "env_id": train_args["env_id"],
        "global_step": int(state["global_step"]),
        "episodes": len(returns),
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "mean_length": float(np.mean(lengths)),
        "returns": returns,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['env_id']} @ step {result['global_step']:,}: return {result['mean_return']:.2f} ± {result['std_return']:.2f} "
              f"over {result['episodes']} episodes (mean length {result['mean_length']:.1f})")
    return result


