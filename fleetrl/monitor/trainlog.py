"""A training run's logs: CleanRL's scalars (``charts/episodic_return``, ``charts/SPS``, ``losses/*``), fleetrl's
monitoring (``perf/*``, ``resources/*``), the progress display and the start-up notes. It logs only: the end of an
iteration (checkpoints, stop signals, a NaN loss, ``--stop-at-return``) belongs to the run (``Run.end_iteration``)."""

from __future__ import annotations

import time
from typing import Any

import torch

from fleetrl.monitor.logger import Logger, TrainResult
from fleetrl.monitor.progress import Progress
from fleetrl.monitor.resources import ResourceSampler, describe_usage
from fleetrl.monitor.timing import PhaseTimer

Episode = tuple[int, float, int]  # (global step it ended at, return, length)


class TrainLog:
    """Made by ``run.start_logging(envs, num_iterations, steps_per_iteration)``; ``timer`` times the phases.

    ``dist``: the run's torchrun helpers (only rank 0 writes; episodes and losses are gathered from every rank);
    ``global_step``: where the run starts (a resumed run's curves continue after its checkpoint); ``title``: the
    start-up line's first words (``fleetrl ppo: CartPole-v1 (classic)``)."""

    def __init__(self, args: Any, dist: Any, envs: Any, num_iterations: int, steps_per_iteration: int, *, global_step: int,
                 resumed: bool, title: str, notes: dict[str, str] | None = None):
        self.dist, self.envs, self.num_iterations, self.steps_per_iteration = dist, envs, num_iterations, steps_per_iteration
        # only rank 0 writes logs; a resumed run's curves continue after its checkpoint (later points are purged)
        self.logger = Logger(args.run_dir, enabled=dist.is_main, purge_step=global_step + 1 if resumed else None,
                             track=args.track, wandb_project=args.wandb_project_name, wandb_entity=args.wandb_entity, config=args)
        self.logger.hparams(args)
        notes = {"env_backend": f"{envs.backend}: {envs.backend_reason}", "thread_plan": envs.thread_plan, **(notes or {})}
        stepping = getattr(envs, "stepping", None)
        if stepping is not None:  # the async backend's workers and stepping threads, and the measured step behind them
            notes["env_stepping"] = f"{stepping.describe()}: {stepping.reason}"
        for name, text in notes.items():
            self.logger.text(name, text)
        if dist.is_main:
            print(f"{title}, {num_iterations} iterations of {steps_per_iteration} steps"
                  f"{f' over {dist.world_size} processes' if dist.enabled else ''}; logs in {args.run_dir}", flush=True)
        self.progress = Progress(num_iterations * steps_per_iteration, global_step, enabled=args.progress and dist.is_main)
        self.timer = PhaseTimer(distributed=dist.enabled)
        dist.comm_phase = self.timer.comm
        self.resources = ResourceSampler(interval=1.0, enabled=dist.is_main).start()  # CPU, memory, GPU of this process tree
        self.result = TrainResult(args.run_dir, global_step=global_step)
        self._sps = 0.0
        self.start_clock(global_step)

    def start_clock(self, global_step: int) -> None:
        """SPS counts from here: ``run.restore()``, right before the first iteration, calls it."""
        self.start_time, self.start_step = time.perf_counter(), global_step
        self.timer.lap()

    def iteration(self, global_step: int, episodes: list[Episode], losses: dict[str, Any] | None = None,
                  charts: dict[str, float] | None = None) -> dict[str, float]:
        """Log one iteration at ``global_step`` (over all ranks): the episodes every rank finished since the last call,
        the losses averaged over ranks (tensors read from the device once here, not on every update) and ``charts``
        (``charts/NAME``, the same on every rank), with SPS. Returns the averaged losses."""
        logger, dist = self.logger, self.dist
        all_episodes = sorted(e for rank_episodes in dist.gather_objects(episodes) for e in rank_episodes)
        for step_logged, episode_return, length, *agent in all_episodes:  # a PettingZoo game's episodes: the agent's index
            logger.episodes_finished([(episode_return, length)], step_logged)
            if agent:  # CleanRL's multi-agent names, as ppo_pettingzoo_ma_atari.py logs them
                logger.scalar(f"charts/episodic_return-player{agent[0]}", episode_return, step_logged)
                logger.scalar(f"charts/episodic_length-player{agent[0]}", length, step_logged)
        self.result.episode_returns += [e[1] for e in all_episodes]
        losses = losses or {}
        *means, self._restarts = dist.mean(_host_floats(losses.values()) + [getattr(self.envs, "worker_restarts", 0)])
        means = dict(zip(losses, means))
        self._sps = (global_step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)
        self._perf = self.timer.lap()
        self.result.iteration_seconds.append(self.timer.last_lap_seconds)
        self.result.global_step = global_step
        logger.scalars({f"losses/{name}": value for name, value in means.items()}, global_step)
        logger.scalars({**{f"charts/{name}": value for name, value in (charts or {}).items()}, "charts/SPS": self._sps,
                        "charts/SPS_window": self.steps_per_iteration / max(self.timer.last_lap_seconds, 1e-9)}, global_step)
        return means

    def mean_return(self, window: int) -> float | None:
        """The mean of the last ``window`` episode returns of every rank, once there are that many."""
        returns = self.result.episode_returns
        return sum(returns[-window:]) / window if len(returns) >= window else None

    def monitor(self, global_step: int, last: bool) -> None:
        """The phase timing and resources of the iteration just logged (``perf/*``, ``resources/*``, at most once a
        second and at the ``last``), and the progress display."""
        usage = {**self.resources.latest(), "resources/env_worker_restarts": self._restarts * self.dist.world_size}  # all ranks
        self.logger.monitor_scalars({**self._perf, **usage}, global_step, last=last)
        self.progress.update(global_step, self._sps, self.logger.mean_recent_return, extra=describe_usage(usage, self._perf))

    def flush(self) -> None:
        """The logs up to here survive a kill (called before each checkpoint)."""
        self.logger.flush()

    def close(self) -> None:
        self.resources.stop()
        self.progress.close()
        self.logger.close()


def _host_floats(values: Any) -> list[float]:
    """Numbers and (device) scalar tensors as Python floats, with one host sync for all the tensors."""
    values = list(values)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    host = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist() if tensors else [])
    return [next(host) if isinstance(v, torch.Tensor) else float(v) for v in values]
