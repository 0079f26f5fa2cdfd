"""A training run's plumbing, shared by the algorithms: torchrun, resume, arguments, seeds, device,
checkpoints, stop signals and teardown.

``Run.start`` sets a run up in five named steps, each a function here: ``join_job`` (the torchrun job, if any);
``resume_checkpoint`` (rank 0 finds and safely loads the checkpoint of ``--resume PATH`` or ``--resume auto`` and
broadcasts it; its saved arguments go under the flags given again, and it never picks a module to import, a folder to
write or an upload: ``_resumed_args``); ``settle_flags`` (the env family's defaults, whole games, the algorithm's
``validate``); ``plan_resources`` (the global ``--num-envs`` split over the ranks, the run folder checked writable, the
thread plan, ``run.threads``: torch's threads are set here, the env workers by ``make_vector_env(threads=run.threads)``,
and the device); and ``Run._open`` (seeds, SIGTERM and Ctrl-C caught).

A run is a context: everything the algorithm opens with ``run.closing(...)`` is closed when the ``with``
block ends, however it ends, from the first line of setup on.

Checkpoints hold the objects registered with ``run.register`` (the same on every rank: model, optimiser,
normalisation statistics), per rank ``run.register_per_rank`` ones (the sampling RNG) and every global RNG stream,
and ``run.register_shard`` ones (a replay shard): large per-rank state that each rank streams to a file of its own.
``run.restore()``, called right before the first iteration, puts a resumed run's states back, so it continues
exactly where it stopped (docs/reliability.md says what a resume keeps and restarts, and how checkpoints are laid out).
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import sys
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from fleetrl import checkpoint, config, parent_watch, runtime
from fleetrl.cores import available_cores
from fleetrl.args import DIST_TIMEOUT
from fleetrl.distributed import Dist, init_distributed, launched_by_torchrun, rank_seed, split_evenly
from fleetrl.envs import EnvFamily, env_family, make_vector_env
from fleetrl.envs.registry import env_id_for_checkpoint
from fleetrl.envs.spaces import check_spaces
from fleetrl.errors import FleetError, NonFiniteLossError
from fleetrl.learner import Learner
from fleetrl.monitor import TrainResult
from fleetrl.monitor.trainlog import TrainLog

IMAGE_FAMILIES = ("atari", "procgen", "multiagent-image")  # the families trained with a CNN; the others with small MLPs (for the thread plan)
MAX_FAILED_CHECKPOINTS = 3  # checkpoint writes that may fail in a row before the run stops
STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}


class StoppedBySignal(FleetError):
    """SIGTERM (a scheduler's preemption) or Ctrl-C: the run checkpointed and stopped; resume it with --resume auto."""

    def __init__(self, message: str, signum: int, quiet: bool = False):
        super().__init__(message)
        self.exit_code = 128 + signum  # what a shell reports for a process ended by that signal
        self.quiet = quiet


@dataclass
class Run:
    args: Any
    family: EnvFamily
    dist: Dist
    device: Any
    local_num_envs: int
    resumed: dict[str, Any] | None  # the checkpoint this run continues from
    algo: str = ""
    policy_lag: int = 0  # --policy-lag, for an algorithm that has one (Run.start's lag_worker)
    global_step: int = 0
    start_iteration: int = 0
    threads: runtime.ThreadPlan | None = None  # who gets this process's cores; printed with describe(backend)
    last_checkpoint: str | None = None  # the newest checkpoint written (or resumed from)
    _cleanup: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _shared: dict[str, Any] = field(default_factory=dict)  # name -> object with state_dict/load_state_dict
    _per_rank: dict[str, Any] = field(default_factory=dict)
    _shards: dict[str, Any] = field(default_factory=dict)  # large per-rank state, in a file per rank (run.register_shard)
    _remembered: dict[str, Any] = field(default_factory=dict)  # plain values every checkpoint carries (run.remember)
    _env_shapes: tuple | None = None
    _failed_writes: int = 0
    _signal: int | None = None  # the stop signal received, if any
    _log: TrainLog | None = None
    _num_iterations: int = 0
    _return_reached: float | None = None  # the mean return that reached --stop-at-return; ``iterations`` then ends
    _learner: Learner | None = None  # its state is fetched before each checkpoint (--policy-lag 1 keeps it in a process of its own)
    _old_handlers: dict = field(default_factory=dict)
    # the algorithm's code this process trains ({kind, module, path, sha256}) and the command that trains it again, set by
    # the command that started it (fleetrl/algos/source.py); None when a script calls train() itself
    algorithm_file: ClassVar[dict[str, str] | None] = None
    algorithm_command: ClassVar[str | None] = None

    @classmethod
    def trains(cls, algorithm_file: dict[str, str] | None, command: str | None) -> None:
        """Say which algorithm file this process trains: its checkpoints record it (``fleetrl eval`` rebuilds the policy
        with that code) and its messages name ``command`` to continue it; None, None when it is done."""
        cls.algorithm_file, cls.algorithm_command = (dict(algorithm_file) if algorithm_file else None), command

    @classmethod
    def command_for(cls, algo: str) -> str:
        return cls.algorithm_command or f"fleetrl train {algo}"

    @property
    def command(self) -> str:
        """The command that trains this run's algorithm again, for messages ("... --resume auto")."""
        return self.command_for(self.algo)

    @classmethod
    def start(cls, args: Any, explicit: set[str], family_defaults: dict, validate: Callable[..., None], algo: str = "",
              wide_network: bool = False, lag_worker: str = "") -> "Run":
        """Set a training run up, in five steps (docs/engine.md, "How a run starts"): :func:`join_job` (torchrun),
        :func:`resume_checkpoint` (``--resume``), :func:`settle_flags` (the env family's defaults, the algorithm's
        refusals), :func:`plan_resources` (envs per rank, run folder, threads, device), then :meth:`_open` (the run,
        seeded, catching stop signals).

        ``algo``: the algorithm's name (``fleetrl train ALGO``); a checkpoint written by another is refused.
        ``wide_network``: the learner's layers are wide enough to split over threads even on vector observations
        (SAC's and TD3's 256-wide MLPs at batch 256), so the thread plan treats it as a CNN. ``lag_worker``: what the
        algorithm's ``--policy-lag 1`` runs beside the trainer ("sampler thread", "learner process"); "" if it has none."""
        dist = join_job(args)
        try:
            resumed, args = resume_checkpoint(args, explicit, algo, dist)
            args, family = settle_flags(args, explicit, family_defaults, validate, algo, dist, resumed)
            plan = plan_resources(args, family, dist, explicit, wide_network, lag_worker)
            return cls._open(args, family, dist, plan, resumed, algo)
        except FleetError as exc:
            exc.quiet = exc.quiet or not dist.is_main  # every rank refuses the same flags; rank 0 says it once
            dist.close()
            raise
        except BaseException:
            dist.close()
            raise

    @classmethod
    def _open(cls, args: Any, family: EnvFamily, dist: Dist, plan: "ResourcePlan", resumed: dict[str, Any] | None, algo: str) -> "Run":
        """Step 5: the run, at a resumed checkpoint's step, seeded for it, on its planned threads, catching SIGTERM and Ctrl-C."""
        run = cls(args, family, dist, plan.device, plan.local_num_envs, resumed, algo, policy_lag=plan.policy_lag,
                  threads=plan.threads)
        if resumed is not None:
            run.global_step, run.start_iteration = int(resumed["global_step"]), int(resumed["iteration"])
            run.last_checkpoint = resumed.get("_path")
        runtime.seed_everything(run.seed, args.torch_deterministic)
        run._catch_stop_signals()
        return run

    # ---------------------------------------------------------------- envs and logging
    def make_envs(self, **options: Any) -> Any:
        """This rank's training envs (``run.local_num_envs`` of them), closed with the run; their spaces are checked
        for the algorithm and their shapes kept, so a checkpoint from another env is refused. ``options`` go to
        :func:`fleetrl.envs.make_vector_env` (PPO's sampler passes ``async_batch``)."""
        args = self.args
        envs = self.closing(make_vector_env(
            args.env_id, self.local_num_envs, args.env_backend, training=True, sticky_actions=args.sticky_actions, family=self.family,
            cores=self.cores, verbose=self.dist.is_main, threads=self.threads,
            max_restarts=args.max_env_restarts, env_timeout=args.env_timeout,  # a crashed or hung env worker is restarted
            env_workers=args.env_workers, env_threads=args.env_threads,  # the async backend's processes and stepping threads
            video_dir=f"{args.run_dir}/videos" if args.capture_video and self.dist.is_main else None, **options))
        check_spaces(args.env_id, envs.single_observation_space, envs.single_action_space, self.algo)
        self.check_env(envs.single_observation_space.shape, envs.single_action_space.shape)  # a resumed checkpoint must fit
        saved = (self.resumed or {}).get("args", {}).get("env_backend", "auto")
        if saved not in ("auto", envs.backend) and self.dist.is_main:  # given again on the command line, else it is the saved one
            print(f"fleetrl: note: resuming on --env-backend {envs.backend}; the checkpoint was trained on {saved}, and backends can "
                  f"differ in the data they give (docs/backends.md).", file=sys.stderr, flush=True)
        args.env_backend = envs.backend  # auto's choice, in the config and every checkpoint: a resume uses it
        return envs

    def start_logging(self, envs: Any, num_iterations: int, steps_per_iteration: int, notes: dict[str, str] | None = None) -> TrainLog:
        """TensorBoard (rank 0), the progress display, phase timing and resource sampling, all closed with the run
        (fleetrl/monitor/trainlog.py); ``run.end_iteration(...)`` logs each iteration through it."""
        self._num_iterations = num_iterations
        self._log = self.closing(TrainLog(self.args, self.dist, envs, num_iterations, steps_per_iteration, global_step=self.global_step,
                                          resumed=self.resumed is not None, title=f"fleetrl {self.algo}: {self.args.env_id} "
                                          f"({self.family.name})", notes=notes))
        return self._log

    # ---------------------------------------------------------------- the training loop's ends
    def iterations(self) -> Iterator[int]:
        """The loop's iterations: from the one after a resumed checkpoint's to the last, ending early (after that
        iteration's checkpoint) once ``--stop-at-return`` is reached."""
        for iteration in range(self.start_iteration + 1, self._num_iterations + 1):
            yield iteration
            if self._return_reached is not None:
                return

    def end_iteration(self, iteration: int, global_step: int, episodes: list, losses: dict[str, Any] | None = None,
                      charts: dict[str, float] | None = None) -> None:
        """End iteration ``iteration`` at ``global_step`` (over all ranks): log it (``episodes``: those this rank finished
        since the last call; ``losses``: averaged over ranks, logged as ``losses/NAME``; ``charts``: ``charts/NAME``);
        stop on a non-finite loss; write a checkpoint at ``--checkpoint-every``, at the end, at ``--stop-at-return``
        and on SIGTERM or Ctrl-C, after which a signal stops the run. Every rank decides alike."""
        log, args = self._log, self.args
        means = log.iteration(global_step, episodes, losses, charts)
        self.check_finite(means, iteration, global_step)  # a NaN loss stops the run before it is checkpointed
        target = getattr(args, "stop_at_return", None)
        reached = log.mean_return(args.stop_window) if target is not None else None
        self._return_reached = reached if reached is not None and reached >= target else None  # all ranks' episodes
        last = iteration == self._num_iterations or self._return_reached is not None
        log.monitor(global_step, last)
        stop = self.stop_requested()  # SIGTERM or Ctrl-C on any rank: checkpoint now, then stop (all ranks agree)
        if stop or iteration % args.checkpoint_every == 0 or last:
            log.flush()  # the logs up to the checkpoint survive a kill
            self.save_checkpoint(global_step, iteration)
        if stop:
            raise self.stopped()
        if self._return_reached is not None and self.dist.is_main:
            print(f"stopping early: the mean return of the last {args.stop_window} episodes is {self._return_reached:.2f}, at least "
                  f"--stop-at-return {target:g} (global step {global_step:,})", flush=True)

    def finish(self, model: Any) -> TrainResult:
        """After the last iteration: check that every rank holds the same parameters, say where the results are."""
        digest = self.dist.check_replicas_identical(model)
        result = self._log.result
        if self.dist.is_main:
            if self.dist.enabled:
                print(f"replicas in sync: {self.dist.world_size} ranks hold bit-identical parameters (sha256 {digest[:16]})", flush=True)
            print(f"done: {result.global_step:,} steps. TensorBoard logs: {self.args.run_dir}  (tensorboard --logdir {self.args.run_dir})",
                  flush=True)
            print(f"checkpoint: {self.last_checkpoint}", flush=True)
        return result

    def learner(self, *updates: Callable[..., Any], acting: Any) -> Learner:
        """Where the update functions run: here, or with ``--policy-lag 1`` in a learner process that ``acting`` (the
        network the loop acts with) follows one update behind (fleetrl/learner.py). Call it after ``register``."""
        threads = self.threads.torch_threads if self.threads is not None else 1
        self._learner = self.closing(Learner(updates, acting, self._shared, self.policy_lag, self.device,
                                             torch_threads=max(1, threads - 1)))
        return self._learner

    def check_finite(self, losses: dict[str, float], iteration: int, global_step: int) -> None:
        """Stop the run, without saving, when a loss became NaN or inf (``end_iteration`` checks the averaged losses)."""
        bad = {name: value for name, value in losses.items() if not math.isfinite(value)}
        if bad:
            name, value = next(iter(bad.items()))
            raise NonFiniteLossError(
                f"The loss became non-finite (losses/{name} = {value}) at iteration {iteration} (global step {global_step}); "
                f"the run stopped without saving. The last good checkpoint is {self.last_checkpoint or 'none (none was written yet)'}. "
                f"Lower the learning rate (or clip the gradients harder, where the algorithm has --max-grad-norm), or check the "
                f"environment for NaN/inf rewards or observations.")

    # ---------------------------------------------------------------- teardown
    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def closing(self, obj: Any, close: Callable[[], Any] | None = None) -> Any:
        """Close ``obj`` (``obj.close()``, or ``close``) when the run ends, however it ends; returns ``obj``."""
        self._cleanup.callback(_quietly, close or obj.close)
        return obj

    def close(self) -> None:
        """Close what the run opened, newest first, then leave the torchrun job; a failing close only warns."""
        self._cleanup.close()
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()
        self.dist.close()

    # ---------------------------------------------------------------- stop signals
    def _catch_stop_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; a run started from another thread keeps the defaults
        for signum in STOP_SIGNALS:
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)
        parent_watch.watch_parent()  # a tool's run gets SIGTERM when its tool is gone (killed too), and stops here

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signal == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        self._signal = signum
        if self.dist.is_main:
            print(f"\nfleetrl: {STOP_SIGNALS[signum]} received: writing a checkpoint at the end of this iteration, then stopping"
                  f"{' (Ctrl-C again stops at once)' if signum == signal.SIGINT else ''}.", file=sys.stderr, flush=True)

    def stop_requested(self) -> bool:
        """Whether any rank got SIGTERM or Ctrl-C; all ranks get the same answer (one small all-reduce an iteration)."""
        got = np.array([self._signal == signal.SIGTERM, self._signal == signal.SIGINT], np.float64)
        term, interrupt = self.dist.allreduce_sum_np(got)  # how many ranks got each
        if self._signal is None and (term or interrupt):
            self._signal = signal.SIGTERM if term else signal.SIGINT
        return bool(term or interrupt)

    def stopped(self) -> StoppedBySignal:
        """The error that ends a run stopped by a signal, after its checkpoint."""
        signum = self._signal or signal.SIGTERM
        return StoppedBySignal(
            f"stopped by {STOP_SIGNALS.get(signum, signum)} at global step {self.global_step:,}. The checkpoint "
            f"{self.last_checkpoint or '(none could be written)'} holds the run; continue it with: "
            f"{self.command} --resume auto --run-dir {self.args.run_dir}", signum, quiet=not self.dist.is_main)

    # ---------------------------------------------------------------- checkpoints
    def register(self, **objects: Any) -> None:
        """Objects (with ``state_dict``/``load_state_dict``) that are the same on every rank: saved from rank 0."""
        self._shared.update(objects)

    def remember(self, **values: Any) -> None:
        """Plain values (choices made at start, such as the precision) that every checkpoint carries, so that a resumed
        run makes the same choice: :meth:`remembered` gives them back."""
        self._remembered.update(values)

    def remembered(self, name: str) -> Any:
        """What the resumed checkpoint remembered under ``name``; None for a fresh run (or an older checkpoint)."""
        return (self.resumed or {}).get("remembered", {}).get(name)

    def register_per_rank(self, **objects: Any) -> None:
        """Objects each rank holds its own of (the sampling RNG): every rank's is saved."""
        self._per_rank.update(objects)

    def register_shard(self, **objects: Any) -> None:
        """Large objects each rank holds its own of (its replay shard): each rank streams its own to a file of the
        checkpoint, never gathering or copying it, and a resume loads it back on the same rank (same world size)."""
        self._shards.update(objects)

    def restores(self, name: str) -> bool:
        """Whether ``restore`` puts this rank's saved ``name`` (a ``register_shard`` object) back: the resumed checkpoint
        holds it for this rank, from a run of this world size. Otherwise it starts afresh (a replay buffer refills)."""
        ranks = (self.resumed or {}).get("ranks") or []
        if name not in self._shards or len(ranks) != self.dist.world_size:
            return False
        return name in self._my_shard().get("holds", ()) or name in ranks[self.dist.rank]  # the latter: kept before shards were

    def _my_shard(self) -> dict[str, Any]:
        """This rank's entry in the resumed checkpoint's manifest ({} if it has none)."""
        return next((s for s in (self.resumed or {}).get("_shards", []) if s["rank"] == self.dist.rank), {})

    def check_env(self, obs_shape: tuple[int, ...], action_shape: tuple[int, ...]) -> None:
        """The env's shapes, saved with each checkpoint; a resumed checkpoint from an env of other shapes is refused."""
        self._env_shapes = (tuple(obs_shape), tuple(action_shape))
        if self.resumed is not None:
            checkpoint.check_compatible(self.resumed, self.last_checkpoint or self.args.resume, obs_shape, action_shape, self.args.env_id)

    def restore(self) -> None:
        """Put a resumed run's registered states and RNG streams back. Call it right before the first iteration,
        after everything that draws random numbers during setup, so the streams continue exactly. SPS counts from here."""
        if self._log is not None:
            self._log.start_clock(self.global_step)
        if self.resumed is None:
            return
        for name, obj in self._shared.items():
            if name not in self.resumed:
                raise FleetError(f"The checkpoint {self.last_checkpoint} has no {name!r} state; it was not written by this version of "
                                 f"fleetrl {self.algo}. Start afresh in a new --run-dir.")
            try:
                obj.load_state_dict(self.resumed[name])
            except (RuntimeError, ValueError, KeyError) as exc:
                raise FleetError(f"The checkpoint {self.last_checkpoint} does not fit this run's {name}: {str(exc).splitlines()[0]} "
                                 f"Resume it with the flags and env it was trained with.") from None
        ranks = self.resumed.get("ranks")
        if ranks is not None and len(ranks) == self.dist.world_size:  # same world size: each rank continues its own streams
            mine = ranks[self.dist.rank]
            for name, obj in self._per_rank.items():
                obj.load_state_dict(mine[name])
            checkpoint.set_rng_state(mine["rng"])
            restored = [name for name in self._shards if self.restores(name)]
            if restored:
                shard = self._my_shard()  # none: a checkpoint of an older fleetrl, which kept it with the rest
                saved = checkpoint.load_shard(Path(self.resumed["_path"]).parent / shard["name"]) if shard else mine
                for name in restored:
                    self._shards[name].load_state_dict(saved[name])  # copied out of the mapped file: never in memory twice
        # another world size: the streams are re-derived from the seed and the step (``seed``), as in a fresh run

    def save_checkpoint(self, global_step: int, iteration: int) -> str | None:
        """Write a checkpoint (:meth:`_write_checkpoint`); a run stopped because its tool is gone is let finish it while its
        files grow (fleetrl/parent_watch.py), however long a large one (``--save-buffer``) takes."""
        with parent_watch.checkpoint_in_progress(lambda: checkpoint.temporary_bytes(self.args.run_dir)):
            return self._write_checkpoint(global_step, iteration)

    def _write_checkpoint(self, global_step: int, iteration: int) -> str | None:
        """Every rank calls this. Each rank streams its ``register_shard`` objects to its own file; rank 0 writes the
        rest (with every rank's RNG streams) and, once every file is in place, the manifest that commits them all.

        A failed write is reported and retried at the next checkpoint; after ``MAX_FAILED_CHECKPOINTS`` in a row
        the run stops, naming the last good checkpoint. All ranks learn the outcome, so they stop together.
        """
        self.global_step = global_step
        if self._learner is not None:
            self._learner.sync()  # the learner process's networks and optimiser, as of its last update
        shard: dict[str, Any] | str | None = None  # this rank's shard: its manifest entry, or why it could not be written
        if self._shards:
            try:
                shard = checkpoint.write_shard({k: v.state_dict() for k, v in self._shards.items()}, self.args.run_dir,
                                               global_step, self.dist.rank)
            except checkpoint.CheckpointWriteError as exc:
                shard = str(exc)
        gathered = self.dist.gather_objects(({"rng": checkpoint.rng_state(), **{k: v.state_dict() for k, v in self._per_rank.items()}},
                                             shard))  # small: the shards themselves stay where they are
        ranks, shards = [g[0] for g in gathered], [g[1] for g in gathered]
        outcome: tuple[str | None, str | None, list[str]] = (None, None, [])
        if self.dist.is_main:
            state = {**{k: v.state_dict() for k, v in self._shared.items()}, "ranks": ranks, "global_step": global_step,
                     "iteration": iteration, "algo": self.algo, "family": self.family.name, "args": asdict(self.args),
                     "world_size": self.dist.world_size, "remembered": dict(self._remembered)}
            if Run.algorithm_file is not None:  # the algorithm's code: `fleetrl eval` rebuilds the policy with it
                state["algo_file"] = dict(Run.algorithm_file)
            if self._env_shapes is not None:
                state["obs_shape"], state["action_shape"] = self._env_shapes
            written, failed = None, next((s for s in shards if isinstance(s, str)), None)  # a rank whose shard failed
            if failed is None:
                try:
                    written = str(checkpoint.save_checkpoint(state, self.args.run_dir, self.args.keep_checkpoints, [s for s in shards if s]))
                except checkpoint.CheckpointWriteError as exc:
                    failed = str(exc)
            outcome = (written, failed, [p.name for p in checkpoint.list_checkpoints(self.args.run_dir)])
        path, failure, kept = self.dist.broadcast_object(outcome)
        checkpoint.remove_stale_shards(self.args.run_dir, kept)  # a failed write's, retired checkpoints', also on a node's own disk
        if failure is None:
            self._failed_writes, self.last_checkpoint = 0, path
            return path
        self._failed_writes += 1
        last_good = self.last_checkpoint or "none (no checkpoint was written yet)"
        if self._failed_writes >= MAX_FAILED_CHECKPOINTS:
            raise FleetError(f"{failure} That is {self._failed_writes} failed checkpoint writes in a row, so the run stopped. "
                             f"The last good checkpoint is {last_good}. Free space on (or fix) the disk of {self.args.run_dir}, "
                             f"then continue with: {self.command} --resume auto --run-dir {self.args.run_dir}")
        if self.dist.is_main:
            print(f"fleetrl: warning: {failure} Training goes on and the next checkpoint tries again "
                  f"({self._failed_writes} of {MAX_FAILED_CHECKPOINTS} allowed failures in a row); the last good one is {last_good}.",
                  file=sys.stderr, flush=True)
        return None

    # ---------------------------------------------------------------- seeds
    @property
    def cores(self) -> int:
        """The CPU cores this process may use: the machine's share for each process on it."""
        if self.threads is not None:
            return self.threads.cores
        return max(1, available_cores() // self.dist.local_world_size)

    @property
    def seed(self) -> int:
        """This rank's torch/numpy seed; a resumed run re-derives it from its step (then ``restore`` puts the saved streams back)."""
        return rank_seed(self.args.seed, self.dist.rank, self.global_step)

    @property
    def env_seed(self) -> int:
        """The seed of this rank's first env: envs of all ranks are seeded ``seed + global env index``.
        A resumed run starts new episodes, seeded apart by its step."""
        return self.args.seed + self.dist.rank * self.local_num_envs + self.global_step


# ---------------------------------------------------------------- the steps of Run.start
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
    config.check_agent_rows(args.env_id, family.name, algo, Run.command_for(algo), Run.algorithm_file)  # PettingZoo games
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


def _quietly(close: Callable[[], Any]) -> None:
    """Teardown must finish, and must not hide the error that ended the run: a failing close only warns."""
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - any failure while closing is reported, not raised
        print(f"fleetrl: warning: while closing: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


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
    saved, now = resumed.get("algo_file"), Run.algorithm_file
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
                                            f"{Run.command_for(algo)} --resume {shlex.quote(args.resume)} ...")
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
