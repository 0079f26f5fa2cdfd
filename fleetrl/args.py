"""The flags every algorithm shares: CleanRL's experiment flags, then fleetrl's engine flags.

An algorithm's ``Args`` subclasses :class:`CommonArgs` (or :class:`OffPolicyArgs` for DQN, SAC and TD3)
and adds its own; it may redeclare a field to change its default or help (``exp_name: str = "dqn"``).
A field left ``None`` is filled from the algorithm's ``FAMILY_DEFAULTS`` for the env's family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetrl import config
from fleetrl.accel import check_memory_format, check_precision
from fleetrl.distributed import split_evenly
from fleetrl.envs.stepping import check_flags as check_stepping_flags
from fleetrl.envs.vector import check_async_batch
from fleetrl.sampling.sampler import check_actor_device, local_async_batch
from fleetrl.errors import FleetError

STEPS_PER_ITERATION = 100  # off-policy: vector steps between logging calls (CleanRL logs every 100 steps)
DIST_TIMEOUT = config.Range("seconds a collective waits for a missing rank", low=0, low_open=True, high=1e9)


@dataclass
class CommonArgs:
    exp_name: str = "fleetrl"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "fleetrl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""
    env_id: str = "CartPole-v1"
    """the id of the environment (`module.path:EnvId-v0` imports your module first)"""
    total_timesteps: int | None = None
    """total timesteps of the experiments [set per env family]"""
    num_envs: int | None = None
    """the number of parallel game environments, over all processes [set per env family]"""

    # fleetrl: engine settings
    env_backend: str = "auto"
    """vector backend: auto (chosen and explained at start), sync, async (worker processes), ale, envpool, gym-sync"""
    sticky_actions: float | None = None
    """Atari sticky-action probability [0 for NoFrameskip-v4 ids, 0.25 for ALE/...-v5]"""
    run_dir: str | None = None
    """where logs and checkpoints go [runs/{env_id}__{exp_name}__{seed}__{timestamp}]"""
    checkpoint_every: int = 50
    """write a checkpoint every this many iterations (and always at the end)"""
    stop_at_return: float | None = None
    """end the run early, checkpointed, once the mean return of the last --stop-window episodes reaches this (SB3's StopTrainingOnRewardThreshold)"""
    stop_window: int = 100
    """the episodes --stop-at-return averages"""
    keep_checkpoints: int = 3
    """how many of the newest checkpoints to keep"""
    resume: str | None = None
    """a checkpoint file or run folder to continue from, in its run folder unless --run-dir says (a custom env id it saved needs --env-id); `auto` resumes the newest checkpoint in --run-dir if there is one"""
    torch_threads: int | None = None
    """torch CPU threads for this process [cores / processes on this machine]"""
    progress: bool = True
    """show the progress display (a live bar on a terminal, plain lines otherwise)"""
    dist_backend: str | None = None
    """torch.distributed backend under torchrun [nccl on CUDA, gloo on CPU]"""
    dist_timeout: float = 300.0
    """seconds a collective waits for a missing rank before the job fails (keep it above a checkpoint write)"""
    max_env_restarts: int = 10
    """env worker processes (async backend) that may crash or hang and be restarted in one run before it stops"""
    env_timeout: float = 60.0
    """seconds an env worker may take to answer before it counts as hung and is restarted (0: wait forever)"""
    env_workers: int | None = None
    """env worker processes (async backend) or C++ threads (ale, envpool) [planned: one per core; envs that wait get more, docs/backends.md]"""
    env_threads: int | None = None
    """stepping threads in each async env worker: envs that wait overlap their waits; 1: processes only, for envs not safe to step from several threads [planned from a measured step]"""


# what each common numeric flag accepts (after the family defaults are filled), checked before anything starts
COMMON_RANGES = {
    "seed": config.SEED,
    "total_timesteps": config.count("the environment steps to train for"),
    "num_envs": config.count("parallel environments, over all processes"),
    "sticky_actions": config.fraction("the Atari sticky-action probability", optional=True),
    "checkpoint_every": config.count("iterations between checkpoints"),
    "stop_at_return": config.Range("the mean return that ends the run early", optional=True),
    "stop_window": config.count("episodes averaged for --stop-at-return"),
    "keep_checkpoints": config.count("newest checkpoints kept"),
    "torch_threads": config.count("torch CPU threads", high=1024, optional=True, hint="Leave it out to use the thread plan."),
    "dist_timeout": DIST_TIMEOUT,
    "max_env_restarts": config.count("env worker restarts allowed in one run", low=0),
    "env_timeout": config.Range("seconds an env worker may take to answer; 0: wait forever", low=0, high=1e9),
    "env_workers": config.count("env worker processes (or C++ env threads)", high=4096, optional=True,
                                hint="Leave it out to size them from a measured step."),
    "env_threads": config.count("stepping threads in each env worker", high=4096, optional=True,
                                hint="Leave it out to size them from a measured step."),
}


def validate_common(args: Any, world_size: int, ranges: dict[str, config.Range]) -> None:
    """Refuse flags out of range, an empty --run-dir, and envs that do not split evenly over the ranks."""
    config.check_ranges(args, ranges)
    if args.run_dir is not None and not args.run_dir.strip():
        raise FleetError("--run-dir is empty: give the folder for the logs and checkpoints, or leave it out for "
                         "runs/{env_id}__{exp_name}__{seed}__{timestamp}.")
    local_num_envs = split_evenly(args.num_envs, world_size, "The number of environments", "--num-envs")
    check_stepping_flags(local_num_envs, args.env_backend, args.env_workers, args.env_threads)


@dataclass
class OnPolicyArgs(CommonArgs):
    """PPO and its recurrent variant: the sampler's and the network's speed settings (docs/sampling.md, docs/speed.md)."""

    async_batch: int | None = None
    """return the first K ready envs each step (dynamic scheduling: a slow env does not idle the rest); = --num-envs: the serial loop [unset: two env groups take turns where the backend steps in the background, docs/sampling.md]"""
    policy_lag: int = 0
    """0: every rollout uses the newest weights; 1: collect rollout k+1 with the weights of k while the learner trains on k"""
    actor_device: str = "auto"
    """where acting runs: cpu, the learner's device (`learner`), or auto (measured at start, the faster one)"""
    precision: str = "auto"
    """network precision: fp32, bf16 (autocast around the network only), or auto (bf16 where native and measured faster)"""
    memory_format: str = "auto"
    """CNNs: contiguous, channels-last, or auto (measured at start; channels-last only where clearly faster)"""
    compile: bool = False
    """wrap the learner step (loss, forward and backward) in torch.compile; falls back to eager with a warning if it fails"""
    frame_stack: int | None = None
    """Atari: frames stacked in an observation [4; ppo_lstm 1, its LSTM remembers]"""


ONPOLICY_RANGES = {
    **COMMON_RANGES,
    "async_batch": config.count("envs returned per step", optional=True, hint="Leave it out for the default sampling."),
    "policy_lag": config.count("0: every rollout uses the newest weights; 1: one update behind", low=0, high=1),
    "frame_stack": config.count("Atari frames stacked in an observation", high=16, optional=True),
}


def validate_onpolicy(args: Any, world_size: int, ranges: dict[str, config.Range]) -> None:
    """The common checks, then the sampler's and the precision's (each flag checked in its one place)."""
    validate_common(args, world_size, ranges)
    local_num_envs = args.num_envs // world_size
    check_async_batch(local_num_envs, local_async_batch(args.async_batch, args.num_envs, local_num_envs), args.env_backend,
                      args.env_workers)
    check_actor_device(args.actor_device)
    check_precision(args.precision)
    check_memory_format(args.memory_format)


@dataclass
class OffPolicyArgs(CommonArgs):
    """DQN, SAC and TD3: a replay buffer, a target network, learning after a random warm-up."""

    buffer_size: int | None = None
    """the replay memory buffer size (over all processes)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float | None = None
    """the target network update rate"""
    batch_size: int | None = None
    """the batch size of sample from the replay memory"""
    learning_starts: int | None = None
    """timestep to start learning"""
    save_buffer: bool = False
    """checkpoints include the replay buffer (an exact resume, but a checkpoint as large as the buffer); without it a resumed run refills the buffer for --learning-starts steps before it learns again"""
    checkpoint_every: int = 100
    """write a checkpoint every this many iterations (an iteration: 100 steps of every env) and always at the end"""


OFFPOLICY_RANGES = {
    **COMMON_RANGES,
    "buffer_size": config.count("transitions the replay buffer holds"),
    "gamma": config.fraction("the discount factor"),
    "tau": config.fraction("the target network update rate (1: copy)"),
    "batch_size": config.count("transitions sampled for each update"),
    "learning_starts": config.count("steps of random actions before learning", low=0),
}


def validate_offpolicy(args: Any, world_size: int, ranges: dict[str, config.Range]) -> None:
    """The common checks, then the replay buffer's: each rank samples its share of a batch from its share of the
    buffer, which must hold it; learning must start within the run."""
    validate_common(args, world_size, ranges)
    local_batch = split_evenly(args.batch_size, world_size, "The batch sampled each update", "--batch-size")
    local_buffer = args.buffer_size // world_size
    if local_buffer < local_batch:
        shared = (f" (each of the {world_size} processes holds {local_buffer} transitions and samples {local_batch} of an update's "
                  f"batch)" if world_size > 1 else "")
        raise FleetError(f"--buffer-size {args.buffer_size} is smaller than --batch-size {args.batch_size}{shared}: a batch cannot "
                         f"be sampled from a buffer that holds fewer transitions. Raise --buffer-size to at least {args.batch_size} "
                         f"or lower --batch-size.")
    if args.learning_starts >= args.total_timesteps:
        raise FleetError(f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}: the run would "
                         f"end before it learns anything. Lower --learning-starts or raise --total-timesteps.")
    per_iteration = args.num_envs * STEPS_PER_ITERATION
    if args.total_timesteps < per_iteration:
        raise FleetError(f"--total-timesteps {args.total_timesteps} is less than one iteration ({STEPS_PER_ITERATION} steps of each of --num-envs "
                         f"{args.num_envs} envs = {per_iteration} steps). Raise --total-timesteps to at least {per_iteration}.")
