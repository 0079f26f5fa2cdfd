"""A training run's plumbing, shared by the algorithms: torchrun, resume, arguments, seeds, device,
checkpoints, stop signals and teardown.

``Run.start`` sets a run up in five named steps (fleetrl/run_setup.py): ``join_job`` (the torchrun job), ``resume_checkpoint``
(the checkpoint of ``--resume``, its saved flags under the command line's, never choosing a module, a folder or an upload),
``settle_flags`` (the env family's defaults, whole games, the algorithm's ``validate``), ``plan_resources`` (``--num-envs``
over the ranks, the run folder, the thread plan ``run.threads``, the device) and ``Run._open`` (seeds, SIGTERM and Ctrl-C).

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
import signal
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from fleetrl import checkpoint, parent_watch, runtime
from fleetrl.cores import available_cores
from fleetrl.distributed import Dist, rank_seed
from fleetrl.envs import EnvFamily, make_vector_env
from fleetrl.envs.spaces import check_spaces
from fleetrl.errors import FleetError, NonFiniteLossError
from fleetrl.learner import Learner
from fleetrl.monitor import TrainResult
from fleetrl.monitor.trainlog import TrainLog
from fleetrl.run_setup import (ResourcePlan, command_for, join_job, plan_resources, resume_checkpoint, settle_flags,
                               training_code)

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
    @property
    def command(self) -> str:
        """The command that trains this run's algorithm again, for messages ("... --resume auto")."""
        return command_for(self.algo)

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

    def choose_accel(self, model: Any, obs_space: Any, batch_size: int) -> Any:
        """``--precision``, ``--compile`` and ``--memory-format`` for ``model``: measured once on this machine on one
        minibatch of ``batch_size`` rows (:func:`fleetrl.accel.choose_accel`), or as the resumed run had them; every
        checkpoint remembers the choice."""
        from fleetrl.accel import choose_accel  # torch: imported by the algorithm that asks, not by every run

        args = self.args
        accel = choose_accel(model, args.precision, args.compile, self.device, obs_space, batch_size, self.dist,
                             verbose=self.dist.is_main, saved=self.remembered("accel"), memory_format=args.memory_format)
        self.remember(accel=accel.state())
        return accel

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
            code = training_code()
            if code is not None:  # the algorithm's code: `fleetrl eval` rebuilds the policy with it
                state["algo_file"] = dict(code.record)
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


def _quietly(close: Callable[[], Any]) -> None:
    """Teardown must finish, and must not hide the error that ended the run: a failing close only warns."""
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - any failure while closing is reported, not raised
        print(f"fleetrl: warning: while closing: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
