"""How a training run starts: the five steps of ``Run.start`` (docs/engine.md, "How a run starts"), each trusting the
one before, and which algorithm code this process trains (its checkpoints record it, for ``fleetrl eval``).

1. :func:`join_job`: the torchrun job, if this process is in one;
2. :func:`resume_checkpoint`: the checkpoint of ``--resume``, its saved flags under the command line's;
3. :func:`settle_flags`: the env family, its defaults, whole games, the algorithm's refusals: the flags are final;
4. :func:`plan_resources`: this rank's envs, the run folder, the thread plan, the device;
5. ``Run._open`` (fleetrl/run.py): the run itself, seeded, catching stop signals.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from fleetrl import checkpoint, config, runtime
from fleetrl.args import DIST_TIMEOUT
from fleetrl.distributed import Dist, init_distributed, launched_by_torchrun, split_evenly
from fleetrl.envs import EnvFamily, env_family
from fleetrl.envs.registry import env_id_for_checkpoint
from fleetrl.errors import FleetError

IMAGE_FAMILIES = ("atari", "procgen", "multiagent-image")  # the families trained with a CNN; the others with small MLPs (for the thread plan)


# ---------------------------------------------------------------- the code this process trains
@dataclass(frozen=True)
class TrainingCode:
    """The algorithm's code a command trains: ``record`` ({kind, module, path, sha256}) goes into every checkpoint, so
    ``fleetrl eval`` rebuilds the policy with that code; ``command`` trains it again, for messages."""

    record: dict[str, str]
    command: str


_TRAINING: ContextVar[TrainingCode | None] = ContextVar("fleetrl_training_code", default=None)


@contextlib.contextmanager
def training(record: dict[str, str], command: str) -> Iterator[None]:
    """Within the block, runs started here train this code (``fleetrl train FILE``, ``python FILE``: the command that
    imported it says so); after it, a ``train()`` called by a script or a test trains nobody's file."""
    token = _TRAINING.set(TrainingCode(dict(record), command))
    try:
        yield
    finally:
        _TRAINING.reset(token)


def training_code() -> TrainingCode | None:
    return _TRAINING.get()


def command_for(algo: str) -> str:
    """The command that trains ``algo`` again, for messages ("... --resume auto")."""
    code = _TRAINING.get()
    return code.command if code is not None else f"fleetrl train {algo}"


# ---------------------------------------------------------------- the steps
def join_job(args: Any) -> Dist:
    """Step 1: this process's place in the torchrun job (world size 1 outside one)."""
    if launched_by_torchrun():  # joining the job uses it, before validate names every bad flag
        config.check_ranges(args, {"dist_timeout": DIST_TIMEOUT})
    return init_distributed(args.cuda, args.dist_backend, args.dist_timeout)


def resume_checkpoint(args: Any, explicit: set[str], algo: str, dist: Dist) -> tuple[dict[str, Any] | None, Any]:
    """Step 2: the checkpoint ``--resume`` names (None for a fresh run), and the flags: its saved ones under those given
    again. Rank 0 finds and loads it, each rank verifies its own shard of it; every rank gets it (or the same error)."""
    resumed = _load_resume(args, algo, dist)
    if resumed is not None:
        args = _resumed_args(args, resumed, explicit, algo, say=dist.is_main)
        _warn_if_code_changed(resumed, dist.is_main)
    return resumed, args


def settle_flags(args: Any, explicit: set[str], family_defaults: dict, validate: Callable[..., None], algo: str, dist: Dist,
                 resumed: dict[str, Any] | None) -> tuple[Any, EnvFamily]:
    """Step 3: the env's family, the algorithm's defaults for it, whole games of a PettingZoo id, and the algorithm's
    refusals (``validate``): after this the flags are final."""
    family = env_family(args.env_id, args.env_timeout)  # a custom env is built to read its spaces: bounded as a build
    code = training_code()
    config.check_agent_rows(args.env_id, family.name, algo, command_for(algo), code.record if code else None)  # PettingZoo games
    args = config.apply_family_defaults(args, family_defaults, family.name, algo)
    if family.agents > 1 and "num_envs" not in explicit and resumed is None:  # a default in whole games (rows, rounded up)
        args.num_envs = -(-args.num_envs // family.agents) * family.agents
    if family.agents > 1 and args.num_envs % (family.agents * dist.world_size):  # each process steps whole games
        games = family.agents * dist.world_size
        raise FleetError(f"--num-envs {args.num_envs} counts agent rows, and {args.env_id} has {family.agents} agents in a game: each "
                         f"of the {dist.world_size} processes needs whole games, so --num-envs must be a multiple of "
                         f"{games} (e.g. {games * max(1, args.num_envs // games)}).")
    validate(args, dist.world_size)
    return args, family


@dataclass(frozen=True)
class ResourcePlan:
    """What step 4 gives this rank: its envs, its threads (torch's are set by then), its learner's device, and the
    policy lag the algorithm runs (0 for one without ``--policy-lag``)."""

    local_num_envs: int
    threads: runtime.ThreadPlan
    device: Any
    policy_lag: int


def plan_resources(args: Any, family: EnvFamily, dist: Dist, explicit: set[str], wide_network: bool, lag_worker: str) -> ResourcePlan:
    """Step 4: this rank's share of ``--num-envs``, the run folder (made, and checked writable, by rank 0), the thread
    plan (torch's threads set here; the env workers get theirs from ``make_vector_env(threads=run.threads)``) and the
    learner's device."""
    local_num_envs = split_evenly(args.num_envs, dist.world_size, "The number of environments", "--num-envs")
    if dist.is_main and args.run_dir is None:
        args.run_dir = config.default_run_dir(args.env_id, args.exp_name, args.seed)
    problem = _check_writable(args.run_dir) if dist.is_main else None
    args.run_dir, problem = dist.broadcast_object((args.run_dir, problem))
    if problem:
        raise FleetError(problem)
    cnn = family.name in IMAGE_FAMILIES or wide_network
    # a CNN's spinning threads collapse beside other jobs; sleeping ones do not (docs/backends.md, "Thread plan"). But
    # a CNN's gradients differ in the last bits with the thread count, so a plan that follows the load would make one
    # command train differently on a busy machine: it follows the load only with --no-torch-deterministic
    watch = cnn and args.torch_threads is None and not args.torch_deterministic and not runtime.threads_wait_passively()
    busy = runtime.busy_cores_elsewhere() if watch else 0.0
    policy_lag = args.policy_lag if lag_worker else 0
    threads = runtime.plan_threads(None, dist.local_world_size, local_num_envs, cnn=cnn, policy_lag=policy_lag,
                                   torch_threads=args.torch_threads, busy_elsewhere=busy)
    if lag_worker:
        threads = replace(threads, lag_worker=lag_worker)
    runtime.apply_thread_plan(threads)
    device = dist.device if dist.enabled else runtime.pick_device(args.cuda, warn="cuda" in explicit and dist.is_main)
    return ResourcePlan(local_num_envs, threads, device, policy_lag)


def _check_writable(run_dir: str) -> str | None:
    """Why the run folder cannot hold logs and checkpoints, or None: checked before anything starts."""
    probe = Path(run_dir) / f".fleetrl-write-test-{os.getpid()}"
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as exc:
        return (f"The run folder {run_dir} cannot be written ({exc.strerror or exc}). Choose a --run-dir on a writable disk "
                f"with free space (logs and checkpoints go there).")
    return None


def _warn_if_code_changed(resumed: dict[str, Any], say: bool) -> None:
    """A run resumed with an edited algorithm file goes on (a fix is a reason to resume), but says so."""
    saved, code = resumed.get("algo_file"), training_code()
    now = code.record if code is not None else None
    if say and isinstance(saved, dict) and now is not None and now["kind"] != "builtin" and saved.get("sha256") != now["sha256"]:
        print(f"fleetrl: warning: {now['path']} has changed since {resumed['_path']} was written (sha256 {now['sha256'][:16]}..., the "
              f"checkpoint's {str(saved.get('sha256'))[:16]}...): the run goes on with the code as it is now.", file=sys.stderr, flush=True)


# what a checkpoint (which may come from anyone) never chooses for a resumed run: anything that reaches outside its run
# folder (uploads to Weights & Biases), and where it writes. These hold only when the command line gives them.
NOT_RESUMED = frozenset({"resume", "run_dir", "track", "wandb_project_name", "wandb_entity"})


def _resumed_args(args: Any, resumed: dict[str, Any], explicit: set[str], algo: str, say: bool = True) -> Any:
    """A resumed run's arguments: the checkpoint's, less the flags given again and :data:`NOT_RESUMED`. What a checkpoint
    never chooses: a module to import (a saved custom env id is used only when ``--env-id`` names one), uploads, and
    where the run writes. Without ``--run-dir`` that is the run folder the checkpoint lies in (``RUN/checkpoints/``),
    never the folder saved in it; a checkpoint file kept elsewhere needs ``--run-dir``."""
    saved = resumed["args"]
    args = config.merge_resumed_args(args, saved, explicit | NOT_RESUMED)
    if saved.get("track") and not args.track and say:
        print(f"fleetrl: the run in {resumed['_path']} was tracked with Weights & Biases; a resume uploads only when its command "
              f"line asks: add --track (and --wandb-project-name, --wandb-entity) to go on tracking it.", file=sys.stderr, flush=True)
    if isinstance(saved.get("env_id"), str):
        args.env_id = env_id_for_checkpoint(saved["env_id"], args.env_id if "env_id" in explicit else None, resumed["_path"],
                                            f"{command_for(algo)} --resume {shlex.quote(args.resume)} ...")
    if args.run_dir is None:
        run_dir = checkpoint.run_folder_of(Path(resumed["_path"]))
        if run_dir is None:
            raise FleetError(f"--resume {args.resume}: this checkpoint file is not in a run's {checkpoint.CHECKPOINT_DIR}/ folder, so "
                             f"it names no run folder to go on in (the one saved in it is not used: fleetrl writes only where you "
                             f"say). Add --run-dir FOLDER for the run's logs and checkpoints.")
        args.run_dir = str(run_dir)
    return args


def _load_resume(args: Any, algo: str, dist: Dist) -> dict[str, Any] | None:
    """The checkpoint to resume (with its file and shard entries), or None for a fresh run; every rank calls it, and every
    rank gets the same checkpoint or raises the same error. Rank 0 picks a checkpoint and reads it; for each candidate,
    every rank verifies the shard it will load (on shared storage or its node's own disk), and the ranks agree (a gather)
    before it is taken: one rank's torn shard makes all of them skip to the one written before."""
    if not dist.is_main:
        while True:  # follow rank 0's choice: verify my shard of each candidate it offers, until it says which one
            kind, *payload = dist.broadcast_object(None)
            if kind == "chosen":
                if isinstance(payload[0], FleetError):
                    raise payload[0]
                return payload[0]
            _shards_agree(dist, *payload)

    def shards_agree(path: Path, state: dict[str, Any], shards: list[dict[str, Any]]) -> str | None:
        dist.broadcast_object(("verify", path, state.get("world_size"), shards))
        return _shards_agree(dist, path, state.get("world_size"), shards)

    try:
        chosen = None
        if args.resume == "auto":
            if args.run_dir is None:
                raise FleetError("--resume auto needs --run-dir: it resumes the newest checkpoint in that folder, or starts fresh there.")
            source = args.run_dir if checkpoint.list_checkpoints(args.run_dir) else None
        else:
            source = args.resume
        if source is not None:
            state, path, shards = checkpoint.choose_checkpoint(source, algo or None, shards_agree)
            chosen = {**state, "_path": str(path), "_shards": shards}
    except FleetError as exc:
        chosen = exc
    dist.broadcast_object(("chosen", chosen))
    if isinstance(chosen, FleetError):
        raise chosen
    return chosen


def _shards_agree(dist: Dist, path: Path, world_size: int | None, shards: list[dict[str, Any]]) -> str | None:
    """Every rank verifies its own shard of the checkpoint ``path`` (when this run loads it: the same world size) and
    all learn every rank's answer: why the checkpoint's shards are unusable, or None."""
    problem = None
    if world_size == dist.world_size:
        mine = next((s for s in shards if s["rank"] == dist.rank), None)
        if mine is None:
            problem = f"of rank {dist.rank} is not in the manifest"
        elif why := checkpoint.verify_shard(path.parent, mine):
            problem = f"{mine['name']} (rank {dist.rank}'s) {why}"
    bad = [p for p in dist.gather_objects(problem) if p]
    return "its shard " + "; its shard ".join(bad) + "." if bad else None
