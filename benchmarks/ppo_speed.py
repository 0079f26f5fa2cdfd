"""PPO training speed, side by side: fleetrl against a plain CleanRL-style loop, and fleetrl's speed options (issue 10's targets).

    python benchmarks/ppo_speed.py                                   # every scenario, medians of 3 repeats
    python benchmarks/ppo_speed.py --quick                           # smoke test: 1 repeat, a few iterations
    python benchmarks/ppo_speed.py --scenarios breakout,cartpole --repeats 5 --markdown speed.md --json speed.json
    python benchmarks/ppo_speed.py --scenarios breakout --variants "fp32-serial=--precision fp32 --policy-lag 0;compile=--compile"

Scenarios (``--scenarios``, default all):
  breakout      PPO BreakoutNoFrameskip-v4, CleanRL's Atari defaults (8 envs x 128 steps): the plain loop
                (benchmarks/plain_ppo.py: gymnasium SyncVectorEnv, CleanRL's wrappers, fp32, a Categorical
                each step) against `fleetrl train ppo` with its defaults and any ``--variants``. Target >= 3x.
  cartpole      the same on CartPole-v1 with CleanRL's classic defaults (4 envs x 128 steps). Target >= 3x.
  slow-env-lag  a pure-Python env whose step costs 200 us (benchmarks/ppo_speed_envs.py), 8 envs, async backend,
                MLP: `--policy-lag 1` against `--policy-lag 0`, once busy-waiting (CPU-bound) and once sleeping
                (I/O-bound, like a remote simulator). Target: lag 1 >= 1.4x lag 0.
  straggler     8 busy-wait envs of which one is 10x slower, async backend, `--async-batch 4`, against the all-fast
                run with the same flags. Target: >= 70% of the all-fast run.
  wait-envs     64 envs whose step sleeps 5 ms (benchmarks/ppo_speed_envs.py), 64 envs x 32 steps, MLP: `fleetrl train
                ppo` with its defaults against the CleanRL-style loop on gymnasium's AsyncVectorEnv (a process per env,
                torch at 1 thread: its stronger setting here). Target >= 1.5x.
  socket-sim    16 envs that each talk over loopback TCP to a simulator server computing ~0.2 ms a step
                (benchmarks/socket_sim.py; the server starts and stops with the benchmark), 16 envs x 128 steps: the
                same comparison. Target >= 1.5x.

How it measures: every run is its own subprocess (fresh threads, a fresh torch.compile cache, nothing shared
between variants), and the variants alternate within each repeat (A B A B ..., never A A B B). A run's SPS counts
whole iterations after the first ``--warmup`` ones: env steps over the wall time from the end of the last warm-up
iteration to the end of the last iteration. Start-up (process start to the first iteration: imports, backend and
precision probes) and the warm-up iterations (where compilation happens) are columns of their own. CPU-seconds per
1M env steps is the CPU time of the run's whole process tree (trainer, its threads, env workers) over the timed
iterations, scaled to 1M steps; "cores busy" is the same CPU time over the wall time. A variant that fails is
reported as FAILED with the end of its stderr, and the rest go on.

fleetrl is timed through its own training call: the runner (``--run-one fleetrl``) builds ``Args`` from the
flags as `fleetrl train ppo` does and marks the end of each iteration when ``train`` appends it to
``TrainResult.iteration_seconds``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_MARKER = "PPO_SPEED_RESULT "  # the runner's one line of JSON on stdout
STDERR_TAIL_LINES = 12
BUSY_ENV, SLEEP_ENV, STRAGGLER_ENV = ("ppo_speed_envs:BusyWait200us-v0", "ppo_speed_envs:Sleep200us-v0",
                                      "ppo_speed_envs:Straggler-v0")
WAIT_ENV, SOCKET_ENV = "ppo_speed_envs:Sleep5ms-v0", "socket_sim:SocketSim-v0"
PLAIN_KINDS = ("plain-breakout", "plain-cartpole", "plain-async", "plain-breakout-lstm")  # plain-async: any env, --num-envs/--num-steps from its flags


# ============================================================================ what is measured
@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "fleetrl", "fleetrl-lstm" (FLEETRL_KINDS) or one of PLAIN_KINDS
    env_id: str
    flags: tuple[str, ...] = ()  # fleetrl flags after the scenario's fixed ones
    baseline: str | None = None  # the variant this one's ratio is taken against


@dataclass(frozen=True)
class Target:
    variant: str
    baseline: str
    at_least: float
    label: str


@dataclass
class Scenario:
    name: str
    title: str
    iterations: int
    quick_iterations: int
    variants: list[Variant]
    targets: list[Target] = field(default_factory=list)


def scenarios(extra: list[tuple[str, tuple[str, ...]]]) -> dict[str, Scenario]:
    """The four scenarios; ``extra`` fleetrl variants join breakout and cartpole."""
    atari = ("--num-envs", "8", "--num-steps", "128")
    classic = ("--num-envs", "4", "--num-steps", "128")
    slow = ("--env-backend", "async", "--num-envs", "8", "--num-steps", "128")

    def against_plain(env_id: str, plain: str, fixed: tuple[str, ...]) -> list[Variant]:
        return [Variant("plain CleanRL-style loop", plain, env_id),
                Variant("fleetrl (defaults)", "fleetrl", env_id, fixed, baseline="plain CleanRL-style loop"),
                *[Variant(f"fleetrl {name}", "fleetrl", env_id, fixed + flags, baseline="plain CleanRL-style loop")
                  for name, flags in extra]]

    lag: list[Variant] = []
    for how, env_id in (("busy-wait", BUSY_ENV), ("sleep", SLEEP_ENV)):
        serial = f"{how}, serial loop (--async-batch 8)"  # every env then every action, in turn: no overlap at all
        lag += [Variant(serial, "fleetrl", env_id, slow + ("--policy-lag", "0", "--async-batch", "8")),
                Variant(f"{how}, split (the default)", "fleetrl", env_id, slow + ("--policy-lag", "0"), baseline=serial),
                Variant(f"{how}, --policy-lag 1", "fleetrl", env_id, slow + ("--policy-lag", "1"), baseline=serial)]
    straggle = slow + ("--async-batch", "4")

    def against_gym_async(env_id: str, shape: tuple[str, ...]) -> list[Variant]:
        plain = "plain loop on gymnasium AsyncVectorEnv"
        return [Variant(plain, "plain-async", env_id, shape),
                Variant("fleetrl (defaults)", "fleetrl", env_id, shape, baseline=plain),
                Variant("fleetrl --policy-lag 1", "fleetrl", env_id, shape + ("--policy-lag", "1"), baseline=plain)]

    return {
        "breakout": Scenario(
            "breakout", "PPO BreakoutNoFrameskip-v4, CleanRL's Atari defaults (8 envs x 128 steps, 4 epochs x 4 minibatches)",
            iterations=10, quick_iterations=3, variants=against_plain("BreakoutNoFrameskip-v4", "plain-breakout", atari),
            targets=[Target("fleetrl (defaults)", "plain CleanRL-style loop", 3.0, "fleetrl >= 3x the plain loop")]),
        "cartpole": Scenario(
            "cartpole", "PPO CartPole-v1, CleanRL's defaults (4 envs x 128 steps, 4 epochs x 4 minibatches)",
            iterations=40, quick_iterations=5, variants=against_plain("CartPole-v1", "plain-cartpole", classic),
            targets=[Target("fleetrl (defaults)", "plain CleanRL-style loop", 3.0, "fleetrl >= 3x the plain loop")]),
        "slow-env-lag": Scenario(
            "slow-env-lag", "PPO on a 200 us/step Python env, 8 envs x 128 steps, async backend, MLP: policy lag 1 against serial",
            iterations=16, quick_iterations=3, variants=lag,
            targets=[Target(v.name, v.baseline, 1.4, f"{v.name.split(',')[0]}: lag 1 >= 1.4x serial") for v in lag if "lag 1" in v.name]),
        "straggler": Scenario(
            "straggler", "PPO on 8 busy-wait envs (200 us/step), async backend, --async-batch 4: one env 10x slower against all fast",
            iterations=16, quick_iterations=3,
            variants=[Variant("all envs fast", "fleetrl", BUSY_ENV, straggle),
                      Variant("one env 10x slower", "fleetrl", STRAGGLER_ENV, straggle, baseline="all envs fast")],
            targets=[Target("one env 10x slower", "all envs fast", 0.7, "one slow env >= 70% of the all-fast run")]),
        "breakout-lstm": Scenario(
            "breakout-lstm", "PPO-LSTM BreakoutNoFrameskip-v4, CleanRL's ppo_atari_lstm.py defaults (8 envs x 128 steps, one frame a "
                             "step): `fleetrl train ppo_lstm` against CleanRL's loop", iterations=6, quick_iterations=2,
            variants=[Variant("plain CleanRL-style loop", "plain-breakout-lstm", "BreakoutNoFrameskip-v4"),
                      Variant("fleetrl ppo_lstm (defaults)", "fleetrl-lstm", "BreakoutNoFrameskip-v4", atari, baseline="plain CleanRL-style loop")],
            targets=[Target("fleetrl ppo_lstm (defaults)", "plain CleanRL-style loop", 1.5, "fleetrl ppo_lstm >= 1.5x the plain loop")]),
        "wait-envs": Scenario(
            "wait-envs", "PPO on 64 envs whose step sleeps 5 ms, 64 envs x 32 steps, MLP: fleetrl against the plain loop on "
                         "gymnasium's AsyncVectorEnv", iterations=16, quick_iterations=3,
            variants=against_gym_async(WAIT_ENV, ("--num-envs", "64", "--num-steps", "32")),
            targets=[Target("fleetrl (defaults)", "plain loop on gymnasium AsyncVectorEnv", 1.5, "fleetrl >= 1.5x the plain loop")]),
        "socket-sim": Scenario(
            "socket-sim", "PPO on 16 envs talking to a simulator server over loopback TCP (~0.2 ms of compute a step), "
                          "16 envs x 128 steps: fleetrl against the plain loop on gymnasium's AsyncVectorEnv",
            iterations=12, quick_iterations=3,
            variants=against_gym_async(SOCKET_ENV, ("--num-envs", "16", "--num-steps", "128")),
            targets=[Target("fleetrl (defaults)", "plain loop on gymnasium AsyncVectorEnv", 1.5, "fleetrl >= 1.5x the plain loop")]),
    }


# ============================================================================ the runner (one subprocess per run)
def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads), its finished children, and its live descendants."""
    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue  # exited between listing and reading
    return total


class Recorder:
    """Marks the end of every iteration; reads the CPU time only at the two ends of the timed window, because
    walking the process tree costs milliseconds, a visible share of a 40 ms CartPole iteration."""

    def __init__(self, iterations: int, warmup: int):
        self.iterations, self.warmup = iterations, warmup
        self.iteration_seconds: list[float] = []
        self.ends: list[float] = []  # perf_counter at each iteration's end
        self.first_start_epoch: float | None = None
        self.cpu: dict[str, float] = {}

    def mark(self, seconds: float) -> None:
        now, epoch = time.perf_counter(), time.time()
        if not self.ends:
            self.first_start_epoch = epoch - seconds
        self.iteration_seconds.append(float(seconds))
        self.ends.append(now)
        n = len(self.ends)
        if n == self.warmup:
            self.cpu["warm"] = tree_cpu_seconds()
        if n == self.iterations:
            self.cpu["end"] = tree_cpu_seconds()


def run_plain(kind: str, opts: argparse.Namespace, recorder: Recorder) -> int:
    from plain_ppo import BREAKOUT, CARTPOLE, PlainSpec, plain_ppo

    import torch

    if kind == "plain-breakout-lstm":  # CleanRL's ppo_atari_lstm.py loop
        from plain_ppo_lstm import BREAKOUT_LSTM, plain_ppo_lstm

        plain_ppo_lstm(BREAKOUT_LSTM, opts.iterations, seed=1, device="cuda" if opts.cuda and torch.cuda.is_available() else "cpu",
                       on_iteration=recorder.mark)
        return BREAKOUT_LSTM.num_envs * BREAKOUT_LSTM.num_steps
    if kind == "plain-async":  # the classic hyperparameters, on the variant's env and batch shape
        shape = argparse.ArgumentParser()
        shape.add_argument("--num-envs", type=int, required=True)
        shape.add_argument("--num-steps", type=int, required=True)
        given = shape.parse_args(shlex.split(opts.flags))
        importlib.import_module(opts.env_id.split(":")[0])  # registers the custom env
        spec = PlainSpec(opts.env_id.split(":")[1], atari=False, num_envs=given.num_envs, num_steps=given.num_steps, vector="async")
        # the stronger baseline: torch's default 2 intra-op threads spin between ops and compete with the env processes
        # (64 sleeping envs: 647-3,226 SPS a run beside other jobs, 3,151-4,110 with 1 thread)
        torch.set_num_threads(1)
    else:
        spec = BREAKOUT if kind == "plain-breakout" else CARTPOLE
    plain_ppo(spec, opts.iterations, seed=1, device="cuda" if opts.cuda and torch.cuda.is_available() else "cpu",
              on_iteration=recorder.mark)
    return spec.num_envs * spec.num_steps


FLEETRL_KINDS = {"fleetrl": "ppo", "fleetrl-lstm": "ppo_lstm"}  # variant kind -> `fleetrl train ALGO`


def run_fleetrl(opts: argparse.Namespace, recorder: Recorder) -> int:
    """`fleetrl train ALGO FLAGS` (ppo or ppo_lstm), with the end of each iteration marked as ``train`` records it."""
    import tyro

    from fleetrl import config, monitor
    from fleetrl.errors import FleetError
    from fleetrl.monitor import logger as monitor_logger

    base = monitor.TrainResult

    class MarkingList(list):
        def append(self, seconds: float) -> None:
            super().append(seconds)
            recorder.mark(seconds)

    @dataclasses.dataclass
    class MarkingTrainResult(base):  # type: ignore[misc, valid-type]
        def __post_init__(self) -> None:
            self.iteration_seconds = MarkingList(self.iteration_seconds)

    # patched before the algorithm module is imported, so its `from fleetrl.monitor import TrainResult` sees it
    monitor.TrainResult = monitor_logger.TrainResult = MarkingTrainResult
    from fleetrl.monitor import trainlog

    algo = FLEETRL_KINDS[opts.run_one]
    module = importlib.import_module(f"fleetrl.algos.{algo}")

    trainlog.TrainResult = MarkingTrainResult  # the session's log makes the result
    argv = shlex.split(opts.flags) + ["--env-id", opts.env_id, "--run-dir", opts.run_dir, "--no-progress",
                                      "--checkpoint-every", "1000000000", "--cuda" if opts.cuda else "--no-cuda"]
    args = tyro.cli(module.Args, args=argv, prog=f"fleetrl train {algo}")
    if args.num_envs is None or args.num_steps is None:
        raise SystemExit("ppo_speed: give --num-envs and --num-steps in the fleetrl flags, so the run's length is known")
    batch = args.num_envs * args.num_steps
    args.total_timesteps = opts.iterations * batch
    try:
        result = module.train(args, explicit=config.explicit_fields(argv, module.Args) | {"total_timesteps"})
    except FleetError as exc:  # the one clear paragraph the CLI would print, not a traceback
        raise SystemExit(f"fleetrl: error: {exc}") from None
    if not recorder.ends:  # the hook never fired (train built its result some other way): wall times only
        for seconds in result.iteration_seconds:
            recorder.mark(seconds)
        recorder.cpu.clear()
    return batch


def run_one(opts: argparse.Namespace) -> None:
    """Entry of the subprocess: train, then print one line of JSON for the parent."""
    import psutil

    sys.path.insert(0, HERE)  # plain_ppo, ppo_speed_envs
    recorder = Recorder(opts.iterations, opts.warmup)
    steps_per_iteration = run_plain(opts.run_one, opts, recorder) if opts.run_one in PLAIN_KINDS else run_fleetrl(opts, recorder)
    out = {"steps_per_iteration": steps_per_iteration, "iteration_seconds": recorder.iteration_seconds, "ends": recorder.ends,
           "first_start_epoch": recorder.first_start_epoch, "process_start_epoch": psutil.Process().create_time(),
           "cpu": recorder.cpu}
    print(RESULT_MARKER + json.dumps(out), flush=True)


# ============================================================================ the parent: run, alternate, summarise
@dataclass
class Measurement:
    ok: bool
    sps: float = 0.0
    cpu_per_1m: float | None = None
    cores_busy: float | None = None
    startup_s: float | None = None
    warmup_s: float = 0.0
    error: str = ""
    wall_s: float = 0.0  # the whole subprocess


def summarise(raw: dict[str, Any], warmup: int) -> Measurement:
    ends, seconds = raw["ends"], raw["iteration_seconds"]
    if len(ends) <= warmup:
        return Measurement(False, error=f"only {len(ends)} iterations recorded, need more than --warmup {warmup}")
    steps = raw["steps_per_iteration"] * (len(ends) - warmup)
    window = ends[-1] - ends[warmup - 1]  # from the end of the last warm-up iteration
    m = Measurement(True, sps=steps / window, warmup_s=sum(seconds[:warmup]))
    cpu = raw.get("cpu") or {}
    if "end" in cpu and "warm" in cpu:
        used = cpu["end"] - cpu["warm"]
        m.cpu_per_1m, m.cores_busy = used / steps * 1e6, used / window
    if raw.get("first_start_epoch") is not None:
        m.startup_s = raw["first_start_epoch"] - raw["process_start_epoch"]
    return m


def measure(variant: Variant, iterations: int, opts: argparse.Namespace) -> Measurement:
    """One run of one variant in a fresh subprocess (its own process group, so a timeout ends its workers too)."""
    with tempfile.TemporaryDirectory(prefix="ppo_speed_") as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), "--run-one", variant.kind, "--env-id", variant.env_id,
               "--iterations", str(iterations), "--warmup", str(opts.warmup), "--flags", shlex.join(variant.flags),
               "--run-dir", os.path.join(tmp, "run")] + (["--cuda"] if opts.cuda else [])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=opts.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own group: its env workers go with it
            stdout, stderr = proc.communicate()
            stderr += f"\n(killed after --timeout {opts.timeout:.0f} s)"
        wall = time.perf_counter() - started
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (stderr.strip() or stdout.strip()).splitlines()[-STDERR_TAIL_LINES:]
        return Measurement(False, error="\n".join(tail) or f"exit code {proc.returncode}, no output", wall_s=wall)
    m = summarise(json.loads(lines[-1][len(RESULT_MARKER):]), opts.warmup)
    m.wall_s = wall
    return m


def host_description() -> list[str]:
    import torch

    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    model = model or platform.processor() or "unknown CPU"
    have = lambda name: "yes" if name in flags else "no"  # noqa: E731
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return [f"Host: {model}, {os.cpu_count()} CPU cores; avx512f {have('avx512f')}, avx512_bf16 {have('avx512_bf16')}, "
            f"amx_bf16 {have('amx_bf16')}, amx_tile {have('amx_tile')}; GPU: {gpu}",
            f"Python {platform.python_version()}, torch {torch.__version__}; load average {os.getloadavg()[0]:.2f} at start"]


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def table(scenario: Scenario, results: dict[str, list[Measurement]], iterations: int, opts: argparse.Namespace) -> list[str]:
    ok = {name: [m for m in runs if m.ok] for name, runs in results.items()}
    median = {name: statistics.median(m.sps for m in runs) for name, runs in ok.items() if runs}
    out = [f"### {scenario.name}: {scenario.title}", "",
           f"{iterations} iterations a run, the first {opts.warmup} left out; medians of {opts.repeats} repeat(s), every repeat listed.", "",
           "| variant | SPS (median) | SPS (repeats) | vs baseline | CPU-s per 1M steps | cores busy | start-up s | warm-up s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures = []
    for variant in scenario.variants:
        runs, good = results[variant.name], ok[variant.name]
        if not good:
            out.append(f"| {variant.name} | FAILED | | | | | | |")
        else:
            ratio = "1.00x (baseline)" if variant.baseline is None else (
                f"{median[variant.name] / median[variant.baseline]:.2f}x vs {variant.baseline}" if variant.baseline in median else "-")
            repeats = ", ".join(fmt(m.sps) if m.ok else "FAILED" for m in runs)
            med = lambda key: statistics.median(getattr(m, key) for m in good) if all(getattr(m, key) is not None for m in good) else None  # noqa: E731
            out.append(f"| {variant.name} | {median[variant.name]:,.0f} | {repeats} | {ratio} | {fmt(med('cpu_per_1m'))} | "
                       f"{fmt(med('cores_busy'), '.2f')} | {fmt(med('startup_s'), '.1f')} | {fmt(med('warmup_s'), '.1f')} |")
        failures += [(variant, m) for m in runs if not m.ok][:1]  # the first failure of each variant is enough
    out.append("")
    for target in scenario.targets:
        if target.variant in median and target.baseline in median:
            ratio = median[target.variant] / median[target.baseline]
            shown = f"{ratio:.0%}" if target.at_least < 1 else f"{ratio:.2f}x"
            out.append(f"- Target: {target.label}: **{shown}**, {'met' if ratio >= target.at_least else 'NOT met'}.")
        else:
            out.append(f"- Target: {target.label}: not measured (a run failed).")
    for variant, m in failures:
        what = (f"fleetrl train {FLEETRL_KINDS[variant.kind]} --env-id {variant.env_id} {shlex.join(variant.flags)}" if variant.kind in FLEETRL_KINDS
                else f"benchmarks/plain_ppo.py on {variant.env_id}")
        out += ["", f"FAILED: {variant.name} (`{what}`), the last lines of its stderr:", "", "```", m.error, "```"]
    return out + [""]


def parse_variants(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """``"name=--flag a --flag2 b;name2=..."`` -> [(name, flags), ...]."""
    variants = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, flags = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--variants: expected NAME=FLAGS items separated by ';', got {item!r}")
        variants.append((name.strip(), tuple(shlex.split(flags))))
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="breakout,cartpole,slow-env-lag,straggler", help="comma-separated; default all")
    parser.add_argument("--variants", default="", help="extra fleetrl variants for breakout and cartpole: 'name=--flag a --flag2 b;name2=...'")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every variant (the median is reported)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations a run [breakout 10, cartpole 40, slow-env-lag and straggler 16]")
    parser.add_argument("--warmup", type=int, default=1, help="iterations left out at the start of each run (at least 1)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repeat, a few iterations a run")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU (fleetrl and the plain loop); default CPU")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before one run is killed and reported as FAILED")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables to FILE")
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures to FILE")
    # the subprocess side (internal)
    parser.add_argument("--run-one", choices=tuple(FLEETRL_KINDS) + PLAIN_KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--env-id", help=argparse.SUPPRESS)
    parser.add_argument("--flags", default="", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.run_one:
        return run_one(opts)

    if opts.quick:
        opts.repeats = 1
    chosen = [name.strip() for name in opts.scenarios.split(",") if name.strip()]
    known = scenarios(parse_variants(opts.variants))
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise SystemExit(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    todo = [known[name] for name in chosen]
    iterations = {s.name: opts.iterations or (s.quick_iterations if opts.quick else s.iterations) for s in todo}
    if opts.warmup < 1:  # the timed window opens at the end of an iteration: the only place fleetrl lets us look
        raise SystemExit("--warmup must be at least 1")
    if any(n <= opts.warmup for n in iterations.values()):
        raise SystemExit(f"--iterations must be above --warmup ({opts.warmup})")

    with contextlib.ExitStack() as servers:
        if any(v.env_id == SOCKET_ENV for s in todo for v in s.variants):
            from socket_sim import running_server

            servers.enter_context(running_server())  # the simulator server, for the runs; stopped after them
        run_all(todo, iterations, opts)


def run_all(todo: list[Scenario], iterations: dict[str, int], opts: argparse.Namespace) -> None:
    header = host_description()
    for line in header:
        print(line, flush=True)
    results: dict[str, dict[str, list[Measurement]]] = {s.name: {v.name: [] for v in s.variants} for s in todo}
    raw_log: list[dict[str, Any]] = []
    started = time.perf_counter()
    for repeat in range(opts.repeats):
        for scenario in todo:  # A B A B ...: every variant once per repeat, so drift hits them alike
            for variant in scenario.variants:
                m = measure(variant, iterations[scenario.name], opts)
                results[scenario.name][variant.name].append(m)
                raw_log.append({"scenario": scenario.name, "variant": variant.name, "repeat": repeat,
                                "flags": list(variant.flags), "env_id": variant.env_id, **dataclasses.asdict(m)})
                state = f"{m.sps:,.0f} SPS" if m.ok else "FAILED"
                print(f"[repeat {repeat + 1}/{opts.repeats}] {scenario.name} / {variant.name}: {state} "
                      f"({m.wall_s:.0f} s; {time.perf_counter() - started:.0f} s so far)", file=sys.stderr, flush=True)

    lines = ["## PPO speed (benchmarks/ppo_speed.py)", "", *[f"{line}  " for line in header],
             f"Command: `python benchmarks/ppo_speed.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`; "
             f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f} at the end.", ""]
    for scenario in todo:
        lines += table(scenario, results[scenario.name], iterations[scenario.name], opts)
    text = "\n".join(lines)
    print("\n" + text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"host": header, "argv": sys.argv[1:], "iterations": iterations, "warmup": opts.warmup, "runs": raw_log}, f, indent=1)


if __name__ == "__main__":
    main()
