"""`fleetrl benchmark`: run one command over a grid of env ids x seeds on a pool of worker processes and
summarise each env's final return; or write a Slurm array script that runs the same grid."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

from fleetrl import config
from fleetrl.cores import available_cores
from fleetrl.errors import FleetError
from fleetrl.tools import stats
from fleetrl.tools.processes import (
    child_env,
    describe_exit,
    has_flag,
    log_tail,
    resolve_command,
    run_name,
    signal_group,
    start_run,
    stop_runs,
    train_args,
)
from fleetrl.tools.returns import FINAL_POINTS, RETURN_TAG, final_return
from fleetrl.tools.slurm import shell_words, write_array_script
from fleetrl.tools.text import markdown_table, plural, print_table

RUNNER_FLAGS = ("--env-id", "--seed", "--run-dir")  # the runner appends these to every run


@dataclass
class BenchmarkArgs:
    env_ids: list[str]
    """env ids to run the command on"""
    num_seeds: int = 3
    """seeds per env id: start-seed, start-seed + 1, ..."""
    start_seed: int = 1
    """the first seed"""
    workers: int = 1
    """runs at the same time; each gets cores / workers CPU threads"""
    out: str | None = None
    """output folder: run folders, logs/, status/, summary.csv, summary.md [runs/benchmark_{timestamp}];
    give the same folder again to skip the runs that already finished"""
    slurm_template: bool = False
    """write OUT/benchmark.slurm (a Slurm job array, one task per env x seed) instead of running here"""
    slurm_cpus_per_task: int = 1
    """with --slurm-template: CPU cores each array task asks for (and uses as its thread count)"""
    stats: tyro.conf.OmitArgPrefixes[stats.StatsArgs] = field(default_factory=stats.StatsArgs)
    """the summary's confidence intervals: how returns become scores, and the bootstrap"""


DESCRIPTION = """Run a command for every env id x seed, several at a time, then summarise the final returns.

    fleetrl benchmark --env-ids CartPole-v1 Acrobot-v1 --num-seeds 3 --workers 2 -- fleetrl train ppo --total-timesteps 100000

Everything after `--` is the command; the runner appends `--env-id E --seed S --run-dir OUT/E__S` to it.
"""


@dataclass(frozen=True)
class Run:
    env_id: str
    seed: int

    @property
    def name(self) -> str:
        """The run's folder, log and status name."""
        return run_name(self.env_id, self.seed)


@dataclass
class Result:
    run: Run
    returncode: int
    wall_s: float
    skipped: bool = False  # finished in an earlier call with the same --out
    final_return: float | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


# ---- the command each run executes ------------------------------------------------------------


def train_extras(base: list[str], threads: str) -> list[str]:
    """Flags added to a `fleetrl train` command: a thread count that fits the pool, and `--resume auto`
    so a run interrupted earlier continues from its newest checkpoint instead of mixing two curves."""
    if train_args(base) is None:
        return []
    extras = [] if has_flag(base, "--torch-threads") else ["--torch-threads", threads]
    return extras + ([] if has_flag(base, "--resume") else ["--resume", "auto"])


def run_command(base: list[str], run: Run, out: Path, threads: int) -> list[str]:
    return [*resolve_command(base), *train_extras(base, str(threads)), "--env-id", run.env_id, "--seed", str(run.seed), "--run-dir", str(out / run.name)]


# ---- per-run status, so a rerun skips what finished ---------------------------------------------


def status_path(out: Path, run: Run) -> Path:
    return out / "status" / f"{run.name}.json"


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing, or cut short by a crash: the run is simply run again


def write_status(path: Path, status: dict) -> None:
    """Write then rename: a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(status) + "\n")
    os.replace(tmp, path)


# ---- running the grid ---------------------------------------------------------------------------


MAX_SEEDS = 10_000  # per env id: more is a typo, and would only fill the memory with the plan
RANGES = {
    "num_seeds": config.count("seeds per env id", high=MAX_SEEDS),
    "start_seed": config.SEED,
    "workers": config.count("runs at the same time"),
    "slurm_cpus_per_task": config.count("CPU cores each Slurm array task asks for"),
}


def plan(args: BenchmarkArgs) -> list[Run]:
    if not args.env_ids or not all(env_id.strip() for env_id in args.env_ids):
        raise FleetError(f"--env-ids needs one or more env ids, none empty, e.g. --env-ids CartPole-v1 Acrobot-v1; got {args.env_ids!r}.")
    config.check_ranges(args, RANGES)
    if args.start_seed + args.num_seeds - 1 > config.SEED.high:
        raise FleetError(f"--start-seed {args.start_seed} with --num-seeds {args.num_seeds} runs seeds past {config.SEED.high}, "
                         f"the largest seed; lower --start-seed.")
    if args.out is not None and not args.out.strip():
        raise FleetError("--out is empty: give the output folder, or leave it out for runs/benchmark_{timestamp}.")
    runs = [Run(env_id, args.start_seed + i) for env_id in dict.fromkeys(args.env_ids) for i in range(args.num_seeds)]
    names = [run.name for run in runs]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise FleetError(f"These env ids map to the same folder name {clash}: '/' and ':' become '-'. Run them in separate benchmarks.")
    return runs


def check_command(base: list[str]) -> None:
    if not base:
        raise FleetError(
            "`fleetrl benchmark` needs the command to run after `--`, e.g. "
            "fleetrl benchmark --env-ids CartPole-v1 --num-seeds 3 -- fleetrl train ppo --total-timesteps 100000"
        )
    given = [flag for flag in RUNNER_FLAGS if has_flag(base, flag)]
    if given:
        raise FleetError(f"Remove {', '.join(given)} from the command after `--`: the runner appends --env-id, --seed and --run-dir to each run itself.")


def finished_runs(runs: list[Run], out: Path, base: list[str]) -> set[Run]:
    """The runs an earlier call with this --out finished; refuses an --out that holds another command's runs."""
    done = set()
    for run in runs:
        status = read_status(status_path(out, run))
        if not status or not status.get("ok"):
            continue
        if status.get("command") != base:
            raise FleetError(
                f"{out} already holds a finished run ({run.name}) of another command: {shlex.join(status.get('command') or [])!r}, "
                f"not {shlex.join(base)!r}. Use a new --out, or delete {status_path(out, run)} to run it again."
            )
        done.add(run)
    return done


def execute(run: Run, base: list[str], out: Path, threads: int, stop: threading.Event, running: dict[Run, subprocess.Popen], lock: threading.Lock) -> Result | None:
    """One run in a process group of its own, its stdout and stderr in OUT/logs/{name}.log; None if the benchmark was
    stopped first."""
    if stop.is_set():
        return None
    log_path = out / "logs" / f"{run.name}.log"
    start = time.perf_counter()
    try:
        proc = start_run(run_command(base, run, out, threads), log_path, child_env(threads))
    except OSError as exc:
        with open(log_path, "a") as log:
            log.write(f"fleetrl benchmark: could not start the command: {exc}\n")
        returncode = 127  # the shell's code for a command that cannot run
    else:
        with lock:
            running[run] = proc
        if stop.is_set():  # stopped while this run was starting
            signal_group(proc, signal.SIGTERM)
        returncode = proc.wait()
        with lock:
            running.pop(run, None)
    wall_s = time.perf_counter() - start
    write_status(status_path(out, run), {"env_id": run.env_id, "seed": run.seed, "ok": returncode == 0, "returncode": returncode, "wall_s": round(wall_s, 3), "command": base})
    return Result(run, returncode, wall_s)


def run_grid(runs: list[Run], base: list[str], out: Path, workers: int, threads: int) -> list[Result]:
    stop, lock = threading.Event(), threading.Lock()
    running: dict[Run, subprocess.Popen] = {}
    results: list[Result] = []
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="benchmark")
    futures = [pool.submit(execute, run, base, out, threads, stop, running, lock) for run in runs]
    # a scheduler or `kill` stops the runner with SIGTERM: end the runs as Ctrl-C does, never orphan them
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        for done, future in enumerate(as_completed(futures), 1):
            result = future.result()
            result.final_return = final_return(out / result.run.name) if result.ok else None
            results.append(result)
            print(f"[{done}/{len(runs)}] {progress_line(result, out)}", flush=True)
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        with lock:
            procs = list(running.values())
        stop_runs(procs)  # each run's whole process group: the trainer and its env workers
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    pool.shutdown()
    return results


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def progress_line(result: Result, out: Path) -> str:
    run = result.run
    if result.ok:
        shown = "no episodes logged" if result.final_return is None else f"final return {result.final_return:.2f}"
        return f"ok      {run.env_id} seed {run.seed}: {shown} ({result.wall_s:.1f}s)"
    return f"FAILED  {run.env_id} seed {run.seed}: {describe_exit(result.returncode)} after {result.wall_s:.1f}s; log: {out / 'logs' / f'{run.name}.log'}"


def skipped_result(run: Run, out: Path) -> Result:
    status = read_status(status_path(out, run)) or {}
    return Result(run, 0, float(status.get("wall_s", float("nan"))), skipped=True, final_return=final_return(out / run.name))


# ---- the summary --------------------------------------------------------------------------------


def summarise(env_ids: list[str], results: list[Result]) -> list[dict]:
    """One row per env: final return mean and std over the seeds that logged one (std over seeds,
    as CleanRL's reports compute it), ok and failed seed counts, mean wall time of the ok runs."""
    rows = []
    for env_id in dict.fromkeys(env_ids):
        mine = [r for r in results if r.run.env_id == env_id]
        ok = [r for r in mine if r.ok]
        returns = [r.final_return for r in ok if r.final_return is not None]
        walls = [r.wall_s for r in (ok or mine) if np.isfinite(r.wall_s)]
        rows.append(
            {
                "env_id": env_id,
                "final_return_mean": float(np.mean(returns)) if returns else None,
                "final_return_std": float(np.std(returns)) if returns else None,
                "seeds_with_return": len(returns),
                "seeds_ok": len(ok),
                "seeds_failed": len(mine) - len(ok),
                "wall_s_mean": float(np.mean(walls)) if walls else None,
            }
        )
    return rows


SUMMARY_HEADER = ["env", "final return (mean ± std)", "seeds ok", "seeds failed", "wall time (mean)"]


def summary_cells(rows: list[dict]) -> list[list[str]]:
    cells = []
    for row in rows:
        if row["final_return_mean"] is None:
            shown = "-"
        else:
            shown = f"{row['final_return_mean']:.2f} ± {row['final_return_std']:.2f}"
            if row["seeds_with_return"] < row["seeds_ok"]:
                shown += f" ({row['seeds_with_return']} seeds)"
        wall = "-" if row["wall_s_mean"] is None else f"{row['wall_s_mean']:.1f}s"
        cells.append([row["env_id"], shown, str(row["seeds_ok"]), str(row["seeds_failed"]), wall])
    return cells


def interval_summary(env_ids: list[str], results: list[Result], scales: dict, args: stats.StatsArgs) -> tuple[list[stats.IntervalRow], list[str]]:
    """The confidence-interval rows of the final returns (per env, and over all envs when normalised), and the notes
    that say why a row is missing."""
    if not stats.available():
        return [], ["No confidence intervals: they need the 'stats' extra: pip install 'fleetrl[stats]'."]
    by_seed = sorted((r for r in results if r.ok and r.final_return is not None), key=lambda r: r.run.seed)
    returns = {env_id: [r.final_return for r in by_seed if r.run.env_id == env_id] for env_id in dict.fromkeys(env_ids)}
    rows = stats.interval_rows(returns, scales, args)
    if not any(row.estimates for row in rows):  # a table of dashes says less than this line
        return [], [f"No confidence intervals: they need {stats.MIN_RUNS} or more seeds with a final return per env."]
    return rows, [note for note in [stats.aggregate_note(scales)] if note]


def failure_report(result: Result, out: Path) -> str:
    run, log_path = result.run, out / "logs" / f"{result.run.name}.log"
    tail = log_tail(log_path)
    lines = [f"FAILED {run.env_id} seed {run.seed}: {describe_exit(result.returncode)} after {result.wall_s:.1f}s. Log: {log_path}"]
    lines.append(f"  last {len(tail)} lines of the log:")
    return "\n".join(lines + [f"  | {line}" for line in tail])


def write_summaries(out: Path, base: list[str], rows: list[dict], results: list[Result], intervals: list[stats.IntervalRow], stats_args: stats.StatsArgs) -> None:
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in rows)
    run_cells = [
        [
            r.run.env_id,
            str(r.run.seed),
            ("ok (earlier)" if r.skipped else "ok") if r.ok else describe_exit(r.returncode),
            "-" if r.final_return is None else f"{r.final_return:.2f}",
            f"{r.wall_s:.1f}s" if np.isfinite(r.wall_s) else "-",
            f"logs/{r.run.name}.log",
        ]
        for r in sorted(results, key=lambda r: (r.run.env_id, r.run.seed))
    ]
    parts = [
        f"# fleetrl benchmark: {out.name}",
        f"Command: `{shlex.join(base)}`; final return = mean of the last {FINAL_POINTS} `{RETURN_TAG}` points of each run, then mean ± std over seeds.",
        markdown_table(SUMMARY_HEADER, summary_cells(rows)),
        *(["## Confidence intervals", stats.explain(stats_args), markdown_table(stats.INTERVAL_HEADER, [row.cells() for row in intervals])] if intervals else []),
        "## Runs",
        markdown_table(["env", "seed", "status", "final return", "wall time", "log"], run_cells),
    ]
    failed = [r for r in results if not r.ok]
    if failed:
        parts += ["## Failed runs"] + ["```\n" + failure_report(r, out) + "\n```" for r in failed]
    (out / "summary.md").write_text("\n\n".join(parts) + "\n")
    stats.write_csv(out / "intervals.csv", intervals)


class BenchmarkFailed(FleetError):
    """Some runs failed; the others finished and are in the summary."""

    exit_code = 1


def run_benchmark(args: BenchmarkArgs, base: list[str]) -> list[Result]:
    """Run (or, with --slurm-template, script) every env x seed; returns the results of this call and earlier ones."""
    check_command(base)
    runs = plan(args)
    scales = stats.check_args(args.stats, list(dict.fromkeys(args.env_ids)), "--env-ids")
    out = Path(args.out or os.path.join("runs", f"benchmark_{int(time.time())}"))
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FleetError(f"Cannot create the output folder {out / 'logs'} ({exc.strerror or exc}). Give another --out.") from None
    if args.slurm_template:
        path = write_slurm_script(out, base, runs, args.slurm_cpus_per_task)
        envs = len(set(r.env_id for r in runs))
        print(f"wrote {path}: a Slurm job array of {plural(len(runs), 'task')} ({plural(envs, 'env')} x {plural(args.num_seeds, 'seed')}).")
        print(f"submit it with: sbatch {path}")
        print(f"afterwards, this command without --slurm-template and with --out {out} collects the summary (finished runs are skipped).")
        return []

    done = finished_runs(runs, out, base)
    todo = [run for run in runs if run not in done]
    threads = max(1, available_cores() // args.workers)
    envs = len(set(r.env_id for r in runs))
    print(
        f"fleetrl benchmark: {plural(len(runs), 'run')} ({plural(envs, 'env')} x {plural(args.num_seeds, 'seed')}), {len(todo)} to run "
        f"on {plural(args.workers, 'worker')} with {plural(threads, 'thread')} each; output in {out}",
        flush=True,
    )
    for run in runs:
        if run in done:
            print(f"skipped {run.env_id} seed {run.seed}: finished in an earlier call ({status_path(out, run)})", flush=True)
    results = [skipped_result(run, out) for run in runs if run in done] + run_grid(todo, base, out, args.workers, threads)

    rows = summarise(args.env_ids, results)
    print()
    print_table(SUMMARY_HEADER, summary_cells(rows), "fleetrl benchmark")
    intervals, notes = interval_summary(args.env_ids, results, scales, args.stats)
    if intervals:
        print()
        print_table(stats.INTERVAL_HEADER, [row.cells() for row in intervals], stats.TITLE)
    if notes or intervals:
        print("\n" + "\n".join(notes + ([stats.explain(args.stats)] if intervals else [])))
    write_summaries(out, base, rows, results, intervals, args.stats)
    print(f"\nsummary: {out / 'summary.csv'}, {out / 'summary.md'}" + (f", {out / 'intervals.csv'}" if intervals else ""))
    failed = [r for r in results if not r.ok]
    if failed:
        print()
        for result in failed:
            print(failure_report(result, out) + "\n", flush=True)
        raise BenchmarkFailed(
            f"{len(failed)} of {len(results)} runs failed (reports above; logs in {out / 'logs'}). "
            + ("The others finished. " if len(failed) < len(results) else "")
            + f"Fix the cause and run the same command with --out {out}: finished runs are skipped."
        )
    return results


# ---- Slurm --------------------------------------------------------------------------------------

SLURM_GRACE_S = 120  # the warning before the time limit: one iteration and a checkpoint fit well within it

SLURM_TASKS = """
# task i runs ENV_IDS[i] with SEEDS[i] in the folder NAMES[i]
ENV_IDS=({env_ids})
SEEDS=({seeds})
NAMES=({names})
ENV_ID=${{ENV_IDS[$SLURM_ARRAY_TASK_ID]}}
SEED=${{SEEDS[$SLURM_ARRAY_TASK_ID]}}
NAME=${{NAMES[$SLURM_ARRAY_TASK_ID]}}

OUT={out_q}
LOG="$OUT/logs/$NAME.log"
STATUS="$OUT/status/$NAME.json"
THREADS=${{SLURM_CPUS_PER_TASK:-{cpus}}}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
mkdir -p "$OUT/logs" "$OUT/status"

if grep -q '"ok": true' "$STATUS" 2>/dev/null; then
    echo "skipped $ENV_ID seed $SEED: finished earlier ($STATUS)"
    exit 0
fi

CMD=({command} --env-id "$ENV_ID" --seed "$SEED" --run-dir "$OUT/$NAME")
START=$(date +%s.%N)
echo "\\$ ${{CMD[*]}}" > "$LOG"
# the run goes to the background, so that this shell can take Slurm's warning signal while it trains
"${{CMD[@]}}" >> "$LOG" 2>&1 &
RUN_PID=$!
requeue() {{
    echo "$(date -Is) $1: stopping the run with a checkpoint, then requeueing this task" >> "$LOG"
    kill -TERM "$RUN_PID" 2>/dev/null
    wait "$RUN_PID"
    echo "$(date -Is) the run stopped (exit code $?); requeueing" >> "$LOG"
    scontrol requeue "${{SLURM_ARRAY_JOB_ID:-${{SLURM_JOB_ID:-}}}}${{SLURM_ARRAY_JOB_ID:+_$SLURM_ARRAY_TASK_ID}}"
    exit 0
}}
trap 'requeue "Slurm warned of the time limit or a preemption (USR1)"' USR1
trap 'requeue "SIGTERM"' TERM
wait "$RUN_PID"
RC=$?
WALL=$(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN {{ printf "%.3f", e - s }}')
OK=$([ "$RC" -eq 0 ] && echo true || echo false)
# the same status file the local runner writes, written then renamed so it is never half there
printf '{{"env_id": "%s", "seed": %s, "ok": %s, "returncode": %s, "wall_s": %s, "command": %s}}\\n' \\
    "$ENV_ID" "$SEED" "$OK" "$RC" "$WALL" {command_json} > "$STATUS.tmp.$$" && mv -f "$STATUS.tmp.$$" "$STATUS"
echo "$ENV_ID seed $SEED: exit code $RC after ${{WALL}}s; log: $LOG"
exit $RC
"""


def write_slurm_script(out: Path, base: list[str], runs: list[Run], cpus: int) -> Path:
    """OUT/benchmark.slurm: array task i runs the grid's run i, and requeues itself, checkpointed, when Slurm warns."""
    out = out.resolve()
    body = SLURM_TASKS.format(
        env_ids=" ".join(shlex.quote(r.env_id) for r in runs),
        seeds=" ".join(str(r.seed) for r in runs),
        names=" ".join(shlex.quote(r.name) for r in runs),
        out_q=shlex.quote(str(out)),
        cpus=cpus,
        command=" ".join([*shell_words(base), *train_extras(base, '"$THREADS"')]),
        command_json=shlex.quote(json.dumps(base)),
    )
    about = ("A task skips a run that already finished. When the array is done, the same `fleetrl benchmark`",
             f"command without --slurm-template and with --out {out} writes the summary.")
    directives = (f"# Preemption and time limits: Slurm signals this script (B:) {SLURM_GRACE_S} s before the end; the run then writes a",
                  "# checkpoint and stops, and the task is requeued; the requeued task resumes it (--resume auto).",
                  "#SBATCH --requeue",
                  f"#SBATCH --signal=B:USR1@{SLURM_GRACE_S}")
    return write_array_script(out, "benchmark", len(runs), cpus, f"{len(runs)} tasks, one per env x seed.", body, about, directives)
