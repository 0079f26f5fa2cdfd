"""The old name of fleetrl/tools/runs.py, for the Slurm files alone until they import that."""  # migrating: issue 33 part 5

from fleetrl.tools.runs import describe_exit, log_tail, resolve_command  # noqa: F401
