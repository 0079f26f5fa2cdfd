"""`fleetrl tune`: hyperparameter search on Optuna. Each trial trains with `fleetrl train` in its own process group;
the tuner follows the runs' TensorBoard logs, reports a normalised score at aligned steps and stops weak trials
mid-run. Several tuner processes, on one machine or many, share one study through its storage.

The modules, each depending only on those listed before it:
  args           the command line: ``TuneArgs`` (its field docstrings are `--help`) and their checks
  train_command  the `fleetrl train ALGO ...` command it tunes: its algorithm and fixed flags
  space          the YAML search space, checked against the algorithm's flags
  score          a run's score from its TensorBoard logs, and a trial's over its envs and seeds
  storage        where the study lives, its heartbeat, and the lock its tuners share
  study          the study created or joined, its settings checked, its trials counted
  trials         one trial's runs as process groups, and how a trial ended
  report         the live status line, and the final report, trials.csv and plots
  tuner          the worker threads that run trials until the study has --trials
  slurm          --slurm and --slurm-template: a job array of tuner workers, submitted and followed or only written
  cli            `fleetrl tune` from parsed flags to exit code
"""

from fleetrl.tools.tune.args import DESCRIPTION, TuneArgs
from fleetrl.tools.tune.cli import run_tune
from fleetrl.tools.tune.storage import open_storage, parse_storage

__all__ = ["DESCRIPTION", "TuneArgs", "run_tune", "open_storage", "parse_storage"]
