"""User-facing errors: the CLI prints them as one paragraph and exits non-zero, without a traceback."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


class FleetError(Exception):
    """Bad input or a failed run the user can fix; the message says what to change or run."""

    exit_code = 2
    quiet = False  # True: exit with exit_code without printing (another process of the job prints it)


class NonFiniteLossError(FleetError):
    """Training produced NaN/inf; the last good checkpoint is kept."""

    exit_code = 3


class EnvWorkerError(FleetError):
    """An environment raised inside a vector worker process, or the worker died.

    The message names the env index, its env id and the worker, and carries the worker's traceback
    text, since the CLI prints FleetErrors without a (parent-side) traceback.
    """

    def __init__(self, message: str, env_index: int | None = None, worker_index: int | None = None):
        super().__init__(message)
        self.env_index = env_index
        self.worker_index = worker_index


class EnvOutputError(FleetError):
    """An environment returned what the learner cannot use: a NaN or inf observation or reward, or an
    observation of another shape than its space says (fleetrl/envs/wrappers.py, :class:`CheckOutputs`).

    The message names the env id, its index in the vector where known, and the step; the fix is in the env.
    """

    def __init__(self, message: str, env_index: int | None = None):
        super().__init__(message)
        self.env_index = env_index

    def __reduce__(self):  # keeps env_index when a worker process sends the error to the trainer
        return type(self), (str(self), self.env_index)


class UnsupportedSpaceError(FleetError):
    """An env's observation or action space that the algorithm cannot take (fleetrl/envs/spaces.py)."""


# extra name -> the pip packages it installs (kept in step with pyproject.toml)
EXTRAS = {
    "atari": "ale-py opencv-python-headless",
    "mujoco": "mujoco imageio",
    "envpool": "envpool",
    "multiagent": "pettingzoo mpe2 multi-agent-ale-py pymunk pygame tinyscaler",
    "video": "imageio imageio-ffmpeg pygame",
    "tune": "optuna cmaes pyyaml matplotlib 'psycopg[binary]'",
    "track": "wandb",
    "stats": "rliable 'arch<8' 'pandas<3'",
    "export": "onnx onnxruntime",
    "memory": "minigrid",
}


def require(module: str, extra: str, what: str):
    """Import an optional dependency, or fail with the exact `pip install` that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FleetError(
            f"{what} needs the '{extra}' extra, which is not installed ({exc}). "
            f"Install it with: pip install 'fleetrl[{extra}]'  (or: pip install {EXTRAS[extra]})"
        ) from None


def exit_on_error(command: Callable[..., Any], *args: Any) -> Any:
    """Run a command; bad input ends in its one paragraph on stderr and a non-zero exit, never a traceback
    (``fleetrl ...``, and an algorithm file's own command line, ``python my_ppo.py``)."""
    try:
        return command(*args)
    except FleetError as exc:
        if not exc.quiet:  # e.g. the other ranks of a torchrun job, whose rank 0 says it once
            print(f"fleetrl: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("fleetrl: interrupted", file=sys.stderr)
        sys.exit(130)
