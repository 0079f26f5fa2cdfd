"""The logging tail every algorithm ends an iteration with, in one call: ``log.iteration(...)``.

It gathers the episodes every rank finished, averages the losses over the ranks, logs CleanRL's scalars
(``charts/episodic_return``, ``charts/SPS``, ``losses/*``) and fleetrl's monitoring (``perf/*``,
``resources/*``), updates the progress display, writes checkpoints at ``--checkpoint-every`` and at
the end, and stops the run (after its checkpoint) when any rank got SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from fleetrl.monitor.logger import Logger, TrainResult
from fleetrl.monitor.progress import Progress
from fleetrl.monitor.resources import ResourceSampler, describe_usage
from fleetrl.monitor.timing import PhaseTimer

if TYPE_CHECKING:
    from fleetrl.run import Run

Episode = tuple[int, float, int]  # (global step it ended at, return, length)


class TrainLog:
    """Made by ``run.start_logging(envs, num_iterations, steps_per_iteration)``; ``timer`` times the phases."""

    def __init__(self, run: "Run", envs: Any, num_iterations: int, steps_per_iteration: int, notes: dict[str, str] | None = None):
        args, dist = run.args, run.dist
        self.run, self.num_iterations, self.steps_per_iteration = run, num_iterations, steps_per_iteration
        # only rank 0 writes logs; a resumed run's curves continue after its checkpoint (later points are purged)
        self.logger = run.closing(Logger(args.run_dir, enabled=dist.is_main, purge_step=run.global_step + 1 if run.resumed else None,
                                         track=args.track, wandb_project=args.wandb_project_name, wandb_entity=args.wandb_entity, config=args))
        self.logger.hparams(args)
        notes = {"env_backend": f"{envs.backend}: {envs.backend_reason}", "thread_plan": envs.thread_plan, **(notes or {})}
        stepping = getattr(envs, "stepping", None)
        if stepping is not None:  # the async backend's workers and stepping threads, and the measured step behind them
            notes["env_stepping"] = f"{stepping.describe()}: {stepping.reason}"
        for name, text in notes.items():
            self.logger.text(name, text)
        if dist.is_main:
            print(f"fleetrl {run.algo}: {args.env_id} ({run.family.name}), {num_iterations} iterations of {steps_per_iteration} steps"
                  f"{f' over {dist.world_size} processes' if dist.enabled else ''}; logs in {args.run_dir}", flush=True)
        self.progress = run.closing(Progress(num_iterations * steps_per_iteration, run.global_step, enabled=args.progress and dist.is_main))
        self.timer = PhaseTimer(distributed=dist.enabled)
        dist.comm_phase = self.timer.comm
        self.resources = ResourceSampler(interval=1.0, enabled=dist.is_main)  # CPU, memory, GPU of this process tree
        run.closing(self.resources.start(), close=self.resources.stop)
        self.envs = envs
        self.result = TrainResult(args.run_dir, global_step=run.global_step)
        self.return_reached: float | None = None  # set once --stop-at-return is reached; ``iterations`` then ends
        self.start_clock()

    def start_clock(self) -> None:
        """SPS counts from here: ``run.restore()``, right before the first iteration, calls it."""
        self.start_time, self.start_step = time.perf_counter(), self.run.global_step
        self.timer.lap()

    def iterations(self) -> Iterator[int]:
        """The loop's iterations: from the one after a resumed checkpoint's to the last, ending early (after that
        iteration's checkpoint) once ``--stop-at-return`` is reached."""
        for iteration in range(self.run.start_iteration + 1, self.num_iterations + 1):
            yield iteration
            if self.return_reached is not None:
                return

    def _return_reached(self) -> float | None:
        """The mean of the last ``--stop-window`` episode returns, if it reached ``--stop-at-return``."""
        target, window = getattr(self.run.args, "stop_at_return", None), getattr(self.run.args, "stop_window", 100)
        returns = self.result.episode_returns
        if target is None or len(returns) < window:
            return None
        mean = sum(returns[-window:]) / window
        return mean if mean >= target else None

    def iteration(self, iteration: int, global_step: int, episodes: list[Episode],
                  losses: dict[str, Any] | None = None, charts: dict[str, float] | None = None) -> None:
        """End iteration ``iteration`` at ``global_step`` (over all ranks). ``episodes``: those this rank finished since
        the last call; ``losses``: tensors or numbers, averaged over ranks and logged as ``losses/NAME`` (read from the
        device once here, not on every update; a non-finite one stops the run); ``charts``: logged as ``charts/NAME``, the same on every rank."""
        run, dist, logger = self.run, self.run.dist, self.logger
        all_episodes = sorted(e for rank_episodes in dist.gather_objects(episodes) for e in rank_episodes)
        for step_logged, episode_return, length in all_episodes:
            logger.episodes_finished([(episode_return, length)], step_logged)
        self.result.episode_returns += [r for _, r, _ in all_episodes]
        losses = losses or {}
        *means, restarts = dist.mean(_host_floats(losses.values()) + [getattr(self.envs, "worker_restarts", 0)])
        run.check_finite(dict(zip(losses, means)), iteration, global_step)  # a NaN loss stops the run before it is checkpointed
        sps = (global_step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)
        perf = self.timer.lap()
        self.result.iteration_seconds.append(self.timer.last_lap_seconds)
        logger.scalars({f"losses/{name}": value for name, value in zip(losses, means)}, global_step)
        logger.scalars({**{f"charts/{name}": value for name, value in (charts or {}).items()}, "charts/SPS": sps,
                        "charts/SPS_window": self.steps_per_iteration / max(self.timer.last_lap_seconds, 1e-9)}, global_step)
        self.return_reached = self._return_reached()  # the same on every rank: all ranks' episodes were gathered
        last = iteration == self.num_iterations or self.return_reached is not None
        usage = {**self.resources.latest(), "resources/env_worker_restarts": restarts * dist.world_size}  # all ranks' envs
        logger.monitor_scalars({**perf, **usage}, global_step, last=last)
        self.progress.update(global_step, sps, logger.mean_recent_return, extra=describe_usage(usage, perf))
        self.result.global_step = global_step
        stop = run.stop_requested()  # SIGTERM or Ctrl-C on any rank: checkpoint now, then stop (all ranks agree)
        if stop or iteration % run.args.checkpoint_every == 0 or last:
            logger.flush()  # the logs up to the checkpoint survive a kill
            run.save_checkpoint(global_step, iteration)
        if stop:
            raise run.stopped()
        if self.return_reached is not None and dist.is_main:
            print(f"stopping early: the mean return of the last {run.args.stop_window} episodes is {self.return_reached:.2f}, at least "
                  f"--stop-at-return {run.args.stop_at_return:g} (global step {global_step:,})", flush=True)

    def finish(self, model: torch.nn.Module) -> TrainResult:
        """After the last iteration: check that every rank holds the same parameters, say where the results are."""
        run, dist = self.run, self.run.dist
        digest = dist.check_replicas_identical(model)
        if dist.is_main:
            if dist.enabled:
                print(f"replicas in sync: {dist.world_size} ranks hold bit-identical parameters (sha256 {digest[:16]})", flush=True)
            print(f"done: {self.result.global_step:,} steps. TensorBoard logs: {run.args.run_dir}  (tensorboard --logdir {run.args.run_dir})", flush=True)
            print(f"checkpoint: {run.last_checkpoint}", flush=True)
        return self.result


def _host_floats(values: Any) -> list[float]:
    """Numbers and (device) scalar tensors as Python floats, with one host sync for all the tensors."""
    values = list(values)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    host = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist() if tensors else [])
    return [next(host) if isinstance(v, torch.Tensor) else float(v) for v in values]
