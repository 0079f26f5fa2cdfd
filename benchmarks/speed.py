"""Training and env speed, side by side on this machine: `python benchmarks/speed.py WHAT [flags]` (each WHAT has --help).
Every contender runs in its own process (fresh threads and caches), sides alternate within each repeat, and tables give
medians with every repeat listed (bench.py).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import HERE, ROOT, add_flags, alternate, emit, env_with_path, fmt, host_line, med, median_us, run_process, table, train, tree_cpu_seconds

HELP = {
    "ppo": "fleetrl train ppo against a plain CleanRL-style loop (benchmarks/cleanrl/loops/ppo.py), and the overlap modes",
    "offpolicy": "fleetrl's DQN, SAC and TD3 against CleanRL's loops (benchmarks/cleanrl/loops/offpolicy.py), the learning phase only",
    "train": "any `fleetrl train` commands (variants, or one command from an earlier commit): SPS, phases, CPU",
    "envs": "env stepping only (random actions, `fleetrl bench-env`'s measurement) for preset rows of backends and plans",
    "threads": "PPO by torch threads x env workers, the overlap of sampling and learning, OpenMP's wait policy",
    "make-vec": "CleanRL's own ppo.py / ppo_atari.py with make_vec against gymnasium's vector envs; their env share",
    "scaling": "data-parallel PPO under torchrun, weak scaling",
    "tune": "`fleetrl tune`: parallel trials, pruning, tuned against defaults, a killed tuner's runs"}
BUSY, SLEEP, STRAGGLER = "ppo_speed_envs:BusyWait200us-v0", "ppo_speed_envs:Sleep200us-v0", "ppo_speed_envs:Straggler-v0"
WAIT, SOCKET = "ppo_speed_envs:Sleep5ms-v0", "ppo_speed_envs:SocketSim-v0"
BREAKOUT = "BreakoutNoFrameskip-v4"


# ============================================================================ ppo and offpolicy: a clock in the run
@dataclass(frozen=True)
class Variant:
    name: str
    side: str  # "fleetrl" or "plain"
    algo: str  # ppo, ppo_lstm, dqn, sac, td3
    env_id: str
    flags: tuple[str, ...] = ()  # fleetrl's flags
    baseline: str | None = None
    target: float | None = None  # the ratio to the baseline its issue asked for


@dataclass
class Scenario:
    title: str
    length: int  # PPO: iterations a run; off-policy: env steps a run
    quick: int
    variants: list[Variant]
    learning_starts: int = 0


def ppo_scenarios(extra: list[tuple[str, tuple[str, ...]]]) -> dict[str, Scenario]:
    atari, classic = ("--num-envs", "8", "--num-steps", "128"), ("--num-envs", "4", "--num-steps", "128")
    slow = ("--env-backend", "async", "--num-envs", "8", "--num-steps", "128")
    plain = "plain CleanRL-style loop"

    def against_plain(env_id: str, fixed: tuple[str, ...]) -> list[Variant]:
        return [Variant(plain, "plain", "ppo", env_id), Variant("fleetrl (defaults)", "fleetrl", "ppo", env_id, fixed, plain, 3.0),
                *[Variant(f"fleetrl {n}", "fleetrl", "ppo", env_id, fixed + f, plain) for n, f in extra]]

    def against_gym_async(env_id: str, shape: tuple[str, ...]) -> list[Variant]:
        gym_async = "plain loop on gymnasium AsyncVectorEnv"
        return [Variant(gym_async, "plain", "ppo", env_id, shape), Variant("fleetrl (defaults)", "fleetrl", "ppo", env_id, shape, gym_async, 1.5),
                Variant("fleetrl --policy-lag 1", "fleetrl", "ppo", env_id, shape + ("--policy-lag", "1"), gym_async)]

    lag = []
    for how, env_id in (("busy-wait", BUSY), ("sleep", SLEEP)):
        serial = f"{how}, serial loop (--async-batch 8)"  # every env then every action, in turn: no overlap at all
        lag += [Variant(serial, "fleetrl", "ppo", env_id, slow + ("--policy-lag", "0", "--async-batch", "8")),
                Variant(f"{how}, split (the default)", "fleetrl", "ppo", env_id, slow + ("--policy-lag", "0"), serial),
                Variant(f"{how}, --policy-lag 1", "fleetrl", "ppo", env_id, slow + ("--policy-lag", "1"), serial, 1.4)]
    straggle = slow + ("--async-batch", "4")
    return {
        "breakout": Scenario("PPO Breakout, CleanRL's Atari defaults (8 envs x 128 steps)", 10, 3, against_plain(BREAKOUT, atari)),
        "cartpole": Scenario("PPO CartPole-v1, CleanRL's defaults (4 envs x 128 steps)", 40, 5, against_plain("CartPole-v1", classic)),
        "slow-env-lag": Scenario("PPO on a 200 us/step Python env, 8 x 128, async: policy lag 1 against serial", 16, 3, lag),
        "straggler": Scenario("8 busy-wait envs, --async-batch 4: one env 10x slower against all fast", 16, 3,
                              [Variant("all envs fast", "fleetrl", "ppo", BUSY, straggle),
                               Variant("one env 10x slower", "fleetrl", "ppo", STRAGGLER, straggle, "all envs fast", 0.7)]),
        "breakout-lstm": Scenario("PPO-LSTM Breakout against CleanRL's ppo_atari_lstm.py loop (8 x 128)", 6, 2,
                                  [Variant(plain, "plain", "ppo_lstm", BREAKOUT),
                                   Variant("fleetrl ppo_lstm (defaults)", "fleetrl", "ppo_lstm", BREAKOUT, atari, plain, 1.5)]),
        "wait-envs": Scenario("PPO on 64 envs whose step sleeps 5 ms, 64 x 32, MLP", 16, 3,
                              against_gym_async(WAIT, ("--num-envs", "64", "--num-steps", "32"))),
        "socket-sim": Scenario("PPO on 16 envs talking over TCP to a simulator server (~0.2 ms a step), 16 x 128", 12, 3,
                               against_gym_async(SOCKET, ("--num-envs", "16", "--num-steps", "128"))),
    }


def offpolicy_scenarios(flags: tuple[str, ...]) -> dict[str, Scenario]:
    # budgets for ~10 minutes on 2 quiet cores with 3 repeats; SAC and TD3 on HalfCheetah (no early termination)
    return {algo: Scenario(f"{algo.upper()} on {env}, CleanRL's hyperparameters on both sides", steps, quick,
                           [Variant("plain CleanRL loop", "plain", algo, env),
                            Variant("fleetrl", "fleetrl", algo, env, flags, "plain CleanRL loop", 2.0)], learning_starts=1000)
            for algo, env, steps, quick in (("dqn", "CartPole-v1", 40_000, 4_000), ("sac", "HalfCheetah-v5", 4_000, 1_200),
                                            ("td3", "HalfCheetah-v5", 6_000, 1_500))}


def child(spec: dict) -> None:
    """One run in this process: the clock marked at every iteration's end (steps done, time), the process tree's CPU read
    where the timed window opens and ends (walking the tree costs milliseconds, so only there)."""
    import psutil
    import torch

    marks, cpu, seen = [], {}, {}

    def mark(step: int) -> None:
        marks.append((int(step), time.time()))
        if step == spec["window_from"] or step >= spec["total"]:
            cpu["from" if step == spec["window_from"] else "end"] = tree_cpu_seconds()

    (run_plain if spec["side"] == "plain" else run_fleetrl)(spec, mark, seen)
    seen.setdefault("threads", torch.get_num_threads())
    emit({"marks": marks, "cpu": cpu, "process_start": psutil.Process().create_time(), **seen, **spec})


def run_plain(spec: dict, mark, seen: dict) -> None:
    import torch

    if spec["algo"] not in ("ppo", "ppo_lstm"):
        from loops import offpolicy as plain_offpolicy

        device = "cuda" if spec["cuda"] and torch.cuda.is_available() else "cpu"
        if spec["plain_threads"]:
            torch.set_num_threads(spec["plain_threads"])
        spec["total"], spec["window_from"] = spec["length"], spec["window_from_step"]
        seen["threads"] = plain_offpolicy.PLAIN[spec["algo"]](spec["env_id"], spec["length"], spec["learning_starts"], seed=1,
                                                              device=device, on_mark=mark).torch_threads
        return
    from loops.ppo import BREAKOUT as ATARI, CARTPOLE, PlainSpec, plain_ppo
    from loops.ppo_lstm import BREAKOUT_LSTM, plain_ppo_lstm

    run, plain = plain_ppo, {BREAKOUT: ATARI, "CartPole-v1": CARTPOLE}.get(spec["env_id"])
    if spec["algo"] == "ppo_lstm":
        run, plain = plain_ppo_lstm, BREAKOUT_LSTM
    elif plain is None:  # a benchmark env on gymnasium's AsyncVectorEnv, the batch shape of the fleetrl side
        importlib.import_module(spec["env_id"].split(":")[0])
        shape = dict(zip(spec["flags"][::2], spec["flags"][1::2]))
        plain = PlainSpec(spec["env_id"].split(":")[1], num_envs=int(shape["--num-envs"]), num_steps=int(shape["--num-steps"]), vector="async")
        torch.set_num_threads(1)  # its stronger setting: 2 spinning intra-op threads compete with the env processes
    batch = plain.num_envs * plain.num_steps
    spec["total"], spec["window_from"] = spec["length"] * batch, spec["warmup"] * batch

    def iteration(seconds: float) -> None:
        seen.setdefault("start", time.time() - seconds)
        mark(batch * (len(seen.setdefault("iterations", [])) + 1))
        seen["iterations"].append(seconds)

    run(replace(plain, num_iterations=spec["length"], cuda=spec["cuda"]), on_iteration=iteration)


def run_fleetrl(spec: dict, mark, seen: dict) -> None:
    import torch
    import tyro

    from fleetrl import config
    from fleetrl.errors import FleetError
    from fleetrl.monitor import trainlog

    module = importlib.import_module(f"fleetrl.algos.{spec['algo']}")
    start_clock, iteration = trainlog.TrainLog.start_clock, trainlog.TrainLog.iteration

    def started(self, step: int) -> None:  # SPS counts from its last call before the first iteration
        seen["start"] = time.time()
        start_clock(self, step)

    def marked(self, step: int, *args, **kwargs):  # at the entry: the final checkpoint stays out of the window
        mark(step)
        seen["threads"] = torch.get_num_threads()
        return iteration(self, step, *args, **kwargs)

    trainlog.TrainLog.start_clock, trainlog.TrainLog.iteration = started, marked
    with tempfile.TemporaryDirectory() as run_dir:
        argv = [*spec["flags"], "--env-id", spec["env_id"], "--run-dir", run_dir, "--no-progress", "--checkpoint-every",
                "1000000000", "--cuda" if spec["cuda"] else "--no-cuda"]
        args = tyro.cli(module.Args, args=argv)
        explicit = config.explicit_fields(argv, module.Args) | {"total_timesteps"}
        if spec["algo"] in ("ppo", "ppo_lstm"):
            if args.num_envs is None or args.num_steps is None:
                raise SystemExit("speed.py: give --num-envs and --num-steps in the fleetrl flags, so the run's length is known")
            batch = args.num_envs * args.num_steps
            args.total_timesteps = spec["length"] * batch
            spec["total"], spec["window_from"] = args.total_timesteps, spec["warmup"] * batch
        else:  # the plain loop's hyperparameters (CleanRL's), given explicitly, so both sides surely run the same ones
            from loops import offpolicy as plain_offpolicy

            hyper = {k: v for k, v in asdict(plain_offpolicy.ARGS[spec["algo"]]()).items() if k not in explicit}
            unknown = sorted(set(hyper) - set(vars(args)))
            if unknown:
                raise SystemExit(f"{', '.join(unknown)}: hyperparameters of the plain loop that fleetrl.algos.{spec['algo']}.Args lacks")
            vars(args).update(hyper, total_timesteps=spec["length"], learning_starts=spec["learning_starts"], seed=1)
            explicit |= set(hyper) | {"learning_starts", "seed"}
            spec["total"], spec["window_from"] = spec["length"], spec["window_from_step"]
        try:
            module.train(args, explicit=explicit)
        except FleetError as exc:  # the one clear paragraph the CLI would print, not a traceback
            raise SystemExit(f"fleetrl: error: {exc}") from None


def measure(variant: Variant, spec: dict, timeout: float) -> dict:
    """One run of ``variant`` in a fresh process: SPS over the window, CPU per 1M steps, cores busy, start-up, warm-up."""
    with tempfile.TemporaryDirectory(prefix="speed_") as tmp:
        done = run_process([sys.executable, __file__, "--child", json.dumps({**asdict(variant), **spec})], cwd=tmp, check=False,
                           timeout=timeout, env=env_with_path(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor")))
    raw = done["result"]
    if done["rc"] != 0 or raw is None:
        return {"ok": False, "error": "\n".join((done["stderr"] or done["stdout"]).strip().splitlines()[-12:])}
    marks, start = dict(raw["marks"]), raw.get("start")
    if raw["window_from"] not in marks or raw["total"] not in marks:
        return {"ok": False, "error": f"the marks {sorted(marks)[:3]}... do not cover steps {raw['window_from']}..{raw['total']}"}
    steps, seconds = raw["total"] - raw["window_from"], marks[raw["total"]] - marks[raw["window_from"]]
    used = raw["cpu"]["end"] - raw["cpu"]["from"] if {"from", "end"} <= set(raw["cpu"]) else None
    return {"ok": True, "sps": steps / seconds, "cpu_per_1m": used and used / steps * 1e6, "cores": used and used / seconds,
            "startup": start and start - raw["process_start"], "warmup": start and marks[raw["window_from"]] - start,
            "threads": raw.get("threads")}


def side_by_side(opts: argparse.Namespace, scenarios: dict[str, Scenario], spec_of) -> None:
    print(host_line(), flush=True)
    for name in opts.scenarios.split(","):
        if name not in scenarios:
            raise SystemExit(f"unknown {name!r}; choose from {', '.join(scenarios)}")
        s = scenarios[name]
        spec = {"cuda": opts.cuda, "plain_threads": getattr(opts, "plain_threads", None), **spec_of(s)}
        by_name = {v.name: v for v in s.variants}
        runs = alternate(by_name, opts.repeats, lambda n, _: measure(by_name[n], spec, opts.timeout),
                         lambda n, m: f"{m['sps']:,.0f} SPS" if m["ok"] else "FAILED")
        sps = {n: med(m["sps"] for m in r if m["ok"]) for n, r in runs.items()}
        rows, notes = [], []
        for v in s.variants:
            ok = [m for m in runs[v.name] if m["ok"]]
            ratio = sps[v.name] / sps[v.baseline] if v.baseline and sps[v.name] and sps[v.baseline] else None
            rows.append([v.name, fmt(sps[v.name]), ", ".join(fmt(m["sps"]) if m["ok"] else "FAILED" for m in runs[v.name]),
                         "1.00x (baseline)" if not v.baseline else fmt(ratio, ".2f") + "x", fmt(med(m["cpu_per_1m"] for m in ok)),
                         fmt(med(m["cores"] for m in ok), ".2f"), fmt(med(m["startup"] for m in ok), ".1f"),
                         fmt(med(m["warmup"] for m in ok), ".1f"), fmt(med(m["threads"] for m in ok))])
            if v.target and ratio:
                notes.append(f"- Target: {v.name} >= {v.target}x {v.baseline}: **{ratio:.2f}x**, {'met' if ratio >= v.target else 'NOT met'}.")
            notes += [f"- FAILED: {v.name} (`{shlex.join(v.flags)}`):\n```\n{m['error']}\n```" for m in runs[v.name] if not m["ok"]][:1]
        print(f"\n### {name}: {s.title}\n\n" + table(["variant", "SPS (median)", "SPS (repeats)", "vs baseline", "CPU-s per 1M steps",
                                                    "cores busy", "start-up s", "warm-up s", "torch threads"], rows) + "\n\n" + "\n".join(notes))


def cmd_ppo(opts: argparse.Namespace) -> None:
    extra = [(n.strip(), tuple(shlex.split(f))) for n, _, f in (item.partition("=") for item in opts.variants.split(";") if item.strip())]
    if opts.warmup < 1:  # the window opens at an iteration's end: the only place a run lets us look
        raise SystemExit("--warmup must be at least 1")
    with contextlib.ExitStack() as stack:
        if "socket-sim" in opts.scenarios:
            from ppo_speed_envs import running_server

            stack.enter_context(running_server())
        side_by_side(opts, ppo_scenarios(extra), lambda s: {"length": opts.iterations or (s.quick if opts.quick else s.length),
                                                            "warmup": opts.warmup})


def cmd_offpolicy(opts: argparse.Namespace) -> None:
    def spec(s: Scenario) -> dict:
        steps, starts = opts.steps or (s.quick if opts.quick else s.length), opts.learning_starts or (500 if opts.quick else s.learning_starts)
        window_from = -(-(starts + opts.warmup) // 100) * 100  # rounded up to a block of 100 steps: both sides mark there
        if steps % 100 or window_from >= steps:
            raise SystemExit(f"--steps {steps}: give a multiple of 100 beyond --learning-starts + --warmup ({window_from})")
        return {"length": steps, "learning_starts": starts, "window_from_step": window_from, "warmup": 0}

    side_by_side(opts, offpolicy_scenarios(tuple(shlex.split(opts.flags))), spec)


# ============================================================================ train: `fleetrl train` commands side by side
PHASES = ("env", "inference", "learn", "wait", "comm")
TRAIN_PRESETS = {  # name: (variants, the command they vary)
    "lag": ("serial=--policy-lag 0 --async-batch 8;split=--policy-lag 0;lag 1=--policy-lag 1", f"ppo --env-id {SLEEP} --env-backend async "
            "--num-envs 8 --num-steps 128 --total-timesteps 17408 --torch-threads 1 --no-cuda"),
    "backends": (";".join(f"{b}=--env-backend {b}" for b in ("sync", "async", "ale", "envpool")), f"ppo --env-id {BREAKOUT} --total-timesteps 4096 --no-cuda"),
    "checkouts": ("", "ppo --env-id CartPole-v1 --total-timesteps 20992 --no-cuda")}


def cmd_train(opts: argparse.Namespace) -> None:
    preset = TRAIN_PRESETS[opts.preset or "checkouts"]
    common, trees, cwd = opts.command or shlex.split(preset[1]), {}, None
    with tempfile.TemporaryDirectory(prefix="speed_train_") as tmp:
        if opts.before:
            added = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", f"{tmp}/before", opts.before], capture_output=True, text=True)
            if added.returncode:
                raise SystemExit(f"--before {opts.before!r}: git could not check it out ({added.stderr.strip()}); give a commit of this repository.")
            trees = {f"before ({opts.before})": f"{tmp}/before", "this checkout": ROOT}
            variants = {name: common for name in trees}
        elif opts.user_file:
            from fleetrl.tools.new import template

            Path(tmp, "my_ppo.py").write_text(template("ppo", "my_ppo"))
            variants, cwd = {"fleetrl train ppo": ["ppo", *common], "fleetrl train ./my_ppo.py": ["./my_ppo.py", *common]}, tmp
        else:
            variants = {n.strip(): [*common, *shlex.split(f)] for n, _, f in (v.partition("=") for v in (opts.variants or preset[0]).split(";") if v.strip())}
        tags = ("charts/SPS", "charts/SPS_window", *(f"perf/{p}_time" for p in PHASES))
        try:
            runs = alternate(variants, opts.repeats, lambda n, _: train(variants[n], tags, tree=trees.get(n, ROOT), cwd=cwd),
                             lambda n, r: f"{r['charts/SPS'][-1]:,.0f} SPS" if "failed" not in r else f"FAILED {r['failed']}")
        finally:
            if opts.before:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", f"{tmp}/before"], capture_output=True)
    steps = int(common[common.index("--total-timesteps") + 1]) if "--total-timesteps" in common else None
    rows, first = [], None
    for name, rs in runs.items():
        ok = [r for r in rs if "failed" not in r]
        if not ok:
            rows.append([name, "FAILED: " + " ".join(rs[0]["failed"])] + [""] * (6 + len(PHASES)))
            continue
        end = med(r["charts/SPS"][-1] for r in ok)
        phase = {p: med(med(r[f"perf/{p}_time"][opts.skip:]) for r in ok) for p in PHASES}  # logged at most once a second
        first = first or (end, phase)
        rows.append([name, fmt(end), ", ".join(fmt(r["charts/SPS"][-1]) for r in ok), f"{end / first[0]:.2f}x",
                     fmt(med(med(r["charts/SPS_window"][opts.skip:]) for r in ok)), fmt(steps and med(steps / r["cpu"] for r in ok)),
                     *[fmt(phase[p] and phase[p] * 1e3, ".1f") for p in PHASES],
                     fmt(phase["learn"] and phase["learn"] / sum(v or 0 for v in phase.values()), ".0%")])
    print(f"\n{host_line()}\n`fleetrl train {shlex.join(common)}` and each variant, medians of {opts.repeats}; SPS at the end is CleanRL's "
          f"(since training began); window SPS and phases (ms an iteration) leave out the first {opts.skip} iterations\n")
    print(table(["variant", "SPS at the end", "runs", "vs first", "window SPS", "steps per CPU s (start-up included)",
                 *[f"{p} ms" for p in PHASES], "learn share"], rows))
    if first and None not in (first[1]["env"], first[1]["inference"], first[1]["learn"]):
        rollout, learn = first[1]["env"] + first[1]["inference"], first[1]["learn"]
        print(f"\nThe first variant's rollout takes {rollout * 1e3:.1f} ms and its update {learn * 1e3:.1f} ms: overlapping them "
              f"perfectly gives at most {(rollout + learn) / max(rollout, learn, 1e-9):.2f}x.")


# ============================================================================ envs: stepping only
def env_presets() -> dict[str, list[tuple]]:
    """(env id, envs, backend, workers, threads, async batch); each env id and count's first row is its baseline."""
    def waiting(counts, hand):
        return [row for n in counts for row in [(WAIT, n, "gym-async", None, None, None), (WAIT, n, "async", None, None, None),
                                                 *[(WAIT, n, "async", w, t, None) for w, t in hand.get(n, [])]]]

    return {"wait": waiting((32, 64, 128), {64: [(2, 32), (4, 16), (64, 1)], 128: [(2, 64), (8, 16)]})
            + [(SOCKET, 16, "gym-async", None, None, None), (SOCKET, 16, "async", None, None, None), (SOCKET, 16, "async", 2, 8, None),
               (SOCKET, 16, "async", 16, 1, None)],
            "wait-quick": waiting((32, 128), {}),
            "busy": [(BUSY, 8, "gym-sync", None, None, None), (BUSY, 8, "gym-async", None, None, None), (BUSY, 8, "async", 2, 1, None),
                     (STRAGGLER, 8, "async", 8, 1, 4), (BUSY, 8, "async", 8, 1, 4)],
            "ale": [(BREAKOUT, 8, "ale-raw", None, None, None), (BREAKOUT, 8, "ale", None, None, None)]}


def step_ale_raw(env_id: str, num_envs: int, seconds: float) -> tuple[float, float | None, float | None]:
    """ale-py's AtariVectorEnv stepped directly: the one fleetrl's ale backend wraps, with the same settings."""
    import numpy as np

    from fleetrl.envs.native import AleVectorEnv

    envs, rng = AleVectorEnv(env_id, num_envs, training=True), np.random.default_rng(0)
    try:
        envs.reset(seed=0)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs._pools[0].step(rng.integers(0, int(envs.single_action_space.n), num_envs))  # one pool: no --async-batch
            steps += num_envs
        return steps / (time.perf_counter() - start), None, None
    finally:
        envs.close()


def cmd_envs(opts: argparse.Namespace) -> None:
    from ppo_speed_envs import running_server  # and registers the benchmark envs

    from fleetrl.cores import cores
    from fleetrl.envs import env_family
    from fleetrl.envs.stepping import plan_stepping
    from fleetrl.tools.bench_env import measure as measure_env

    rows = env_presets()[opts.preset]
    name = lambda r: f"{r[0]} x{r[1]} {r[2]}" + (f" {r[3]}x{r[4]}" if r[3] else "") + (f" batch {r[5]}" if r[5] else "")  # noqa: E731
    with running_server() if any(r[0] == SOCKET for r in rows) else contextlib.nullcontext():
        plans = {name(r): plan_stepping(r[0], env_family(r[0]), r[1], cores().usable, workers=r[3], threads=r[4], async_batch=r[5])
                 for r in rows if r[2] == "async"}
        by_name = {name(r): r for r in rows}
        def step(n: str, _) -> tuple:
            env_id, num_envs, backend, _, _, batch = by_name[n]
            try:
                return (step_ale_raw(env_id, num_envs, opts.seconds) if backend == "ale-raw" else
                        measure_env(env_id, backend, num_envs, opts.seconds, async_batch=batch, stepping=plans.get(n)))
            except Exception as exc:  # noqa: BLE001  (a row that fails is reported, and the rest go on)
                print(f"FAILED: {n}: {exc}", file=sys.stderr, flush=True)
                return math.nan, None, None

        runs = alternate(by_name, opts.repeats, step, lambda n, m: f"{m[0]:,.0f} steps/s")
    rate = {n: [med(m[i] for m in runs[n]) for i in range(3)] for n in runs}
    out, base = [], {}
    for r in rows:
        n = name(r)
        first = base.setdefault(r[:2], rate[n][0])
        shape = f"{plans[n].workers} x {plans[n].threads}" if n in plans else "-"
        out.append([r[1], r[0], r[2], shape, r[5] or "-", fmt(rate[n][0]), f"{rate[n][0] / first:.2f}x", fmt(rate[n][1]), fmt(rate[n][2]),
                    ", ".join(fmt(m[0]) for m in runs[n])])
    print(f"\n{host_line()}\nenv steps/s with random actions, medians of {opts.repeats} x {opts.seconds:g} s; CPU % and RSS of the "
          f"process tree\n\n" + table(["envs", "env", "backend", "workers x threads", "async batch", "steps/s", "vs the first row",
                                       "CPU %", "tree RSS MB", "runs"], out))
    if opts.preset.startswith("wait"):
        at = {n: rate[name((WAIT, n, "async", None, None, None))] for n in (32, 128)}
        print(f"\n- Target: 128 envs >= 3.2x the rate at 32: **{at[128][0] / at[32][0]:.2f}x**; tree RSS at 128 <= 3 GB: "
              f"**{(at[128][2] or math.nan) / 1024:.2f} GB**.")


# ============================================================================ threads: the measurements behind the thread plan
GRID = [("cartpole", "CartPole-v1", "sync", 4, 12), ("busy", BUSY, "async", 8, 8), ("breakout-ale", BREAKOUT, "ale", 8, 2),
        ("breakout-async", BREAKOUT, "async", 8, 2)]  # group, env id, backend, envs, iterations (the first left out)


def overlap_child(torch_threads: int, seconds: float) -> dict:
    """--policy-lag 1 emulated: Breakout x8 sampled (ale + Nature CNN acting) in a thread beside the learner (16 minibatches
    of 256 an iteration); each side's rate beside the other and alone gives the iteration's SPS overlapped and serial."""
    import threading

    import numpy as np
    import torch

    from fleetrl.algos.ppo import Agent
    from fleetrl.envs import make_vector_env
    from fleetrl.runtime import plan_threads

    torch.set_num_threads(torch_threads)
    envs = make_vector_env(BREAKOUT, 8, "ale", threads=plan_threads(num_envs=8))
    agent, learner = (Agent(envs.single_observation_space.shape, envs.single_action_space) for _ in range(2))
    optimizer, batch = torch.optim.Adam(learner.parameters(), lr=2.5e-4, eps=1e-5), torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8)
    stop, counts, obs = threading.Event(), {"steps": 0, "minibatches": 0}, [envs.reset(seed=0)[0]]

    def sample() -> None:
        while not stop.is_set():
            with torch.no_grad():
                action = agent.act(torch.from_numpy(np.asarray(obs[0])).float() / 255.0, False)
            obs[0] = envs.step(action.numpy())[0]
            counts["steps"] += 8

    def learn() -> None:
        while not stop.is_set():
            logprob, entropy, value = learner.evaluate({"obs": batch.float() / 255.0, "actions": torch.randint(0, 4, (256,))})
            optimizer.zero_grad()
            (-(logprob.mean() + 0.01 * entropy.mean()) + 0.5 * value.pow(2).mean()).backward()
            optimizer.step()
            counts["minibatches"] += 1

    def rates(*jobs) -> tuple[float, float]:
        for duration in (0.5, seconds):  # a warm-up window, then the measured one
            counts.update(steps=0, minibatches=0)
            threads = [threading.Thread(target=job) for job in jobs]
            start = time.perf_counter()
            for t in threads:
                t.start()
            time.sleep(duration)
            stop.set()
            for t in threads:
                t.join()
            stop.clear()
        elapsed = time.perf_counter() - start
        return counts["steps"] / elapsed, counts["minibatches"] / elapsed

    try:
        (alone, _), (_, mbs_alone), (beside, mbs_beside) = rates(sample), rates(learn), rates(sample, learn)
    finally:
        envs.close()
    return {"serial": 1024 / (1024 / alone + 16 / mbs_alone), "overlapped": 1024 / max(1024 / beside, 16 / mbs_beside),
            "env steps/s beside": beside, "minibatches/s beside": mbs_beside}


def omp_child(torch_threads: int) -> dict:
    """Median ms of a Nature CNN training minibatch (256) and an acting call (8), and the cores busy elsewhere before."""
    import torch

    from fleetrl.nets import NatureCNN
    from fleetrl.runtime import busy_cores_elsewhere

    busy = busy_cores_elsewhere(0.5)
    torch.set_num_threads(torch_threads)
    net, head = NatureCNN(4), torch.nn.Linear(NatureCNN.out_dim, 4)
    optimizer, batch, acting = torch.optim.Adam([*net.parameters(), *head.parameters()]), torch.rand(256, 4, 84, 84), torch.rand(8, 4, 84, 84)

    def train_step() -> None:
        optimizer.zero_grad()
        head(net(batch)).pow(2).mean().backward()
        optimizer.step()

    train_ms = median_us(train_step, 1, 6) / 1e3  # each the median of single calls, after a warm-up call
    with torch.no_grad():
        return {"train_ms": train_ms, "act_ms": median_us(lambda: head(net(acting)), 1, 50) / 1e3, "busy": busy}


def cmd_threads(opts: argparse.Namespace) -> None:
    from fleetrl.runtime import busy_cores_elsewhere, plan_threads

    groups, torch_counts, worker_counts = opts.only.split(","), [int(v) for v in opts.torch.split(",")], [int(v) for v in opts.workers.split(",")]
    rows = {f"| {g} | {b} | {t} | {'-' if b == 'sync' else w} |": (g, env, b, n, it, t, w) for g, env, b, n, it in GRID if g in groups
            for t in torch_counts for w in ([1] if b == "sync" else worker_counts)}

    def grid(label: str, _) -> tuple[float, float]:
        g, env, b, n, iters, t, w = rows[label]
        busy = busy_cores_elsewhere(1.0)
        r = train(["ppo", "--env-id", env, "--env-backend", b, "--num-envs", str(n), "--num-steps", "128", "--total-timesteps", str(iters * n * 128),
                   "--torch-threads", str(t), "--no-cuda", *([] if b == "sync" else ["--env-workers", str(w)])])
        if "failed" in r:
            raise SystemExit(f"{label}: {r['failed']}")
        window = r["charts/SPS_window"][1:]  # the first iteration warms up the kernels
        return len(window) / sum(1 / v for v in window), busy

    def child_runs(flag: str, env: dict | None = None) -> dict:  # one process per measurement: threads are set per process
        return alternate([1, 2], opts.repeats, lambda t, _: run_process([sys.executable, __file__, "threads", flag, str(t), "--overlap-seconds",
                                                                        str(opts.overlap_seconds)], env=env_with_path(**(env or {})))["result"])

    sps = alternate(rows, opts.repeats, grid, lambda n, r: f"{r[0]:,.0f} SPS, {r[1]:.1f} cores busy elsewhere")
    cores = os.cpu_count() or 1
    print(f"\n{host_line()}\nPPO SPS by thread setting (CleanRL's shapes), medians of {opts.repeats}; `plan`: the thread plan's pick on "
          f"an idle host (free) or with a core busy elsewhere\n")
    out = []
    for label, runs in sps.items():
        g, env, b, n, _, t, w = rows[label]
        picks = [name for name, busy in (("free", 0.0), ("1 busy", 1.0))
                 if (p := plan_threads(cores, num_envs=n, cnn="Breakout" in env, busy_elsewhere=busy)).torch_threads == t
                 and (b == "sync" or p.env_workers == w)]
        out.append([g, b, t, "-" if b == "sync" else w, fmt(med(r[0] for r in runs)), ", ".join(fmt(r[0]) for r in runs),
                    ", ".join(f"{r[1]:.1f}" for r in runs), "; ".join(picks)])
    if out:
        print(table(["workload", "backend", "torch threads", "env workers", "SPS (median)", "all runs", "cores busy elsewhere", "plan"], out))
    if "overlap" in groups:
        lag = child_runs("--overlap-child")
        print("\n--policy-lag 1 emulated: Breakout x8 x 128, sampling in a thread beside the learner; iteration SPS\n\n" + table(
            ["torch threads", "serial", "overlapped", "env steps/s beside learning", "minibatches/s beside sampling"],
            [[t, *(fmt(med(r[k] for r in runs), ".2f" if "mini" in k else ",.0f") for k in runs[0])] for t, runs in lag.items()]))
    if "omp" in groups:
        omp = {}
        for policy in ("default", "PASSIVE"):
            env = {"OMP_WAIT_POLICY": "PASSIVE"} if policy == "PASSIVE" else {}
            os.environ.pop("OMP_WAIT_POLICY", None)
            omp.update({(t, policy): r for t, r in child_runs("--omp-child", env).items()})
        print("\nNature CNN by OpenMP wait policy, ms\n\n" + table(
            ["torch threads", "OMP_WAIT_POLICY", "train ms", "all runs", "act ms", "all runs", "cores busy elsewhere"],
            [[t, p, *[c for k in ("train_ms", "act_ms") for c in (fmt(med(r[k] for r in rs), ",.1f"), ", ".join(fmt(r[k], ",.1f") for r in rs))],
              ", ".join(f"{r['busy']:.1f}" for r in rs)] for (t, p), rs in omp.items()]))


# ============================================================================ make-vec: CleanRL's scripts on make_vec
MAKE_VEC_CASES = [  # workload, script, its args, (label, variant) pairs: the first's ratio over the second, and the target
    ("CartPole-v1, 4 envs", "ppo", ["--env-id", "CartPole-v1", "--num-envs", "4", "--total-timesteps", "40960"],
     [("make_vec", "make_vec"), ("SyncVectorEnv", "gym_sync")], 1.0),
    ("Sleep5ms-v0, 64 envs", "ppo", ["--env-id", WAIT, "--num-envs", "64", "--num-steps", "32", "--total-timesteps", "16384"],
     [("make_vec", "make_vec"), ("AsyncVectorEnv", "gym_async")], 1.3),
    ("Breakout, 8 envs", "ppo_atari", ["--env-id", BREAKOUT, "--num-envs", "8", "--total-timesteps", "3072"],
     [("make_vec (ale)", "make_vec"), ("SyncVectorEnv", "gym_sync")], 1.2)]


def cleanrl_script(scripts: str, name: str, args: list[str], cpus: str) -> tuple[str, float]:
    """A patched CleanRL script run to its end on ``cpus``: its output and the peak RSS (MB) of its process tree."""
    import threading

    import psutil

    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            with contextlib.suppress(psutil.Error):
                for proc in psutil.Process(os.getpid()).children():
                    peak[0] = max(peak[0], sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        result = run_process([sys.executable, f"{scripts}/{name}.py", *args], cpus=cpus, cwd=scripts, env=env_with_path(OMP_NUM_THREADS="1"))
    finally:
        done.set()
    return result["stdout"], peak[0]


def cmd_make_vec(opts: argparse.Namespace) -> None:
    import numpy as np

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    import patch  # benchmarks/cleanrl/patch.py: CleanRL's scripts ported to gymnasium 1.x, one per vector env

    sps_line = re.compile(r"^SPS: (\d+)", re.M)
    with tempfile.TemporaryDirectory(prefix="make-vec-") as scripts:
        patch.main(Path(scripts))
        print(host_line(), f"taskset -c {opts.cpus}", flush=True)
        if opts.what == "speed":
            out = []
            for case, script, args, variants, target in MAKE_VEC_CASES:
                runs = alternate(dict(variants), opts.repeats, lambda label, _: cleanrl_script(scripts, f"{script}_{dict(variants)[label]}", args, opts.cpus))
                sps = {label: [int(sps_line.findall(o)[-1]) for o, _ in rs] for label, rs in runs.items()}
                first, second = (label for label, _ in variants)
                out += [[case, label, fmt(med(sps[label])), ", ".join(map(str, sps[label])), fmt(med(p for _, p in runs[label])),
                         f"{med(sps[first]) / med(sps[second]):.2f}x" if label == first else "", f">= {target}x" if label == first else ""]
                        for label, _ in variants]
            print(table(["workload", "variant", "SPS (median)", "all runs", "peak RSS of the process tree, MB", "ratio (SPS)", "target"], out))
        elif opts.what == "learning":
            from fleetrl.tools.stats import interval_estimates, probability_of_improvement

            scores = {"make_vec": [], "SyncVectorEnv": []}
            for seed in range(1, opts.seeds + 1):
                for label, variant in (("make_vec", "make_vec"), ("SyncVectorEnv", "gym_sync"))[:: 1 if seed % 2 else -1]:
                    out, _ = cleanrl_script(scripts, f"ppo_{variant}", ["--env-id", "CartPole-v1", "--seed", str(seed), "--total-timesteps", str(opts.steps)], opts.cpus)
                    scores[label].append(float(np.mean([float(x) for x in re.findall(r"episodic_return=\[?([-\d.e+]+)", out)][-20:])))
                    print(f"seed {seed} {label}: mean of the last 20 episodes {scores[label][-1]:.1f}", flush=True)
            rows = [[label, len(s), *(interval_estimates(np.array(s)[:, None], normalised=False, reps=2000, seed=0)[k].cell(1) for k in ("IQM", "mean")),
                     ", ".join(f"{v:.1f}" for v in s)] for label, s in scores.items()]
            p = probability_of_improvement(*(np.array(s)[:, None] for s in scores.values()), 2000, 0)
            print(table(["variant", "runs", "IQM [95% CI]", "mean [95% CI]", "scores"], rows) + f"\n\nP(make_vec > SyncVectorEnv) = {p.cell(2)}")
        else:  # env-share: the share of the script's wall time in envs.step and envs.reset, so the most any vector env could win
            argv = ["--env-id", opts.env_id, "--num-envs", str(opts.num_envs), "--total-timesteps", str(opts.steps), "--seed", "1"]
            rows = []
            for repeat in range(opts.repeats):
                r = run_process([sys.executable, __file__, "--env-share-child", f"{scripts}/{opts.script}_gym_sync.py", *argv], cpus=opts.cpus, cwd=scripts)["result"]
                rows.append([repeat + 1, f"{r['wall']:.1f}", f"{r['step']:.1f}", f"{r['reset']:.2f}", f"{r['share']:.1%}", f"{1 / (1 - r['share']):.2f}x"])
            print(table(["repeat", "wall s", "envs.step s", "envs.reset s", "env share", "bound on any vector env's speed-up"], rows))


def env_share_child(script: str, argv: list[str]) -> None:
    import runpy

    import gymnasium as gym

    spent = {"step": 0.0, "reset": 0.0}
    for name in spent:
        def timed(self, *args, _original=getattr(gym.vector.SyncVectorEnv, name), _name=name, **kwargs):
            began = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - began

        setattr(gym.vector.SyncVectorEnv, name, timed)
    sys.argv, began = [script, *argv], time.perf_counter()
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    wall = time.perf_counter() - began
    emit({"wall": wall, **spent, "share": (spent["step"] + spent["reset"]) / wall})


# ============================================================================ scaling: data-parallel PPO under torchrun
def cmd_scaling(opts: argparse.Namespace) -> None:
    def run(processes: str, _) -> dict:
        n = int(processes)
        envs = opts.envs_per_process * n
        r = train(["ppo", "--env-id", opts.env_id, "--num-envs", str(envs), "--num-steps", str(opts.num_steps), "--total-timesteps",
                   str(opts.iterations * envs * opts.num_steps), "--env-backend", "sync", "--torch-threads", "1", "--checkpoint-every",
                   "100000", "--cuda" if opts.cuda else "--no-cuda"], ("charts/SPS_window", "perf/learn_time", "perf/comm_time"),
                  launcher=["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"] if n > 1 else None,
                  env=env_with_path(OMP_NUM_THREADS="1"))
        if "failed" in r:
            raise SystemExit(f"{n} processes: {r['failed']}")
        comm = r["perf/comm_time"][1:] or [0.0] * len(r["perf/learn_time"][1:])
        return {"sps": med(r["charts/SPS_window"][1:]), "comm": med(c / (c + le) for c, le in zip(comm, r["perf/learn_time"][1:]))}

    runs = alternate(["1", str(opts.processes)], opts.repeats, run, lambda n, r: f"{r['sps']:,.0f} SPS")
    one = med(r["sps"] for r in runs["1"])
    print(f"\n{host_line()}\nPPO {opts.env_id}, {opts.envs_per_process} envs x {opts.num_steps} steps per process, sync backend, one torch "
          f"thread per process, {'GPU' if opts.cuda else 'CPU'}; medians of {opts.repeats}\n")
    print(table(["processes", "SPS (median)", "SPS (repeats)", "all-reduce share of update", "weak-scaling efficiency"],
                [[n, fmt(med(r["sps"] for r in rs)), ", ".join(fmt(r["sps"]) for r in rs), "-" if n == "1" else f"{med(r['comm'] for r in rs):.1%}",
                  f"{med(r['sps'] for r in rs) / (int(n) * one):.2f}"] for n, rs in runs.items()]))


# ============================================================================ tune: issue 12's targets for `fleetrl tune`
SPACE = """\
learning-rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
ent-coef: {type: float, low: 0.0, high: 0.05}
clip-coef: {type: float, low: 0.1, high: 0.3}
gamma: {type: categorical, choices: [0.95, 0.98, 0.99, 0.995]}
gae-lambda: {type: float, low: 0.8, high: 0.99}
update-epochs: {type: int, low: 2, high: 10}
num-minibatches: {type: categorical, choices: [2, 4, 8]}
num-steps: {type: categorical, choices: [64, 128, 256]}
"""
# the pruning part's default space leaves out the three parameters that set a trial's cost: in the full space the good
# CartPole trials are the expensive ones, so the ratio would measure the sampler's cost choices as much as the pruner
COST = ("update-epochs", "num-minibatches", "num-steps")


def cmd_tune(opts: argparse.Namespace) -> None:
    out = Path(opts.out or f"runs/tune_speed_{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "full.yaml").write_text(SPACE)
    (out / "fixed-cost.yaml").write_text("".join(line + "\n" for line in SPACE.splitlines() if line.split(":")[0] not in COST))
    ppo = lambda steps: ["fleetrl", "train", "ppo", "--total-timesteps", str(steps), "--env-backend", "sync"]  # noqa: E731

    def tune(name: str, trials: int, steps: int, parallel: int, *flags: str, space: str = "full") -> tuple[float, list[dict]]:
        began = time.perf_counter()
        run_process([sys.executable, "-m", "fleetrl", "tune", "--env-ids", "CartPole-v1", "--search", str(out / f"{space}.yaml"), "--trials",
                     str(trials), "--parallel", str(parallel), "--sampler-seed", "1", "--study-name", name, "--out", str(out / name), *flags, "--", *ppo(steps)])
        return time.perf_counter() - began, list(csv.DictReader(open(out / name / "trials.csv")))

    best = lambda trials: max(float(t["value"]) for t in trials if t["state"] == "COMPLETE")  # noqa: E731
    for part in opts.parts.split(","):
        if part == "parallel":
            walls = [tune(f"parallel_{p}", opts.trials, opts.steps, p, "--pruner", "none")[0] for p in (1, 2)]
            print(f"\n{opts.trials} trials of {opts.steps:,} steps, no pruning\n\n" + table(
                ["--parallel", "wall s", "vs --parallel 1"], [[1, f"{walls[0]:.0f}", "1.00x"], [2, f"{walls[1]:.0f}", f"{walls[1] / walls[0]:.2f}x (target <= 0.65x)"]]))
        elif part == "pruning":
            rows = [(p, *tune(f"pruner_{p}", opts.pruning_trials, opts.pruning_steps, opts.parallel, "--pruner", p,
                              *(shlex.split(opts.pruning_flags) if p != "none" else []), space=opts.pruning_space)) for p in ("none", "median")]
            print(f"\n{opts.pruning_trials} trials of {opts.pruning_steps:,} steps, --parallel {opts.parallel}, {opts.pruning_space} space\n\n" + table(
                ["pruner", "wall s", "vs none", "trials pruned", "best score"],
                [[p, f"{w:.0f}", f"{w / rows[0][1]:.2f}x", sum(t["state"] == "PRUNED" for t in ts), f"{best(ts):.1f}"] for p, w, ts in rows]))
        elif part == "defaults":
            import optuna

            from fleetrl.tools.tune import open_storage, parse_storage

            wall, _ = tune("study", opts.study_trials, opts.study_steps, opts.parallel)
            study = optuna.load_study(study_name="study", storage=open_storage(parse_storage(str(out / "study" / "study.log")), 600))
            tuned = shlex.split(study.best_trial.user_attrs["command"])
            scores = []
            for name, command in (("defaults", ppo(opts.study_steps)), ("tuned", tuned)):
                run_process([sys.executable, "-m", "fleetrl", "benchmark", "--env-ids", "CartPole-v1", "--num-seeds", str(opts.retrain_seeds), "--start-seed",
                             "101", "--workers", str(opts.parallel), "--out", str(out / f"retrain_{name}"), "--", *command])
                (row,) = csv.DictReader(open(out / f"retrain_{name}" / "summary.csv"))
                label = "CleanRL's defaults" if name == "defaults" else f"tuned (`{shlex.join(command[3:])}`)"
                scores.append([label, f"{float(row['final_return_mean']):.1f} ± {float(row['final_return_std']):.1f}"])
            print(f"\na {opts.study_trials}-trial study at {opts.study_steps:,} steps ({wall:.0f} s), its best and CleanRL's defaults retrained "
                  f"on seeds 101...\n\n" + table(["parameters", "final return (mean ± std over seeds)"], scores))
        elif part == "orphans":
            print("\nA tuner of 2 trials at once (2 async envs each), SIGKILLed while both train\n\n" + table(
                ["repeat", "processes of its trials", "all ended after s", "left after 120 s"], [[r + 1, *orphans(out, r)] for r in range(opts.orphan_repeats)]))
        else:
            raise SystemExit(f"--parts: unknown part {part!r}; the parts are parallel, pruning, defaults, orphans")


def orphans(out: Path, repeat: int) -> tuple[int, str, int]:
    import psutil

    folder = out / f"orphans_{repeat}"
    tuner = subprocess.Popen([sys.executable, "-m", "fleetrl", "tune", "--env-ids", "CartPole-v1", "--search", str(out / "full.yaml"), "--trials", "2",
                              "--parallel", "2", "--sampler-seed", "1", "--study-name", folder.name, "--out", str(folder), "--", "fleetrl", "train",
                              "ppo", "--total-timesteps", "10000000", "--num-envs", "2", "--env-backend", "async"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list = []
    try:
        deadline = time.monotonic() + 300
        while len(list(folder.glob("trial_000[01]/*/events.out.tfevents.*"))) < 2:  # both trials' runs are training
            if tuner.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the tuner's two trials did not both start logging")
            time.sleep(0.2)
        procs = psutil.Process(tuner.pid).children(recursive=True)  # the trials' trainers, forkservers and env workers
        tuner.kill()
        killed = time.perf_counter()
        tuner.wait()
        _, left = psutil.wait_procs(procs, timeout=120)
        return len(procs), f"{time.perf_counter() - killed:.1f}", len(left)
    finally:  # nothing of this repeat outlives it, however it ended
        if tuner.poll() is None:
            procs += psutil.Process(tuner.pid).children(recursive=True)
            tuner.kill()
            tuner.wait()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()


# ============================================================================ the command line
def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(json.loads(sys.argv[2]))
    if sys.argv[1:2] == ["--env-share-child"]:
        return env_share_child(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, scenarios in (("ppo", "breakout,cartpole,slow-env-lag,straggler"), ("offpolicy", "dqn,sac,td3")):
        p = sub.add_parser(name, help=HELP[name])
        p.add_argument("--scenarios", "--algos", default=scenarios, help=f"comma-separated [{scenarios}]")
        add_flags(p, repeats=3, quick=(False, "smoke test: short runs (pair with --repeats 1)"), cuda=(False, "train on the GPU (both sides)"),
                  timeout=(1800.0, "seconds before a run is killed and reported as FAILED"))
        if name == "ppo":
            p.add_argument("--iterations", type=int, help="iterations a run [per scenario]")
            add_flags(p, variants=("", "extra fleetrl variants of breakout and cartpole: 'name=--flag a;name2=...'"),
                      warmup=(1, "iterations left out at the start of each run"))
        else:
            p.add_argument("--steps", type=int, help="env steps a run, a multiple of 100 [dqn 40k, sac 4k, td3 6k]")
            p.add_argument("--learning-starts", type=int, help="random-action steps before learning [1000]")
            p.add_argument("--plain-threads", type=int, help="torch threads of the plain loop [torch's default, as CleanRL]")
            add_flags(p, flags=("", "fleetrl flags for every fleetrl run, e.g. '--policy-lag 1'"),
                      warmup=(100, "learning steps left out of the window"))
    p = sub.add_parser("train", help=HELP["train"] + ": train [--preset P | --variants V | --before REV | --user-file] [-- COMMAND]")
    p.add_argument("--preset", choices=list(TRAIN_PRESETS), help="variants and command: " + "; ".join(f"{k}: {v[0]} / {v[1]}" for k, v in TRAIN_PRESETS.items()))
    p.add_argument("--before", help="COMMAND from this earlier commit against this checkout")
    p.add_argument("command", nargs="*", help="COMMAND: what follows `fleetrl train` (after --) [the preset's, else checkouts']")
    add_flags(p, variants=("", "'name=FLAGS;name2=...', each run as `fleetrl train COMMAND FLAGS`"), repeats=3,
              user_file=(False, "`fleetrl train ./my_ppo.py FLAGS` (`fleetrl new my_ppo --from ppo`) against ppo"),
              skip=(2, "iterations left out of the window SPS and the phases"))
    p = sub.add_parser("envs", help=HELP["envs"])
    p.add_argument("preset", choices=list(env_presets()))
    add_flags(p, repeats=3, seconds=3.0)
    p = add_flags(sub.add_parser("threads", help=HELP["threads"] + "; --only overlap, omp"), repeats=3, torch="1,2", workers="1,2",
                  only="cartpole,busy,breakout-ale,breakout-async,overlap", overlap_seconds=3.0)
    p.add_argument("--overlap-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--omp-child", type=int, help=argparse.SUPPRESS)
    p = sub.add_parser("make-vec", help=HELP["make-vec"])
    p.add_argument("what", choices=["speed", "learning", "env-share"])
    add_flags(p, repeats=3, cpus=("0,1", "taskset -c CPUS for every run"), seeds=10, script="ppo_atari", env_id=BREAKOUT, num_envs=8,
              steps=(500_000, "learning: steps a run; env-share: 16384 is a fair length"))
    add_flags(sub.add_parser("scaling", help=HELP["scaling"]), env_id=BREAKOUT, processes=2, envs_per_process=4, num_steps=128, iterations=6,
              repeats=3, cuda=False)
    p = sub.add_parser("tune", help=HELP["tune"])
    p.add_argument("--out", help="where the studies go [runs/tune_speed_{timestamp}]")
    p.add_argument("--pruning-space", choices=("fixed-cost", "full"), default="fixed-cost")
    add_flags(p, parts="parallel,pruning,defaults,orphans", trials=8, steps=50_000, pruning_trials=16, pruning_steps=100_000, study_trials=24,
              study_steps=100_000, retrain_seeds=3, parallel=2, orphan_repeats=3,
              pruning_flags=("", "extra tune flags of the pruned study, e.g. '--prune-after-trials 3'"))
    opts = parser.parse_args()
    if opts.cmd == "threads" and (opts.overlap_child or opts.omp_child):
        return emit(overlap_child(opts.overlap_child, opts.overlap_seconds) if opts.overlap_child else omp_child(opts.omp_child))
    {"ppo": cmd_ppo, "offpolicy": cmd_offpolicy, "train": cmd_train, "envs": cmd_envs, "threads": cmd_threads, "make-vec": cmd_make_vec,
     "scaling": cmd_scaling, "tune": cmd_tune}[opts.cmd](opts)


if __name__ == "__main__":
    main()
