"""A training run's plumbing, shared by the algorithms: torchrun, resume, arguments, seeds, device, checkpoints.

``Run.start`` does, in order: join the torchrun job (if any); on rank 0, find and safely load the
checkpoint to resume (``--resume PATH`` or ``--resume auto``) and broadcast it; merge the saved
arguments with the flags given again; fill the env family's defaults; validate; split the global
``--num-envs`` over the ranks; pick the run folder, the seeds, the thread plan (``run.threads``:
torch's threads are set here, the env workers by ``make_vector_env(threads=run.threads)``) and the device.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

from fleetrl import checkpoint, config, runtime
from fleetrl.distributed import Dist, init_distributed, rank_seed, split_evenly
from fleetrl.envs import EnvFamily, env_family
from fleetrl.errors import FleetError

IMAGE_FAMILIES = ("atari", "procgen")  # the families trained with a CNN; the others with small MLPs (for the thread plan)


@dataclass
class Run:
    args: Any
    family: EnvFamily
    dist: Dist
    device: Any
    local_num_envs: int
    resumed: dict[str, Any] | None  # the checkpoint this run continues from
    global_step: int = 0
    start_iteration: int = 0
    threads: runtime.ThreadPlan | None = None  # who gets this process's cores; printed with describe(backend)

    @classmethod
    def start(cls, args: Any, explicit: set[str], family_defaults: dict, validate: Callable[[Any], None]) -> "Run":
        dist = init_distributed(args.cuda, args.dist_backend, args.dist_timeout)
        try:
            return cls._start(args, explicit, family_defaults, validate, dist)
        except BaseException:
            dist.close()
            raise

    @classmethod
    def _start(cls, args, explicit, family_defaults, validate, dist: Dist) -> "Run":
        # rank 0 finds and loads the checkpoint; everyone gets it (or the same error) by broadcast
        loaded: Any = None
        if dist.is_main:
            try:
                loaded = _load_resume(args)
            except FleetError as exc:
                loaded = exc
        loaded = dist.broadcast_object(loaded)
        if isinstance(loaded, FleetError):
            raise loaded
        resumed = loaded
        if resumed is not None:
            args = config.merge_resumed_args(args, resumed["args"], explicit | {"resume", "run_dir"})
            args.run_dir = args.run_dir or resumed["args"]["run_dir"]
        family = env_family(args.env_id)
        args = config.apply_family_defaults(args, family_defaults, family.name)
        validate(args)
        local_num_envs = split_evenly(args.num_envs, dist.world_size, "The number of environments", "--num-envs")
        if dist.is_main and args.run_dir is None:
            args.run_dir = config.default_run_dir(args.env_id, args.exp_name, args.seed)
        args.run_dir = dist.broadcast_object(args.run_dir)

        run = cls(args, family, dist, None, local_num_envs, resumed)
        if resumed is not None:
            run.global_step, run.start_iteration = int(resumed["global_step"]), int(resumed["iteration"])
        runtime.seed_everything(run.seed, args.torch_deterministic)
        if resumed is not None and dist.world_size == 1 and resumed.get("world_size", 1) == 1:
            checkpoint.set_rng_state(resumed["rng"])  # same single process: continue the exact streams
        cnn = family.name in IMAGE_FAMILIES
        # a CNN's spinning threads collapse beside other jobs; sleeping ones do not (docs/backends.md, "Thread plan")
        watch = cnn and args.torch_threads is None and not runtime.threads_wait_passively()
        busy = runtime.busy_cores_elsewhere() if watch else 0.0
        run.threads = runtime.plan_threads(os.cpu_count(), dist.local_world_size, local_num_envs, cnn=cnn,
                                           policy_lag=getattr(args, "policy_lag", 0), torch_threads=args.torch_threads, busy_elsewhere=busy)
        runtime.apply_thread_plan(run.threads)
        run.device = dist.device if dist.enabled else runtime.pick_device(args.cuda, warn="cuda" in explicit and dist.is_main)
        return run

    @property
    def cores(self) -> int:
        """The CPU cores this process may use: the machine's share for each process on it."""
        if self.threads is not None:
            return self.threads.cores
        return max(1, (os.cpu_count() or 1) // self.dist.local_world_size)

    @property
    def seed(self) -> int:
        """This rank's torch/numpy seed; a resumed run re-derives it from its step (any world size)."""
        return rank_seed(self.args.seed, self.dist.rank, self.global_step)

    @property
    def env_seed(self) -> int:
        """The seed of this rank's first env: envs of all ranks are seeded ``seed + global env index``.
        A resumed run starts new episodes, seeded apart by its step."""
        return self.args.seed + self.dist.rank * self.local_num_envs + self.global_step

    def save_checkpoint(self, state: dict[str, Any]) -> str | None:
        """Rank 0 writes the checkpoint atomically (with the arguments and RNG); other ranks write nothing."""
        if not self.dist.is_main:
            return None
        state = {**state, "args": asdict(self.args), "rng": checkpoint.rng_state(), "world_size": self.dist.world_size}
        return str(checkpoint.save_checkpoint(state, self.args.run_dir, self.args.keep_checkpoints))

    def close(self) -> None:
        self.dist.close()


def _load_resume(args: Any) -> dict[str, Any] | None:
    if args.resume == "auto":
        if args.run_dir is None:
            raise FleetError("--resume auto needs --run-dir: it resumes the newest checkpoint in that folder, or starts fresh there.")
        return checkpoint.load_checkpoint(args.run_dir) if checkpoint.list_checkpoints(args.run_dir) else None
    if args.resume is not None:
        return checkpoint.load_checkpoint(args.resume)
    return None

