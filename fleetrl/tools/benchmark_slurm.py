"""`fleetrl benchmark` on Slurm: the job array script (one task per env x seed, requeued with a checkpoint when Slurm
warns), written for `sbatch` by hand (--slurm-template) or submitted and followed until its tasks end (--slurm)."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from fleetrl.errors import FleetError
from fleetrl.tools import slurm_array, slurm_jobs
from fleetrl.tools.benchmark_runs import Result, Run, log_path, progress_line, read_status, status_path, train_extras
from fleetrl.tools.live import Display
from fleetrl.tools.returns import final_return
from fleetrl.tools.slurm import shell_words, write_array_script
from fleetrl.tools.slurm_array import ArrayJob, Task

SLURM_GRACE_S = 120  # the warning before the time limit: one iteration and a checkpoint fit well within it
TOOL = "benchmark"

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
# a task's first start begins its log afresh; a requeued start appends, so the log keeps what the earlier starts said
if [ "${{SLURM_RESTART_COUNT:-0}}" -eq 0 ]; then
    : > "$LOG"
else
    echo "--- $(date -Is) requeued: start $(( SLURM_RESTART_COUNT + 1 )) of this task, on $(hostname)" >> "$LOG"
fi
echo "\\$ ${{CMD[*]}}" >> "$LOG"
# the run goes to the background, so that this shell can take Slurm's signals while it trains
"${{CMD[@]}}" >> "$LOG" 2>&1 &
RUN_PID=$!
requeue() {{  # USR1: the time limit is near (or `scancel --signal=USR1 --batch`): checkpoint, then requeue this task
    trap '' USR1 TERM
    echo "$(date -Is) USR1 (Slurm warned of the time limit or a preemption): stopping the run with a checkpoint, then requeueing this task" >> "$LOG"
    kill -TERM "$RUN_PID" 2>/dev/null
    wait "$RUN_PID"
    echo "$(date -Is) the run stopped (exit code $?); requeueing" >> "$LOG"
    scontrol requeue "${{SLURM_ARRAY_JOB_ID:-${{SLURM_JOB_ID:-}}}}${{SLURM_ARRAY_JOB_ID:+_$SLURM_ARRAY_TASK_ID}}"
    exit 0
}}
stop() {{  # SIGTERM: scancel, `scontrol requeue` or a preemption; whether the task ends or runs again is up to the sender
    trap '' USR1 TERM
    echo "$(date -Is) SIGTERM (scancel, scontrol requeue or a preemption): the run writes a checkpoint and stops" >> "$LOG"
    kill -TERM "$RUN_PID" 2>/dev/null  # Slurm signals every process of the task; `scancel --batch` only this shell
    wait "$RUN_PID"
    exit 143
}}
trap requeue USR1
trap stop TERM
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
    return write_array_script(out, TOOL, len(runs), cpus, f"{len(runs)} tasks, one per env x seed.", body, about, directives)


def check_slurm() -> None:
    """--slurm: refuse, before anything is written, where Slurm does not answer."""
    slurm_jobs.check_reachable(instead="Without Slurm, leave out --slurm to run here, or write the script with --slurm-template.")


class BenchmarkStopped(FleetError):
    """Ctrl-C or SIGTERM while following the array: it was cancelled; the same command resumes it."""


def run_array(runs: list[Run], todo: list[Run], base: list[str], out: Path, cpus: int) -> list[Result]:
    """Submit the ``todo`` runs of the grid ``runs`` as one job array and follow it until each task has ended; their
    results, collected as the local pool collects them (status files, final returns). Ctrl-C cancels the array."""
    earlier = slurm_array.live_array(out, TOOL)
    if earlier is not None:
        job_id, live = earlier
        raise FleetError(f"{out} has the Slurm array {job_id} of an earlier call still pending or running ({', '.join(live[:4])}"
                         f"{', ...' if len(live) > 4 else ''}); submitting again would run those runs twice. Wait for it "
                         f"(squeue -j {job_id}) and run this command again for the summary, or cancel it (scancel {job_id}).")
    script = write_slurm_script(out, base, runs, cpus)
    for run in todo:  # a failed run's status from an earlier call must not stand for this call's task
        status_path(out, run).unlink(missing_ok=True)
    indices = {runs.index(run): run for run in todo}
    job_id = slurm_array.submit(script, list(indices), cwd=out.resolve())
    tasks = [Task(i, f"{run.env_id} seed {run.seed}", log_path(out, run), output=out / "logs" / f"slurm_{job_id}_{i}.out")
             for i, run in indices.items()]
    slurm_array.record(out, TOOL, job_id, tasks)
    display = Display()
    display.event(f"submitted {script} as the Slurm array {job_id} (tasks {slurm_jobs.index_list(list(indices))}); "
                  f"Ctrl-C cancels it")
    results: list[Result] = []

    def collect(task: Task) -> None:
        results.append(task_result(indices[task.index], task, job_id, out))
        display.event(f"[{len(results)}/{len(tasks)}] {progress_line(results[-1], out)}")

    job = ArrayJob(job_id, tasks, display, on_end=collect)
    try:
        job.follow()
    finally:
        display.close()
    if job.stopped_by is not None:
        error = BenchmarkStopped(f"stopped by {'SIGTERM' if job.stopped_by == signal.SIGTERM else 'Ctrl-C'}: the Slurm array {job_id} was "
                                 f"cancelled, and its running runs wrote a checkpoint. The same command submits the unfinished runs "
                                 f"again; they resume (--resume auto), and finished runs are skipped.")
        error.exit_code = 128 + job.stopped_by
        raise error
    return results


def task_result(run: Run, task: Task, job_id: str, out: Path) -> Result:
    """A task's run as the local pool would report it: from the status file the task wrote; from Slurm's account of the
    task when it wrote none (cancelled, timed out, its node failed)."""
    status = read_status(status_path(out, run)) or {}
    result = Result(run, int(status.get("returncode", task.returncode)), float(status.get("wall_s", float("nan"))), task=task, job_id=job_id)
    result.final_return = final_return(out / run.name) if result.ok else None
    return result
