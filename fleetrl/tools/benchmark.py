"""`fleetrl benchmark`: run one command over a grid of env ids x seeds, on a pool of worker processes here or as a Slurm
job array (fleetrl/tools/benchmark_slurm.py), and summarise each env's final return."""

from __future__ import annotations

import csv
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
from fleetrl.tools.benchmark_runs import (
    Result,
    Run,
    failure_report,
    finished_runs,
    log_path,
    progress_line,
    run_command,
    skipped_result,
    status_path,
    write_status,
)
from fleetrl.tools.benchmark_slurm import check_slurm, run_array, write_slurm_script
from fleetrl.tools.returns import FINAL_POINTS, RETURN_TAG, final_return
from fleetrl.tools.runs import child_env, describe_exit, has_flag, signal_group, start_run, stop_runs
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
    """runs at the same time here; each gets cores / workers CPU threads (with --slurm, Slurm decides)"""
    out: str | None = None
    """output folder: run folders, logs/, status/, summary.csv, summary.md [runs/benchmark_{timestamp}];
    give the same folder again to skip the runs that already finished"""
    slurm: bool = False
    """run the grid on Slurm: submit OUT/benchmark.slurm (a job array, one task per env x seed) and follow it until every
    task has ended, then summarise as here. sbatch's own variables set the rest (SBATCH_PARTITION, SBATCH_TIMELIMIT, ...)"""
    slurm_template: bool = False
    """write OUT/benchmark.slurm (a Slurm job array, one task per env x seed) for sbatch, instead of running anything"""
    slurm_cpus_per_task: int = 1
    """with --slurm or --slurm-template: CPU cores each array task asks for (and uses as its thread count)"""
    stats: tyro.conf.OmitArgPrefixes[stats.StatsArgs] = field(default_factory=stats.StatsArgs)
    """the summary's confidence intervals: how returns become scores, and the bootstrap"""


DESCRIPTION = """Run a command for every env id x seed, several at a time, then summarise the final returns.

    fleetrl benchmark --env-ids CartPole-v1 Acrobot-v1 --num-seeds 3 --workers 2 -- fleetrl train ppo --total-timesteps 100000

Everything after `--` is the command; the runner appends `--env-id E --seed S --run-dir OUT/E__S` to it.
With --slurm the grid runs as a Slurm job array instead, one task per run, followed until every task has ended.
"""


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


def execute(run: Run, base: list[str], out: Path, threads: int, stop: threading.Event, running: dict[Run, subprocess.Popen], lock: threading.Lock) -> Result | None:
    """One run in a process group of its own, its stdout and stderr in OUT/logs/{name}.log; None if the benchmark was
    stopped first."""
    if stop.is_set():
        return None
    start = time.perf_counter()
    try:
        proc = start_run(run_command(base, run, out, threads), log_path(out, run), child_env(threads))
    except OSError as exc:
        with open(log_path(out, run), "a") as log:
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
    """Run (here or, with --slurm, on Slurm; with --slurm-template only script) every env x seed; returns the results of this
    call and earlier ones."""
    check_command(base)
    if args.slurm and args.slurm_template:
        raise FleetError("Give --slurm (submit the array and follow it) or --slurm-template (only write the script, to submit by hand), not both.")
    runs = plan(args)
    scales = stats.check_args(args.stats, list(dict.fromkeys(args.env_ids)), "--env-ids")
    if args.slurm:
        check_slurm()
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
    where = (f"as a Slurm job array, {plural(args.slurm_cpus_per_task, 'CPU core')} a task" if args.slurm
             else f"on {plural(args.workers, 'worker')} with {plural(threads, 'thread')} each")
    print(f"fleetrl benchmark: {plural(len(runs), 'run')} ({plural(envs, 'env')} x {plural(args.num_seeds, 'seed')}), {len(todo)} to run "
          f"{where}; output in {out}", flush=True)
    for run in runs:
        if run in done:
            print(f"skipped {run.env_id} seed {run.seed}: finished in an earlier call ({status_path(out, run)})", flush=True)
    if not todo:
        ran = []
    elif args.slurm:
        ran = run_array(runs, todo, base, out, args.slurm_cpus_per_task)
    else:
        ran = run_grid(todo, base, out, args.workers, threads)
    results = [skipped_result(run, out) for run in runs if run in done] + ran

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
