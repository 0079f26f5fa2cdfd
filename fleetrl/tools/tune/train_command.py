"""The `fleetrl train ALGO ...` command a study tunes: its algorithm, the flags it fixes, and the arguments its runs train
with."""

from __future__ import annotations

import contextlib
import io
import shlex
from dataclasses import dataclass
from typing import Any

from fleetrl import config
from fleetrl.errors import FleetError
from fleetrl.tools.runs import has_flag, train_args

RUNNER_FIELDS = ("env_id", "seed", "run_dir", "resume")  # set by the tuner for every run (and --no-progress, unless given)
FIXED_FIELDS = ("total_timesteps",)  # the budget trials are compared at: set in the command, never tuned


@dataclass
class Algo:
    """The algorithm behind the training command: its flags (an ``Args`` dataclass) and their ranges."""

    name: str
    module: Any
    base: list[str]  # the training command after `--`, as given
    flags: list[str]  # its flags after ``fleetrl train ALGO``

    @property
    def args_type(self) -> type:
        return self.module.Args

    @property
    def ranges(self) -> dict[str, config.Range]:
        return getattr(self.module, "RANGES", {})


def parse_command(base: list[str]) -> Algo:
    """The algorithm of a ``fleetrl train ALGO ...`` command (a built-in, the user's file or module), refusing the flags the
    tuner sets itself."""
    from fleetrl.algos import source

    example = "fleetrl tune --env-ids CartPole-v1 --search space.yaml -- fleetrl train ppo --total-timesteps 100000"
    if not base:
        raise FleetError(f"`fleetrl tune` needs the training command after `--`, e.g. {example}")
    rest = train_args(base)
    if rest is None:
        raise FleetError(f"The command after `--` must be `fleetrl train ALGO [flags]` (the tuner reads and sets its flags); got {shlex.join(base)!r}. "
                         f"Example: {example}")
    if not rest or rest[0].startswith("-"):
        raise FleetError(f"The command after `--` needs an algorithm: a built-in (ppo, dqn, ...), your file (./my_algo.py) or module "
                         f"(got {rest[0] if rest else 'nothing'}). Example: {example}")
    given = [f"--{name.replace('_', '-')}" for name in RUNNER_FIELDS if command_sets(rest[1:], name)]
    if given:
        raise FleetError(f"Remove {', '.join(given)} from the command after `--`: the tuner sets --env-id, --seed and --run-dir for each run "
                         f"(--env-ids picks the envs, --num-seeds and --start-seed the seeds, --out the folders), and trials always start afresh.")
    module, _ = source.load(rest[0])  # the user named it: the tuner reads its flags and ranges
    return Algo(rest[0], module, list(base), rest[1:])


def command_sets(flags: list[str], name: str) -> bool:
    """Whether the flags set the field ``name``, in any spelling tyro takes (dashes or underscores, ``--no-`` for booleans)."""
    spellings = {name, name.replace("_", "-")}
    return any(has_flag(flags, f"--{prefix}{s}") for s in spellings for prefix in ("", "no-", "no_"))


def resolved_args(algo: Algo, env_id: str, extra: list[str] = ()) -> Any:
    """The arguments a run of the command on ``env_id`` trains with: its flags, then the env family's defaults."""
    import tyro

    from fleetrl.envs import env_family

    flags = [*algo.flags, *extra, "--env-id", env_id]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            parsed = tyro.cli(algo.args_type, args=flags, prog=f"fleetrl train {algo.name}")
    except SystemExit:
        # tyro's message, without its box and its help hint, as one line
        lines = [line.strip(" \u2502\u2500\u256d\u256e\u2570\u256f-") for line in said.getvalue().splitlines()]
        lines = [line for i, line in enumerate(lines) if line and not line.startswith("For full helptext")
                 and not any(later != line and later.startswith(line) for later in lines[i + 1:])]  # a title its message repeats
        message = " ".join(dict.fromkeys(lines))
        raise FleetError(f"The command after `--` is not a valid `fleetrl train {algo.name}` command ({message or 'tyro refused it'}): "
                         f"{shlex.join(algo.base)!r}. `fleetrl train {algo.name} --help` lists its flags.") from None
    return config.apply_family_defaults(parsed, getattr(algo.module, "FAMILY_DEFAULTS", {}), env_family(env_id).name) \
        if hasattr(algo.module, "FAMILY_DEFAULTS") else parsed
