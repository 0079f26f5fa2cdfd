"""One trial's runs, each a `fleetrl train` process in a group of its own with its log and TensorBoard follower, and how
a trial ended."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fleetrl.tools.runs import start_run, stop_runs
from fleetrl.tools.tune.score import EpisodeFollower


@dataclass
class TrialRun:
    """One (env, seed) run of a trial: its folder, log, process group and TensorBoard follower."""

    env_id: str
    seed: int
    run_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    slot: int | None = None
    follower: EpisodeFollower = field(init=False)

    def __post_init__(self):
        self.follower = EpisodeFollower(self.run_dir)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def start(self, command: list[str], env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = start_run(command, self.log_path, env)


def stop_trial_runs(runs: list[TrialRun]) -> None:
    """Stop the trial's started runs, each with its process group (:func:`fleetrl.tools.runs.stop_runs`)."""
    stop_runs(run.proc for run in runs if run.proc is not None)


@dataclass
class Outcome:
    state: str  # complete, pruned, failed or interrupted
    value: float | None = None
    step: int | None = None  # the step a pruned trial was stopped at
    reason: str = ""
    exit_code: int | None = None
    log: str | None = None
