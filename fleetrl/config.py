"""Argument plumbing shared by the commands: defaults by env family, resume overrides, run folders, and the
range of every numeric flag, checked before anything starts."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from fleetrl.errors import FleetError

A = TypeVar("A")


FAMILY_WORDS = {"classic": "classic-control (discrete-action)", "atari": "Atari", "mujoco": "continuous-action (MuJoCo-style)",
                "procgen": "Procgen", "multiagent": "multi-agent (PettingZoo)", "multiagent-image": "multi-agent image (PettingZoo)"}
FAMILY_ALGOS = {"classic": "`fleetrl train ppo`, `dqn` or `sac_discrete`", "atari": "`fleetrl train ppo`, `dqn` or `sac_discrete`",
                "mujoco": "`fleetrl train sac`, `td3`, `ddpg` or `ppo`", "procgen": "`fleetrl train ppo`"}
# (PettingZoo games: the algorithms whose file says AGENT_ROWS = True, below)


def apply_family_defaults(args: A, table: dict[str, dict[str, Any]], family: str, algo: str = "") -> A:
    """Fill every field the user left unset (None) with the default for the env family; a family the
    algorithm has no defaults for (DQN on MuJoCo) is refused."""
    if family not in table:
        name = algo.upper() or "This algorithm"
        others = (agent_rows_commands(AGENT_ROWS_READER(algo, None)[1] if AGENT_ROWS_READER is not None else [])
                  if family.startswith("multiagent") else FAMILY_ALGOS.get(family, "`fleetrl train ppo`"))
        raise FleetError(f"{name} does not train {FAMILY_WORDS.get(family, family)} environments such as {args.env_id!r}: it has "
                         f"defaults and networks for {', '.join(FAMILY_WORDS.get(f, f) for f in table)} environments only. "
                         f"Train this env with {others}.")
    unset = {k: v for k, v in table[family].items() if getattr(args, k) is None}
    return dataclasses.replace(args, **unset)


# ---- PettingZoo games: which algorithms train agent rows ------------------------------------------------------------
# A game's agents are rows of the batch, and the row of an agent that has left the game is blank until the game ends
# (fleetrl/envs/multiagent.py). An algorithm trains such rows only if the live mask reaches everything that learns from
# them: its buffers, losses, normalisers and logged statistics. Each algorithm file says so in one line, AGENT_ROWS =
# True or False. The engine knows no algorithm, so the algorithms' package (fleetrl/algos/__init__.py) reads those lines
# for it: (whether the algorithm being trained says True, the built-ins that do). None: no algorithm package loaded.
AGENT_ROWS_READER: Callable[[str, dict | None], tuple[bool, list[str]]] | None = None


def check_agent_rows(env_id: str, family: str, algo: str, command: str, algorithm_file: dict[str, str] | None = None) -> None:
    """The one refusal of a PettingZoo game (``family`` multiagent*) by an algorithm whose file does not say that it trains
    agent rows. ``command`` trains the algorithm (``fleetrl train ALGO`` or the user's own), ``algorithm_file`` is the
    user's file this process trains (:func:`fleetrl.run_setup.training_code`), if any."""
    if not family.startswith("multiagent"):
        return
    declared, accepting = AGENT_ROWS_READER(algo, algorithm_file) if AGENT_ROWS_READER is not None else (False, [])
    if declared:
        return
    raise FleetError(f"`{command}` does not train PettingZoo games such as {env_id!r}: each agent of a game is a row of the batch, "
                     f"and the row of an agent that has left the game is blank until the game ends, so an algorithm must keep "
                     f"those rows out of its buffers, losses and normalisers, and its file must say it does (AGENT_ROWS = True). "
                     f"Train this game with {agent_rows_commands(accepting)}.")


def agent_rows_commands(accepting: list[str]) -> str:
    """How to train a PettingZoo game: the built-ins that train agent rows, or a copy of one."""
    if not accepting:
        return "an algorithm whose file says AGENT_ROWS = True (docs/multi-agent.md)"
    return (" or ".join(f"`fleetrl train {name}`" for name in accepting) + f" (one network for every agent, docs/multi-agent.md), "
            f"or your copy of {'it' if len(accepting) == 1 else 'one'}: `fleetrl new my_{accepting[0]} --from {accepting[0]}`")


def explicit_fields(argv: Iterable[str], args_type: type) -> set[str]:
    """The dataclass fields given on the command line (``--learning-rate 1e-3``, ``--no-anneal-lr``, ...)."""
    names = {f.name for f in dataclasses.fields(args_type)}
    given = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        flag = token[2:].split("=", 1)[0].replace("-", "_")
        if flag.startswith("no_") and flag[3:] in names:
            flag = flag[3:]
        if flag in names:
            given.add(flag)
    return given


def fields_differing_from_default(args: Any) -> set[str]:
    """For calls from Python: the fields whose value is not the dataclass default."""
    return {f.name for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING and getattr(args, f.name) != f.default}


def merge_resumed_args(args: A, saved: dict[str, Any], explicit: set[str]) -> A:
    """A resumed run keeps its saved arguments; flags given again now (e.g. a larger
    ``--total-timesteps``) win over them."""
    known = {f.name for f in dataclasses.fields(args)}
    restored = {k: v for k, v in saved.items() if k in known and k not in explicit}
    return dataclasses.replace(args, **restored)


def path_safe(env_id: str) -> str:
    """An env id as it appears in run folder names: '/' (ALE ids) and ':' (custom ids) become '-'."""
    return env_id.replace("/", "-").replace(":", "-")


def default_run_dir(env_id: str, exp_name: str, seed: int) -> str:
    """``runs/{env_id}__{exp_name}__{seed}__{timestamp}`` (CleanRL's name), the env id made :func:`path_safe`."""
    return os.path.join("runs", f"{path_safe(env_id)}__{exp_name}__{seed}__{int(time.time())}")


# ---- what each numeric flag accepts -------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """What a numeric flag accepts: always a finite number, within ``[low, high]`` (``low_open``: strictly
    above ``low``), a whole number with ``integer``; ``optional`` lets None (unset) through."""

    meaning: str  # shown in the error, in parentheses: what the flag is for
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False
    optional: bool = False
    hint: str = ""  # a sentence after the error, e.g. how to turn the feature off

    def bounds(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"
        if self.low is not None:
            return f"{'above' if self.low_open else 'at least'} {_num(self.low)}"
        return f"at most {_num(self.high)}" if self.high is not None else ""

    def refusal(self, flag: str, value: Any) -> str | None:
        """The sentence that refuses ``value`` for ``flag``, or None if it is accepted."""
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            kind = "a whole number" if self.integer else "a number"
        elif not math.isfinite(value):
            kind = "" if self.low is not None and self.high is not None else "a finite number"  # [a, b] says it all
        elif (self.low is None or (value > self.low if self.low_open else value >= self.low)) and (self.high is None or value <= self.high):
            return None
        else:
            kind = ""
        accepted = ", ".join(part for part in (kind, self.bounds()) if part)
        return f"{flag} must be {accepted} ({self.meaning}), got {value!r}." + (f" {self.hint}" if self.hint else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


# A loss coefficient meets float32 tensors (largest 3.4e38): past this it can only overflow, never change the run more.
COEF_MAX = 1e30


def positive(meaning: str, high: float | None = None, optional: bool = False, hint: str = "") -> Range:
    return Range(meaning, low=0, high=high, low_open=True, optional=optional, hint=hint)


def non_negative(meaning: str, high: float | None = None) -> Range:
    return Range(meaning, low=0, high=high)


def fraction(meaning: str, optional: bool = False) -> Range:
    """A probability or a weight in [0, 1]."""
    return Range(meaning, low=0, high=1, optional=optional)


def count(meaning: str, low: int = 1, high: int | None = None, optional: bool = False, hint: str = "") -> Range:
    return Range(meaning, low=low, high=high, integer=True, optional=optional, hint=hint)


SEED = count("the random seed; numpy and the env backends take seeds below 2**31", low=0, high=2**31 - 1)


def check_ranges(args: Any, rules: dict[str, Range]) -> None:
    """Refuse every field of ``args`` outside its rule, in one paragraph that names each flag and its range."""
    problems = [rule.refusal(f"--{name.replace('_', '-')}", getattr(args, name)) for name, rule in rules.items()]
    problems = [p for p in problems if p]
    if problems:
        raise FleetError(" ".join(problems))


def divisors(n: int, most: int = 8) -> list[int]:
    """The smallest divisors of ``n``, for error messages that suggest a value (a bounded search: ``n`` can be huge)."""
    return [d for d in range(1, min(n, 4096) + 1) if n % d == 0][:most]
