"""The search space: a YAML file mapping `fleetrl train` flags to Optuna distributions, checked against the algorithm's
flags and ranges before any trial starts."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetrl.errors import FleetError, require
from fleetrl.tools.text import plural
from fleetrl.tools.tune.train_command import FIXED_FIELDS, RUNNER_FIELDS, Algo, command_sets

KINDS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}, "categorical": {"choices"}}


@dataclass(frozen=True)
class Param:
    """One tuned flag: its Optuna distribution, and how its value goes on the command line."""

    name: str  # the flag without its dashes ("learning-rate"): the Optuna parameter name
    field: str  # the Args field ("learning_rate")
    field_type: type  # int, float, bool or str
    kind: str  # float, int or categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.name, list(self.choices))

    def flags(self, value: Any) -> list[str]:
        if self.field_type is bool:
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", format_value(value)]

    def describe(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("field", "field_type") and v is not None and v is not False and v != ()}


def format_value(value: Any) -> str:
    """A value as a flag takes it: floats in full (``repr``), so the printed command trains exactly the trial's value."""
    return repr(value) if isinstance(value, float) else str(value)


def field_types(args_type: type) -> dict[str, tuple[type | None, bool]]:
    """Each field's plain type (int, float, bool, str; None for anything else) and whether it takes None."""
    found = {}
    for name, hint in typing.get_type_hints(args_type).items():
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        plain = [m for m in members if m is not type(None)]
        found[name] = (plain[0] if len(plain) == 1 and plain[0] in (int, float, bool, str) else None, type(None) in members)
    return found


def load_search_space(path: str, algo: Algo) -> list[Param]:
    """Read and check the YAML search space against the algorithm's flags and ranges: every problem is named at once,
    before any trial starts."""
    yaml = require("yaml", "tune", "Reading the --search YAML file")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FleetError(f"Cannot read the search space --search {path} ({exc.strerror or exc}). Give the path of a YAML file "
                         f"(docs/tuning.md shows one).") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError(f"The search space {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(spec, dict) or not spec:
        raise FleetError(f"The search space {path} must map flags to distributions, one per line, e.g. "
                         f"`learning-rate: {{type: float, low: 1.0e-5, high: 1.0e-3, log: true}}`; got {type(spec).__name__ if spec else 'nothing'}.")
    types = field_types(algo.args_type)
    params, problems = [], []
    for key, entry in spec.items():
        param, problem = _param(str(key), entry, types, algo)
        if problem:
            problems.append(f"{key}: {problem}")
        else:
            params.append(param)
    fields = [p.field for p in params]
    problems += [f"{f.replace('_', '-')}: given twice (with dashes and underscores)" for f in sorted({f for f in fields if fields.count(f) > 1})]
    if problems:
        raise FleetError(f"The search space {path} has {plural(len(problems), 'problem')}: " + " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
                         + f" Each entry is FLAG: {{type: float|int|categorical, ...}}; `fleetrl train {algo.name} --help` lists the flags, docs/tuning.md the format.")
    return params


def _param(key: str, entry: Any, types: dict, algo: Algo) -> tuple[Param | None, str | None]:
    name = key.strip().lstrip("-").replace("_", "-")
    field_name = name.replace("-", "_")
    if field_name not in types:
        close = difflib.get_close_matches(field_name, list(types), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(c.replace('_', '-') for c in close)}?" if close else f"see `fleetrl train {algo.name} --help`"
        return None, f"unknown flag --{name} for fleetrl train {algo.name} ({hint})."
    if field_name in (*RUNNER_FIELDS, "progress"):
        return None, f"--{name} is set by the tuner for each run, so it cannot be tuned."
    if field_name in FIXED_FIELDS:
        return None, f"--{name} is the budget every trial is compared at: set it in the command after `--`, not in the search space."
    if command_sets(algo.flags, field_name):
        return None, f"--{name} is also given in the command after `--`; remove it there (the tuner sets it for each trial)."
    ftype, optional = types[field_name]
    if ftype is None:
        return None, f"--{name} is not a number, boolean or string flag, so it cannot be tuned."
    if not isinstance(entry, dict):
        return None, f"expected a mapping like {{type: float, low: 0.1, high: 0.9}}, got {entry!r}."
    kind = entry.get("type")
    if kind not in KINDS:
        return None, f"type must be one of {', '.join(KINDS)}, got {kind!r}."
    unknown = sorted(set(entry) - KINDS[kind] - {"type"})
    if unknown:
        return None, f"{', '.join(map(str, unknown))} {'is' if len(unknown) == 1 else 'are'} not a key of a {kind} distribution (it takes {', '.join(sorted(KINDS[kind]))})."
    rule = algo.ranges.get(field_name)
    if kind == "categorical":
        return _categorical(name, field_name, ftype, optional, entry.get("choices"), rule)
    if ftype in (bool, str):
        return None, f"bad type: --{name} takes {'true or false' if ftype is bool else 'a string'}; use type: categorical with choices."
    if kind == "float" and ftype is int:
        return None, f"bad type: --{name} takes a whole number; use type: int (or categorical)."
    low, high = _number(entry.get("low"), kind), _number(entry.get("high"), kind)
    log, step = entry.get("log", False), entry.get("step")
    if low is None or high is None:
        what = "whole numbers" if kind == "int" else "numbers"
        return None, f"low and high must be {what}, got low {entry.get('low')!r}, high {entry.get('high')!r}."
    if not isinstance(log, bool):
        return None, f"log must be true or false, got {log!r}."
    if low >= high:
        return None, f"low ({low}) must be below high ({high})."
    if log and low <= 0:
        return None, f"a log distribution needs low > 0, got low {low}."
    if step is not None:
        step = _number(step, kind)
        if step is None or step <= 0:
            return None, f"step must be a positive {'whole ' if kind == 'int' else ''}number, got {entry.get('step')!r}."
        if log:
            return None, "step and log cannot be used together."
    for which, value in (("low", low), ("high", high)):
        refusal = rule.refusal(f"--{name}", value) if rule else None
        if refusal:
            return None, f"{which} {value} is refused by the trainer: {refusal}"
    return Param(name, field_name, ftype, kind, low, high, log, step), None


def _categorical(name: str, field_name: str, ftype: type, optional: bool, choices: Any, rule) -> tuple[Param | None, str | None]:
    if not isinstance(choices, list) or not choices:
        return None, f"choices must be a non-empty list, e.g. choices: [64, 128, 256]; got {choices!r}."
    fixed = []
    for choice in choices:
        value = choice
        if choice is None:
            if not optional:
                return None, f"choice null: --{name} does not take None."
        elif ftype is bool:
            if not isinstance(choice, bool):
                return None, f"bad type: --{name} takes true or false, got the choice {choice!r}."
        elif ftype is str:
            if not isinstance(choice, str):
                return None, f"bad type: --{name} takes a string, got the choice {choice!r}."
        else:
            value = _number(choice, "int" if ftype is int else "float")
            if value is None:
                return None, f"bad type: --{name} takes {'a whole number' if ftype is int else 'a number'}, got the choice {choice!r}."
            refusal = rule.refusal(f"--{name}", value) if rule else None
            if refusal:
                return None, f"the choice {choice!r} is refused by the trainer: {refusal}"
        fixed.append(value)
    return Param(name, field_name, ftype, "categorical", choices=tuple(fixed)), None


def _number(value: Any, kind: str) -> float | int | None:
    """A YAML number, or None. PyYAML reads ``1e-5`` (no dot) as a string: such strings are taken as numbers too."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind == "int":
        return int(value) if float(value).is_integer() else None
    return float(value)
