"""The tuner: worker threads that each ask the study for a trial, run its runs, report aligned scores to the pruner, and
tell the study how the trial ended, until the study has --trials; heartbeats, and the trials of dead tuners."""

from __future__ import annotations

import math
import os
import shlex
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from fleetrl.cores import available_cores
from fleetrl.tools.runs import child_env, describe_exit, has_flag, log_tail, resolve_command, run_name, signal_group
from fleetrl.tools.tune.args import TuneArgs
from fleetrl.tools.tune.report import Display
from fleetrl.tools.tune.score import trial_score
from fleetrl.tools.tune.space import Param, format_value
from fleetrl.tools.tune.storage import StorageSpec, StudyLock, heartbeat_interval, requeue_stale
from fleetrl.tools.tune.study import counted
from fleetrl.tools.tune.train_command import Algo, command_sets
from fleetrl.tools.tune.trials import Outcome, TrialRun, stop_trial_runs

POLL_S = 0.2  # how often a trial's processes and new TensorBoard records are checked: an ended or weak run is seen soon
STATUS_S = 1.0  # how often the status line re-reads the study's trials (a query of the whole study on a shared database)


class Tuner:
    """Worker threads that each ask the study for a trial, run it, and tell the result, until the study has --trials."""

    def __init__(self, args: TuneArgs, algo: Algo, params: list[Param], targets: dict, study, storage, spec: StorageSpec,
                 out: Path, report_every: int, display: Display):
        self.args, self.algo, self.params, self.targets = args, algo, params, targets
        self.study, self.storage, self.spec, self.out = study, storage, spec, out
        self.report_every, self.display = report_every, display
        self.seeds = [args.start_seed + i for i in range(args.num_seeds)]
        self.envs = list(dict.fromkeys(args.env_ids))
        self.runs_per_trial = len(self.envs) * len(self.seeds)
        self.wave = min(self.runs_per_trial, args.parallel)  # a trial's runs at once; the rest wait for a free slot
        self.trials_at_once = max(1, args.parallel // self.wave)
        self.threads = max(1, available_cores() // args.parallel)
        self.gpus = visible_gpus() if not command_sets(algo.flags, "cuda") or has_flag(algo.flags, "--cuda") else []
        self.stop = threading.Event()  # Ctrl-C or SIGTERM: stop the running trials, record them, start no more
        self.kill_now = threading.Event()  # a second one: SIGKILL the runs at once
        self.stopped_by: int | None = None
        self.lock = StudyLock(spec, storage, study.study_name)
        self.heartbeat_s = heartbeat_interval(args.stale_after)
        self._live: list[TrialRun] = []
        self._live_lock = threading.Lock()

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        """Run the workers until the study has --trials (or :meth:`request_stop`); Ctrl-C and SIGTERM are caught here
        (in the main thread) so that no storage call is cut in half."""
        workers = [threading.Thread(target=self.worker, args=(list(range(i * self.wave, (i + 1) * self.wave)),), name=f"tune-{i}", daemon=True)
                   for i in range(self.trials_at_once)]
        in_main = threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, self.request_stop) for signum in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        try:
            for worker in workers:
                worker.start()
            said, killed, shown = False, False, 0.0
            while any(w.is_alive() for w in workers):
                if self.stop.is_set() and not said:
                    said = True
                    self.display.event("stopping: the running trials get SIGTERM, then are recorded as failed and queued to run again "
                                       "(Ctrl-C again kills them at once)")
                if self.kill_now.is_set() and not killed:
                    killed = True
                    with self._live_lock:
                        for run in self._live:
                            if run.proc is not None:
                                signal_group(run.proc, signal.SIGKILL)
                if time.monotonic() - shown >= STATUS_S:
                    self.show_status()
                    shown = time.monotonic()
                for w in workers:
                    w.join(timeout=POLL_S / len(workers))
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.show_status(force=True)

    def show_status(self, force: bool = False) -> None:
        try:
            self.display.status(self.study, self.args.trials, force=force)
        except Exception:  # noqa: BLE001 - the status line is a view: a storage hiccup must not stop the trials
            pass

    def request_stop(self, signum: int = signal.SIGINT, frame: Any = None) -> None:
        """The signal handler: the first stop asks the workers to stop their trials; a second kills the runs at once."""
        if self.stop.is_set():
            self.kill_now.set()
            return
        self.stopped_by = signum
        self.stop.set()

    def worker(self, slots: list[int]) -> None:
        while not self.stop.is_set():
            try:
                asked = self.next_trial()
            except Exception as exc:  # noqa: BLE001 - a storage hiccup ends this worker, not the others, and is said
                self.display.event(f"worker stopped: could not get a trial from the storage: {type(exc).__name__}: {exc}")
                return
            if asked is None:
                return
            trial, values = asked
            try:
                outcome = self.run_trial(trial, values, slots)
            except Exception as exc:  # noqa: BLE001 - the tuner's own fault in one trial: record it, go on
                outcome = Outcome("failed", reason=f"the tuner failed while running it: {type(exc).__name__}: {exc}")
            self.finish(trial, outcome)

    def next_trial(self):
        """Under the study lock: fail dead tuners' trials, then ask for a trial if the study has fewer than --trials."""
        with self.lock.held():
            if self.stop.is_set():
                return None
            self.sweep_stale()
            if counted(self.study.get_trials(deepcopy=False)) >= self.args.trials:
                return None
            trial = self.study.ask()
            self.beat(trial)
        values = {p.name: p.suggest(trial) for p in self.params}
        return trial, values

    # ------------------------------------------------------------------ heartbeats and dead tuners
    def beat(self, trial) -> None:
        """Tell the storage this trial's tuner is alive: Optuna's heartbeat on RDB storages, a user attribute on a journal."""
        if self.spec.kind == "journal":
            trial.set_user_attr("heartbeat", time.time())
        else:
            self.storage.record_heartbeat(trial._trial_id)

    def sweep_stale(self) -> None:
        """Fail the RUNNING trials of tuners that stopped sending heartbeats (killed), and queue their parameters again."""
        import optuna
        from optuna.trial import TrialState

        if self.spec.kind != "journal":
            optuna.storages.fail_stale_trials(self.study)  # the storage's callback queues them again
            return
        now = time.time()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            last = t.user_attrs.get("heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else now)
            if now - last > self.args.stale_after:
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                requeue_stale(self.study, t)
                self.display.event(f"trial {t.number}: no heartbeat for {now - last:.0f}s (its tuner was stopped); failed, and queued to run again")

    # ------------------------------------------------------------------ one trial
    def train_flags(self, values: dict[str, Any]) -> list[str]:
        return [flag for p in self.params for flag in p.flags(values[p.name])]

    def run_command(self, values: dict, run: TrialRun) -> list[str]:
        extras = [] if command_sets(self.algo.flags, "torch_threads") or "torch_threads" in {p.field for p in self.params} \
            else ["--torch-threads", str(self.threads)]
        extras += [] if command_sets(self.algo.flags, "progress") else ["--no-progress"]
        return [*resolve_command(self.algo.base), *self.train_flags(values), *extras,
                "--env-id", run.env_id, "--seed", str(run.seed), "--run-dir", str(run.run_dir)]

    def trial_folder(self, number: int) -> Path:
        folder = self.out / f"trial_{number:04d}"
        if folder.exists():  # left by an earlier study in this --out: never mix two trials' logs
            folder = self.out / f"trial_{number:04d}_{int(time.time())}"
        return folder

    def run_trial(self, trial, values: dict[str, Any], slots: list[int]) -> Outcome:
        folder = self.trial_folder(trial.number).resolve()
        runs = [TrialRun(env_id, seed, folder / run_name(env_id, seed), folder / f"{run_name(env_id, seed)}.log") for env_id in self.envs for seed in self.seeds]
        trial.set_user_attr("run_dirs", [str(r.run_dir) for r in runs])
        trial.set_user_attr("logs", [str(r.log_path) for r in runs])
        trial.set_user_attr("command", shlex.join([*self.algo.base, *self.train_flags(values)]))
        trial.set_user_attr("host", socket.gethostname())  # tuners on several machines (a Slurm array) share the study
        shown = " ".join(f"{k}={format_value(v) if not isinstance(v, float) else f'{v:.4g}'}" for k, v in values.items())
        self.display.event(f"trial {trial.number} started: {shown or '(no parameters)'}")
        with self._live_lock:
            self._live += runs
        try:
            return self._follow(trial, values, runs, list(slots))
        finally:
            stop_trial_runs(runs)
            with self._live_lock:
                self._live = [r for r in self._live if r not in runs]

    def _follow(self, trial, values: dict, runs: list[TrialRun], free: list[int]) -> Outcome:
        pending, started = list(runs), []
        reported, start, last_beat = 0, time.monotonic(), time.monotonic()
        while True:
            for run in started:
                if run.slot is not None and not run.running:
                    free.append(run.slot)
                    run.slot = None
            while pending and free:
                run = pending.pop(0)
                run.slot = free.pop(0)
                env = child_env(self.threads)
                if self.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = self.gpus[run.slot % len(self.gpus)]
                run.start(self.run_command(values, run), env)
                started.append(run)
            if self.stop.wait(POLL_S):
                return Outcome("interrupted", reason="interrupted: the tuner was stopped (Ctrl-C or SIGTERM)")
            if time.monotonic() - last_beat >= self.heartbeat_s:
                self.beat(trial)
                last_beat = time.monotonic()
            failed = next((r for r in started if r.returncode not in (None, 0)), None)
            if failed is not None:
                tail = [line for line in log_tail(failed.log_path) if line.strip()]
                return Outcome("failed", reason=f"{failed.env_id} seed {failed.seed}: {describe_exit(failed.returncode)}"
                               + (f": {tail[-1].strip()}" if tail else ""), exit_code=failed.returncode, log=str(failed.log_path))
            for run in started:
                run.follower.update()
            done = not pending and not any(r.running for r in started)
            if done:
                for run in started:  # what the runs wrote between the last read and their exit
                    run.follower.update()
            # report each aligned step that every run of the trial has reached
            live = [r.follower.reached for r in runs if r.proc is None or r.running]
            reach = min(live) if live else max(r.follower.reached for r in runs)
            step = reported + self.report_every
            while step <= reach:
                value = trial_score({(r.env_id, r.seed): r.follower.score(self.args.last_episodes, step) for r in runs},
                                    self.envs, self.seeds, self.targets, self.args.aggregate)
                if value is not None:
                    if not math.isfinite(value):
                        return Outcome("failed", reason=f"the score is {value} at step {step:,}")
                    trial.report(value, step)
                    reported = step
                    if not done and trial.should_prune():
                        return Outcome("pruned", value=value, step=step, reason=f"score {value:.4g} at step {step:,}")
                step += self.report_every
            if done:
                value = trial_score({(r.env_id, r.seed): r.follower.score(self.args.last_episodes) for r in runs},
                                    self.envs, self.seeds, self.targets, self.args.aggregate)
                if value is None:
                    return Outcome("failed", reason="no episode finished in some run: raise --total-timesteps")
                if not math.isfinite(value):
                    return Outcome("failed", reason=f"the score is {value}")
                return Outcome("complete", value=value)
            if self.args.trial_timeout is not None and time.monotonic() - start > self.args.trial_timeout:
                return Outcome("failed", reason=f"timeout: still running after --trial-timeout {self.args.trial_timeout:g}s")

    def finish(self, trial, outcome: Outcome) -> None:
        """Record the outcome in the study (a trial another tuner already failed as stale is left as it is)."""
        from optuna.trial import TrialState

        attrs = {"fail_reason": outcome.reason, "exit_code": outcome.exit_code, "log": outcome.log} if outcome.state in ("failed", "interrupted") \
            else {"pruned_at_step": outcome.step} if outcome.state == "pruned" else {}
        try:
            for key, value in attrs.items():
                if value is not None:
                    trial.set_user_attr(key, value)
            if outcome.state == "complete":
                self.study.tell(trial, outcome.value, skip_if_finished=True)
            else:
                state = TrialState.PRUNED if outcome.state == "pruned" else TrialState.FAIL
                self.study.tell(trial, state=state, skip_if_finished=True)
            if outcome.state == "interrupted":
                self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "retry_reason": "interrupted"})
        except Exception as exc:  # noqa: BLE001 - e.g. failed meanwhile by another tuner's stale sweep
            self.display.event(f"trial {trial.number}: could not record its result ({type(exc).__name__}: {exc})")
            return
        if outcome.state == "complete":
            self.display.event(f"trial {trial.number} complete: score {outcome.value:.4g}")
        elif outcome.state == "pruned":
            self.display.event(f"trial {trial.number} pruned at step {outcome.step:,} ({outcome.reason})")
        else:
            where = f"; log: {outcome.log}" if outcome.log else ""
            self.display.event(f"trial {trial.number} {outcome.reason}; queued to run again" if outcome.state == "interrupted"
                               else f"trial {trial.number} FAILED: {outcome.reason}{where}")


def visible_gpus() -> list[str]:
    """The GPUs runs are spread over, in turn: CUDA_VISIBLE_DEVICES's entries, else every GPU NVML sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [e.strip() for e in visible.split(",") if e.strip() and e.strip() != "-1"]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no GPU: runs use the CPU
        return []
