"""What the *_vs_cleanrl.py harnesses of issue 36 share: a lockstep trace and its comparison, and CleanRL's script
run beside ``fleetrl train ALGO`` as subprocesses for speed and learning.

A lockstep harness records each loop as a :class:`Trace` and :func:`compare` says where two traces first part.
:func:`speed` and :func:`learn` run the two sides one at a time, alternating, one torch thread each, pinned with
``taskset -c --cpu``, with the same flags (:class:`Sides` names them). Speed: CleanRL's ``charts/SPS`` (steps over the
seconds since its loop began; fleetrl's is the same measure) and steps over the whole process's wall time, start-up
included. Learning: each run's TensorBoard folder goes to OUT/learn/SIDE/ENV/, and ``fleetrl compare`` reads them (a
run's score: the mean of its last 20 episodes' returns).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Trace:
    """What a loop did: every step's action, the global step of every optimiser step with its loss, and the global
    step of every target update. A global step is CleanRL's loop variable. ``final_params``: CleanRL's names."""

    actions: list[np.ndarray] = field(default_factory=list)
    update_steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    target_steps: list[int] = field(default_factory=list)
    final_params: dict[str, Any] = field(default_factory=dict)


def compare(ours: Trace, theirs: Trace) -> dict[str, str]:
    """Each record: "identical", or where the two first part."""
    verdicts = {}
    for name in ("actions", "update_steps", "losses", "target_steps"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        first = next((i for i, (x, y) in enumerate(zip(mine, other)) if not np.array_equal(x, y)), None)
        if first is None and len(mine) == len(other):
            verdicts[name] = f"identical ({len(mine):,})"
        else:
            verdicts[name] = f"fleetrl {len(mine):,}, cleanrl {len(other):,}, first differ at index {first}"
    keys = sorted(theirs.final_params)
    # raveled: CleanRL's buffers may come from the vector env's (1, A) bounds where fleetrl's come from one env's (A,)
    same = set(ours.final_params) == set(keys) and all(np.array_equal(ours.final_params[k].numpy().ravel(), theirs.final_params[k].numpy().ravel())
                                                       for k in keys)
    verdicts["final parameters"] = "identical" if same else f"differ ({sorted(set(ours.final_params) ^ set(keys))[:4]} unmatched)"
    return verdicts


def print_verdicts(title: str, verdicts: dict[str, str]) -> None:
    print(title)
    for name, verdict in verdicts.items():
        print(f"  {name:17s} {verdict}")


def gap(a: list, b: list, relative: bool) -> str:
    """Two lists of numbers or arrays: "identical (N)", or their largest difference, relative or absolute."""
    import torch

    if len(a) != len(b):
        return f"fleetrl {len(a)}, cleanrl {len(b)}"
    a_t = torch.cat([torch.as_tensor(x).flatten().double() for x in a]) if a else torch.zeros(0)
    b_t = torch.cat([torch.as_tensor(x).flatten().double() for x in b]) if b else torch.zeros(0)
    if a_t.shape != b_t.shape:
        return f"shapes differ: fleetrl {tuple(a_t.shape)}, cleanrl {tuple(b_t.shape)}"
    if torch.equal(a_t, b_t):
        return f"identical ({len(a)})"
    diff = (a_t - b_t).abs()
    if relative:
        diff = diff / b_t.abs().clamp_min(1e-12)
    return f"max {'relative' if relative else 'absolute'} difference {diff.max().item():.2e} ({len(a)})"


def both_roundings(title: str, compare: Callable[..., dict[str, str]]) -> dict[str, str]:
    """A lockstep of an actor-critic's update code, twice: ``compare(fleetrl_rounding=True)``, CleanRL's code given
    fleetrl's rounding of the advantages' normalisation and the log-probabilities, then ``compare(fleetrl_rounding=False)``."""
    verdicts = compare(fleetrl_rounding=True)
    print_verdicts(f"{title}; CleanRL's code given fleetrl's rounding of the advantages' normalisation and the log-probabilities:", verdicts)
    rounded = compare(fleetrl_rounding=False)
    print_verdicts("the same, CleanRL's code rounding its own way:", rounded)
    return {**verdicts, **{f"{name}, CleanRL's rounding": verdict for name, verdict in rounded.items()}}


def renamed(state: dict[str, dict], names: dict[str, str]) -> dict[str, Any]:
    """A fleetrl checkpoint's networks as one flat dict of CleanRL's parameter names (``names``: prefix -> prefix)."""
    flat = {}
    for part, tensors in state.items():
        for key, value in tensors.items():
            name = f"{part}.{key}"
            for ours, theirs in names.items():
                name = name.replace(ours, theirs) if name.startswith(ours) else name
            flat[name] = value
    return flat


# ============================================================================ subprocess runs: speed and learning
@dataclass(frozen=True)
class Sides:
    """The two commands: CleanRL's ``script`` and ``fleetrl train algo``, both given ``flags(env_id, opts)``."""

    algo: str
    script: str
    label: str  # CleanRL's file, for tables
    flags: Callable[[str, argparse.Namespace], list[str]]
    backend: str = "sync"  # fleetrl's --env-backend (CleanRL's scripts step a SyncVectorEnv, or EnvPool for Procgen)
    their_env_id: Callable[[str], str] = lambda env_id: env_id  # CleanRL's script's name for the env (EnvPool's ids)


def command(sides: Sides, side: str, env_id: str, seed: int, opts: argparse.Namespace, run_dir: str) -> tuple[list[str], dict]:
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "PYTHONPATH": f"{ROOT}:{HERE}"}
    budget = ["--env-id", env_id, "--seed", str(seed), "--total-timesteps", str(opts.steps), *sides.flags(env_id, opts), "--no-cuda"]
    if side == "cleanrl":
        env["CLEANRL_RUN_DIR"] = run_dir
        budget[1] = sides.their_env_id(env_id)
        return ["taskset", "-c", opts.cpu, sys.executable, sides.script, *budget], env
    return ["taskset", "-c", opts.cpu, sys.executable, "-m", "fleetrl", "train", sides.algo, *budget, "--no-progress",
            "--env-backend", sides.backend, "--torch-threads", str(opts.threads), "--run-dir", run_dir,
            *shlex.split(opts.fleetrl_flags)], env  # the user's flags last: the last of a repeated flag wins


def env_folder(env_id: str) -> str:
    """An env id as one folder name (``ALE/Breakout-v5`` -> ``ALE_Breakout-v5``)."""
    return env_id.replace("/", "_")


def run_one(sides: Sides, side: str, env_id: str, seed: int, opts: argparse.Namespace, kind: str, repeat: int = 0) -> dict:
    """One run (skipped if its result is on file): wall and CPU seconds, the in-loop SPS, the last 20 episodes' mean."""
    from fleetrl.monitor.tbread import read_scalars

    out = os.path.abspath(opts.out)
    folder = env_folder(env_id)
    flags = opts.fleetrl_flags if side == "fleetrl" else ""
    setup = (f"_t{opts.threads}" if opts.threads != 1 else "") + (f"_{zlib.crc32(flags.encode()):08x}" if flags else "")  # CleanRL's runs serve every flag set
    result_file = os.path.join(out, "results", f"{kind}_{side}_{folder}_{seed}_{opts.steps}_{opts.learning_starts}_{repeat}{setup}.json")
    if os.path.exists(result_file):
        return json.load(open(result_file))
    run_dir = os.path.join(out, kind, side, folder, f"{folder}__{sides.algo}__{seed}__{repeat}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    cmd, env = command(sides, side, env_id, seed, opts, run_dir)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd, open(os.path.join(out, "last_output.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{side} {env_id} seed {seed} failed ({shlex.join(cmd)}); its output: {os.path.join(out, 'last_output.log')}")
    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    result = {"side": side, "env_id": env_id, "seed": seed, "steps": opts.steps, "wall_s": wall,
              "cpu_s": usage.ru_utime + usage.ru_stime, "loop_sps": read_scalars(run_dir, "charts/SPS")[-1].value,
              "score": float(np.mean(returns[-20:])) if returns else float("nan"), "episodes": len(returns), "command": shlex.join(cmd)}
    os.makedirs(os.path.dirname(result_file), exist_ok=True)
    with open(result_file, "w") as f:
        json.dump(result, f)
    return result


def speed(sides: Sides, opts: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"cleanrl": [], "fleetrl": []}
    for repeat in range(opts.repeats):
        for side in (("cleanrl", "fleetrl") if repeat % 2 == 0 else ("fleetrl", "cleanrl")):  # alternating
            r = run_one(sides, side, opts.env_id, 1, opts, "speed", repeat)
            results[side].append(r)
            print(f"{side} repeat {repeat}: {r['loop_sps']:,.0f} SPS in the loop, {r['steps'] / r['wall_s']:,.0f} wall", flush=True)
    loop_base = np.median([r["loop_sps"] for r in results["cleanrl"]])
    wall_base = np.median([r["steps"] / r["wall_s"] for r in results["cleanrl"]])
    print(f"\n{opts.env_id}, {opts.steps:,} steps a run, flags {shlex.join(sides.flags(opts.env_id, opts))}, CleanRL's other "
          f"defaults, seed 1, medians of {opts.repeats}, alternating; one process at a time, {opts.threads} torch "
          f"thread(s) a side, taskset -c {opts.cpu}; fleetrl's extra flags: {opts.fleetrl_flags or 'none'}\n")
    print("| side | SPS in the loop (median) | runs | vs CleanRL | SPS, wall, start-up included (median) | vs CleanRL |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for side, runs in results.items():
        loop, wall = [r["loop_sps"] for r in runs], [r["steps"] / r["wall_s"] for r in runs]
        print(f"| {side} | {np.median(loop):,.0f} | {', '.join(f'{x:,.0f}' for x in loop)} | {np.median(loop) / loop_base:.2f}x | "
              f"{np.median(wall):,.0f} | {np.median(wall) / wall_base:.2f}x |")


def learn(sides: Sides, opts: argparse.Namespace) -> None:
    low, _, high = opts.seeds.partition("-")
    for i, seed in enumerate(range(int(low), int(high or low) + 1)):
        for side in (("fleetrl", "cleanrl") if i % 2 == 0 else ("cleanrl", "fleetrl")):
            r = run_one(sides, side, opts.env_id, seed, opts, "learn")
            print(f"{side} {opts.env_id} seed {seed}: last-20 mean {r['score']:.1f} ({r['episodes']} episodes), {r['wall_s'] / 60:.1f} min",
                  flush=True)
    out = os.path.abspath(opts.out)
    compare = [sys.executable, "-m", "fleetrl", "compare", os.path.join(out, "learn", "fleetrl", env_folder(opts.env_id)),
               os.path.join(out, "learn", "cleanrl", env_folder(opts.env_id)), "--labels", f"fleetrl {sides.algo}", f"CleanRL {sides.label}",
               "--out", os.path.join(out, "compare", env_folder(opts.env_id))]
    print(f"$ {shlex.join(compare)}", flush=True)
    subprocess.run(compare, check=True)


def parser(doc: str, env_id: str, steps: int, learning_starts: int, out: str) -> argparse.ArgumentParser:
    """The harnesses' command line: one of --lockstep, --speed, --learn, and their budget."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--lockstep", action="store_true")
    mode.add_argument("--speed", action="store_true")
    mode.add_argument("--learn", action="store_true")
    parser.add_argument("--env-id", default=env_id)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--learning-starts", type=int, default=learning_starts)
    parser.add_argument("--seed", type=int, default=1, help="for --lockstep")
    parser.add_argument("--seeds", default="1-10", help="for --learn: e.g. 1-10")
    parser.add_argument("--repeats", type=int, default=3, help="for --speed")
    parser.add_argument("--cpu", default="1", help="taskset -c for every run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads a side (OMP_NUM_THREADS, fleetrl's --torch-threads)")
    parser.add_argument("--fleetrl-flags", default="", help='more flags for fleetrl\'s side, after the harness\'s (e.g. --fleetrl-flags="--env-backend async")')
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", out))
    return parser
