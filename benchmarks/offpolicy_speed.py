"""Off-policy training speed, side by side: fleetrl's DQN, SAC and TD3 against plain CleanRL-style loops (issue 13's
target: fleetrl at least 2x the plain loop of the same algorithm on this CPU).

    python benchmarks/offpolicy_speed.py                         # all three, medians of 3 repeats (~10 min on 2 cores)
    python benchmarks/offpolicy_speed.py --quick                 # smoke check (~1-2 min): 1 repeat, short runs
    python benchmarks/offpolicy_speed.py --algos sac,td3 --repeats 5 --markdown speed.md --json speed.json
    python benchmarks/offpolicy_speed.py --fleetrl-set env_backend=sync --fleetrl-set torch_threads=1
    python benchmarks/offpolicy_speed.py --plain-threads 1         # the plain loop with one torch thread, not torch's default

What runs: for each algorithm, the plain loop (benchmarks/plain_offpolicy.py: CleanRL's dqn.py,
sac_continuous_action.py or td3_continuous_action.py, with a gymnasium SyncVectorEnv of one env, an SB3-style numpy
replay buffer and plain Adam) and fleetrl's ``train`` (``fleetrl.algos.<algo>.train(Args(...))``, given the plain
loop's hyperparameters, CleanRL's defaults, explicitly), on the same env, seed, number of steps and
``--learning-starts``. DQN runs on CartPole-v1, SAC and TD3 on HalfCheetah-v5 (no early termination, so every run
steps the same physics).

Threads: the plain loop keeps torch's default thread count, as CleanRL does (``--plain-threads`` changes it); fleetrl
uses its thread plan. Both are in the table. On 2 cores, two threads per process are badly hurt by any other load on
the machine (a busy machine made the plain loop 5-20x slower in a smoke run), which flatters fleetrl: run on a quiet
machine, and also run ``--plain-threads 1`` to compare against the plain loop at its best.

How it measures: each run is its own subprocess (fresh threads, nothing shared), and within each repeat the two sides
alternate, in the opposite order on the next repeat (plain, fleetrl; fleetrl, plain; ...). A run's SPS is env steps
over wall time in the *learning phase* only: from step ``learning_starts + warmup`` (rounded up to a block of 100
steps) to the last step. Both sides mark the clock at the end of every 100 steps: the plain loop in its loop, fleetrl
when its loop hands an iteration (100 vector steps) to the logging call. Start-up, the ``learning_starts`` steps of
random actions before learning, ``warmup`` steps after it and fleetrl's final checkpoint are outside the window;
fleetrl's per-iteration logging (TensorBoard, progress, resource sampling) is inside it, while the plain loop writes no
TensorBoard at all (its ``.item()`` reads are kept). "cores busy" is the process tree's CPU time over the window.
A run that fails is reported as FAILED with the end of its stderr, and the rest go on.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ppo_speed import fmt, host_description, tree_cpu_seconds  # the same host line and CPU accounting as the PPO benchmark

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_MARKER = "OFFPOLICY_SPEED_RESULT "  # the runner's one line of JSON on stdout
STDERR_TAIL_LINES = 15
TARGET = 2.0  # fleetrl >= 2x the plain loop (issue 13)
SIDES = ("plain", "fleetrl")


# ============================================================================ what is measured
@dataclass(frozen=True)
class Scenario:
    algo: str
    env_id: str
    learning_starts: int
    steps: int  # the whole run (--total-timesteps), a multiple of 100
    quick_learning_starts: int
    quick_steps: int


SCENARIOS = {  # the default budgets aim at ~10 minutes on 2 quiet cores with 3 repeats (SAC ~100, TD3 ~150 plain SPS)
    "dqn": Scenario("dqn", "CartPole-v1", learning_starts=1_000, steps=40_000, quick_learning_starts=500, quick_steps=4_000),
    "sac": Scenario("sac", "HalfCheetah-v5", learning_starts=1_000, steps=4_000, quick_learning_starts=500, quick_steps=1_200),
    "td3": Scenario("td3", "HalfCheetah-v5", learning_starts=1_000, steps=6_000, quick_learning_starts=500, quick_steps=1_500),
}


# ============================================================================ the runner (one subprocess per run)
class Marks:
    """(steps done, perf_counter) at the end of every 100 steps; CPU time read only where the window opens and ends
    (walking the process tree costs milliseconds)."""

    def __init__(self, window_start: int, steps: int):
        self.window_start, self.steps = window_start, steps
        self.marks: list[tuple[int, float]] = []
        self.cpu: dict[str, float] = {}

    def mark(self, steps_done: int) -> None:
        self.marks.append((int(steps_done), time.perf_counter()))
        if steps_done == self.window_start:
            self.cpu["start"] = tree_cpu_seconds()
        if steps_done == self.steps:
            self.cpu["end"] = tree_cpu_seconds()


def run_plain(opts: argparse.Namespace, marks: Marks) -> dict[str, Any]:
    import torch

    import plain_offpolicy

    if opts.plain_threads:
        torch.set_num_threads(opts.plain_threads)
    device = "cuda" if opts.cuda and torch.cuda.is_available() else "cpu"
    timing = plain_offpolicy.PLAIN[opts.algo](opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, device=device,
                                              on_mark=marks.mark)
    return {"torch_threads": timing.torch_threads, "interop_threads": torch.get_num_interop_threads(),
            "episodes": len(timing.episode_returns), "backend": "gymnasium SyncVectorEnv", "device": device}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> {key: value}, values read as Python literals where they parse (else strings)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--fleetrl-set: expected KEY=VALUE (an Args field), got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip().replace("-", "_")] = value
    return out


def run_fleetrl(opts: argparse.Namespace, marks: Marks) -> dict[str, Any]:
    """``fleetrl.algos.<algo>.train``, its clock marked when each iteration's steps are done (at the entry of the
    logging call, so its final checkpoint falls outside the window)."""
    import importlib

    import torch

    import plain_offpolicy
    from fleetrl.errors import FleetError
    from fleetrl.monitor import trainlog

    module = importlib.import_module(f"fleetrl.algos.{opts.algo}")
    seen: dict[str, Any] = {}
    original_init, original_iteration = trainlog.TrainLog.__init__, trainlog.TrainLog.iteration

    def init(self, args, dist, envs, *rest, **kwargs):
        original_init(self, args, dist, envs, *rest, **kwargs)
        seen["backend"] = f"{getattr(envs, 'backend', '?')}"
        seen["thread_plan"] = str(getattr(envs, "thread_plan", ""))
        seen["device"] = str(dist.device if dist.enabled else ("cuda" if args.cuda and torch.cuda.is_available() else "cpu"))

    def iteration(self, global_step, *args, **kwargs):
        marks.mark(global_step)
        seen["torch_threads"] = torch.get_num_threads()  # as the loop runs (the run sets its thread plan)
        return original_iteration(self, global_step, *args, **kwargs)

    trainlog.TrainLog.__init__, trainlog.TrainLog.iteration = init, iteration
    # the plain loop's hyperparameters (CleanRL's), given explicitly, so both sides surely run the same ones
    fields = dataclasses.asdict(plain_offpolicy.ARGS[opts.algo]())
    fields.update(env_id=opts.env_id, seed=opts.seed, total_timesteps=opts.steps, learning_starts=opts.learning_starts,
                  run_dir=os.path.join(opts.run_dir, "run"), progress=False, cuda=opts.cuda, checkpoint_every=1_000_000)
    fields.update(parse_sets(opts.fleetrl_set))
    known = {f.name for f in dataclasses.fields(module.Args)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SystemExit(f"{', '.join(unknown)}: not a field of fleetrl.algos.{opts.algo}.Args (given with --fleetrl-set, "
                         f"or a hyperparameter of the plain loop that fleetrl lacks)")
    args = module.Args(**fields)
    try:
        result = module.train(args)
    except FleetError as exc:  # the one clear paragraph the CLI would print, not a traceback
        raise SystemExit(f"fleetrl: error: {exc}") from None
    return {"torch_threads": seen.get("torch_threads"), "interop_threads": torch.get_num_interop_threads(),
            "episodes": len(result.episode_returns), "backend": seen.get("backend"), "thread_plan": seen.get("thread_plan"),
            "device": seen.get("device"), "iteration_seconds": list(result.iteration_seconds)}


def window_start(learning_starts: int, warmup: int) -> int:
    return -(-(learning_starts + warmup) // 100) * 100  # rounded up to a block of 100 steps


def run_one(opts: argparse.Namespace) -> None:
    """Entry of the subprocess: train, then print one line of JSON for the parent."""
    sys.path.insert(0, HERE)  # plain_offpolicy
    marks = Marks(window_start(opts.learning_starts, opts.warmup), opts.steps)
    info = run_plain(opts, marks) if opts.run_one == "plain" else run_fleetrl(opts, marks)
    print(RESULT_MARKER + json.dumps({"marks": marks.marks, "cpu": marks.cpu, **info}), flush=True)


# ============================================================================ the parent: run, alternate, summarise
@dataclass
class Measurement:
    ok: bool
    sps: float = 0.0
    cores_busy: float | None = None
    window_steps: int = 0
    window_s: float = 0.0
    wall_s: float = 0.0  # the whole subprocess
    torch_threads: int | None = None
    backend: str = ""
    thread_plan: str = ""
    error: str = ""


def summarise(raw: dict[str, Any], start: int, steps: int) -> Measurement:
    marks = {s: t for s, t in raw["marks"]}
    if start not in marks or steps not in marks:
        have = sorted(marks)
        return Measurement(False, error=f"the clock marks do not cover steps {start}..{steps} (marked: "
                                        f"{have[:3]}...{have[-3:] if have else []})")
    seconds = marks[steps] - marks[start]
    m = Measurement(True, sps=(steps - start) / seconds, window_steps=steps - start, window_s=seconds,
                    torch_threads=raw.get("torch_threads"), backend=raw.get("backend") or "",
                    thread_plan=raw.get("thread_plan") or "")
    cpu = raw.get("cpu") or {}
    if "start" in cpu and "end" in cpu:
        m.cores_busy = (cpu["end"] - cpu["start"]) / seconds
    return m


def measure(side: str, scenario: Scenario, steps: int, learning_starts: int, opts: argparse.Namespace) -> tuple[Measurement, dict]:
    """One run of one side in a fresh subprocess (its own process group, so a timeout ends its workers too)."""
    with tempfile.TemporaryDirectory(prefix="offpolicy_speed_") as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), "--run-one", side, "--algo", scenario.algo, "--env-id", scenario.env_id,
               "--steps", str(steps), "--learning-starts", str(learning_starts), "--warmup", str(opts.warmup),
               "--seed", str(opts.seed), "--run-dir", tmp] + (["--cuda"] if opts.cuda else [])
        cmd += ["--plain-threads", str(opts.plain_threads)] if opts.plain_threads else []
        cmd += [f"--fleetrl-set={item}" for item in opts.fleetrl_set]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p))
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
                                start_new_session=True)  # cwd: MuJoCo writes MUJOCO_LOG.TXT there
        try:
            stdout, stderr = proc.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            stderr += f"\n(killed after --timeout {opts.timeout:.0f} s)"
        wall = time.perf_counter() - started
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (stderr.strip() or stdout.strip()).splitlines()[-STDERR_TAIL_LINES:]
        return Measurement(False, error="\n".join(tail) or f"exit code {proc.returncode}, no output", wall_s=wall), {}
    raw = json.loads(lines[-1][len(RESULT_MARKER):])
    m = summarise(raw, window_start(learning_starts, opts.warmup), steps)
    m.wall_s = wall
    return m, raw


def table(results: dict[str, dict[str, list[Measurement]]], budgets: dict[str, tuple[int, int]], opts: argparse.Namespace) -> list[str]:
    out = [f"SPS: env steps per wall-clock second in the learning phase only, the same steps on both sides: from step "
           f"learning_starts + {opts.warmup} (rounded up to 100) to the end of the run; start-up, the random-action prefill, "
           f"the warm-up and fleetrl's final checkpoint are not timed. Medians of {opts.repeats} repeat(s), sides alternating. "
           f"Same env, seed {opts.seed}, one env, CleanRL's hyperparameters on both sides; plain loop torch threads: "
           f"{opts.plain_threads or 'torch default'}, fleetrl: its thread plan; "
           f"{'GPU if present' if opts.cuda else 'CPU'}.", "",
           "| algorithm | env | steps timed (of run) | plain SPS | fleetrl SPS | fleetrl / plain | target >= 2x | "
           "plain repeats | fleetrl repeats | cores busy plain / fleetrl | torch threads plain / fleetrl | fleetrl backend |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures = []
    for algo, sides in results.items():
        scenario, (learning_starts, steps) = SCENARIOS[algo], budgets[algo]
        good = {side: [m for m in runs if m.ok] for side, runs in sides.items()}
        med = {side: statistics.median(m.sps for m in runs) for side, runs in good.items() if runs}
        ratio = med["fleetrl"] / med["plain"] if len(med) == 2 else None
        verdict = "-" if ratio is None else ("met" if ratio >= TARGET else "NOT met")
        reps = {side: ", ".join(fmt(m.sps) if m.ok else "FAILED" for m in runs) for side, runs in sides.items()}

        def median_of(side: str, key: str, spec: str) -> str:
            values = [getattr(m, key) for m in good[side] if getattr(m, key) is not None]
            return fmt(statistics.median(values), spec) if values else "-"

        timed = f"{steps - window_start(learning_starts, opts.warmup):,} ({steps:,}, learning from {learning_starts:,})"
        backends = sorted({m.backend for m in good["fleetrl"] if m.backend}) or ["-"]
        out.append(f"| {algo.upper()} | {scenario.env_id} | {timed} | {fmt(med.get('plain'))} | {fmt(med.get('fleetrl'))} | "
                   f"{'-' if ratio is None else f'**{ratio:.2f}x**'} | {verdict} | {reps['plain']} | {reps['fleetrl']} | "
                   f"{median_of('plain', 'cores_busy', '.2f')} / {median_of('fleetrl', 'cores_busy', '.2f')} | "
                   f"{median_of('plain', 'torch_threads', '.0f')} / {median_of('fleetrl', 'torch_threads', '.0f')} | {', '.join(backends)} |")
        failures += [(algo, side, next(m for m in runs if not m.ok)) for side, runs in sides.items() if any(not m.ok for m in runs)]
    plans = sorted({m.thread_plan for sides in results.values() for m in sides["fleetrl"] if m.ok and m.thread_plan})
    if plans:
        out += ["", "fleetrl thread plan: " + "; ".join(plans)]
    for algo, side, m in failures:
        out += ["", f"FAILED: {algo} / {side}, the last lines of its stderr:", "", "```", m.error, "```"]
    return out + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="dqn,sac,td3", help="comma-separated; default all three")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each side (the median is reported) [3; 1 with --quick]")
    parser.add_argument("--steps", type=int, default=None, help="env steps a run, a multiple of 100 [dqn 40k, sac 4k, td3 6k]")
    parser.add_argument("--learning-starts", type=int, default=None, help="random-action steps before learning [1000]")
    parser.add_argument("--warmup", type=int, default=100, help="learning steps left out of the window after learning starts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke check: 1 repeat, short runs")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU when there is one (both sides); default CPU")
    parser.add_argument("--fleetrl-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="an Args field for every fleetrl run (repeatable), e.g. env_backend=sync, torch_threads=1")
    parser.add_argument("--plain-threads", type=int, default=None,
                        help="torch threads of the plain loop [torch's default, as CleanRL leaves it]; 1 shows the plain loop "
                             "at its best on a small or busy machine")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before one run is killed and reported as FAILED")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures to FILE")
    # the subprocess side (internal)
    parser.add_argument("--run-one", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--algo", help=argparse.SUPPRESS)
    parser.add_argument("--env-id", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.run_one:
        opts.steps, opts.learning_starts = int(opts.steps), int(opts.learning_starts)
        return run_one(opts)

    if opts.repeats is None:
        opts.repeats = 1 if opts.quick else 3
    algos = [a.strip() for a in opts.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in SCENARIOS]
    if unknown:
        raise SystemExit(f"--algos: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    budgets = {}
    for algo in algos:
        s = SCENARIOS[algo]
        learning_starts = opts.learning_starts if opts.learning_starts is not None else (s.quick_learning_starts if opts.quick else s.learning_starts)
        steps = opts.steps or (s.quick_steps if opts.quick else s.steps)
        if steps % 100:
            raise SystemExit(f"--steps {steps}: give a multiple of 100 (fleetrl's off-policy iteration is 100 steps)")
        if window_start(learning_starts, opts.warmup) >= steps:
            raise SystemExit(f"{algo}: --steps {steps} leaves no timed window after --learning-starts {learning_starts} "
                             f"+ --warmup {opts.warmup}")
        budgets[algo] = (learning_starts, steps)

    header = host_description()
    for line in header:
        print(line, flush=True)
    results = {algo: {side: [] for side in SIDES} for algo in algos}
    raw_log: list[dict[str, Any]] = []
    started = time.perf_counter()
    for repeat in range(opts.repeats):
        order = SIDES if repeat % 2 == 0 else SIDES[::-1]  # plain first, then fleetrl first: drift hits both alike
        for algo in algos:
            for side in order:
                learning_starts, steps = budgets[algo]
                m, raw = measure(side, SCENARIOS[algo], steps, learning_starts, opts)
                results[algo][side].append(m)
                raw_log.append({"algo": algo, "side": side, "repeat": repeat, **dataclasses.asdict(m), "raw": raw})
                state = f"{m.sps:,.0f} SPS" if m.ok else "FAILED"
                print(f"[repeat {repeat + 1}/{opts.repeats}] {algo} / {side}: {state} ({m.wall_s:.0f} s; "
                      f"{time.perf_counter() - started:.0f} s so far)", file=sys.stderr, flush=True)

    command = " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = ["## Off-policy speed (benchmarks/offpolicy_speed.py)", "", *[f"{line}  " for line in header],
             f"Command: `python benchmarks/offpolicy_speed.py {command}`; total {time.perf_counter() - started:.0f} s; "
             f"load average {os.getloadavg()[0]:.2f} at the end.", "", *table(results, budgets, opts)]
    text = "\n".join(lines)
    print("\n" + text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"host": header, "argv": sys.argv[1:], "budgets": budgets, "warmup": opts.warmup, "runs": raw_log}, f, indent=1)


if __name__ == "__main__":
    main()
