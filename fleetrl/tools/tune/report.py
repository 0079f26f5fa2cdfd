"""What the tuner shows: a live status line under the trial events while it runs, and at the end the best trial with its
`fleetrl train` command, trials.csv, the PNGs and the failed trials' log tails."""

from __future__ import annotations

import csv
import shlex
import warnings
from pathlib import Path

from fleetrl.files import atomic_file, replacing
from fleetrl.tools import live
from fleetrl.tools.runs import log_tail
from fleetrl.tools.text import plural
from fleetrl.tools.tune.args import TuneArgs
from fleetrl.tools.tune.space import Param, format_value
from fleetrl.tools.tune.storage import StorageSpec
from fleetrl.tools.tune.study import study_counts
from fleetrl.tools.tune.train_command import Algo

FAILURES_SHOWN = 5  # the failed trials whose log tails the final report shows


def status_text(counts: dict, total: int) -> str:
    best = counts["best"]
    shown = f"best {best.value:.4g} (trial {best.number})" if best is not None else "best -"
    return (f"trials {counts['done']}/{total} done: {counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed; "
            f"{counts['running']} running; {shown}")


class Display(live.Display):
    """The live view (fleetrl/tools/live.py) with the study's counts as its status line."""

    def status(self, study, total: int, force: bool = False) -> None:
        self.show(status_text(study_counts(study.get_trials(deepcopy=False)), total), force)


# ---- results ----------------------------------------------------------------------------------


def write_trials_csv(trials: list, params: list[Param], path: Path) -> None:
    header = ["number", "state", "value", "duration_s", *[p.name for p in params], "pruned_at_step", "exit_code", "fail_reason",
              "log", "run_dirs", "retry_of", "host", "datetime_start"]

    # through a temporary file: tuners of one study finishing together never leave half a file
    with atomic_file(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for t in trials:
            attrs = t.user_attrs
            duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
            writer.writerow([t.number, t.state.name, "" if t.value is None else t.value, "" if duration is None else round(duration, 1),
                             *[format_value(t.params[p.name]) if p.name in t.params else "" for p in params],
                             attrs.get("pruned_at_step", ""), "" if attrs.get("exit_code") is None else attrs["exit_code"],
                             attrs.get("fail_reason", ""), attrs.get("log", ""), ";".join(attrs.get("run_dirs", [])),
                             "" if attrs.get("retry_of") is None else attrs["retry_of"], attrs.get("host", ""),
                             t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else ""])


def write_plots(study, out: Path) -> list[str]:
    """optimization_history.png and param_importances.png; what was drawn, or why not."""
    from optuna.trial import TrialState

    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a cluster node or in CI
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    notes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plots are "experimental" in Optuna
        for name, needs, draw in (("optimization_history.png", 1, optuna_plots.plot_optimization_history),
                                  ("param_importances.png", 2, _plot_importances)):
            if complete < needs:
                notes.append(f"{name}: not drawn, it needs {plural(needs, 'complete trial')} ({complete} so far)")
                continue
            try:
                ax = draw(study)
                fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                with replacing(out / name) as tmp:
                    fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
                plt.close(fig)
                notes.append(str(out / name))
            except Exception as exc:  # noqa: BLE001 - a plot is a convenience: say why it is missing, keep the results
                notes.append(f"{name}: not drawn ({type(exc).__name__}: {exc})")
    return notes


def _plot_importances(study):
    from optuna.visualization import matplotlib as optuna_plots

    try:
        return optuna_plots.plot_param_importances(study)
    except ImportError:  # Optuna 4's default evaluator (fANOVA) needs scikit-learn; PED-ANOVA does not
        import optuna

        return optuna_plots.plot_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())


def report(study, tuner_args: TuneArgs, algo: Algo, params: list[Param], out: Path, spec: StorageSpec, plots: bool = True) -> None:
    """The final summary: the best trial, its `fleetrl train` command, trials.csv, the PNGs and the dashboard command."""
    trials = study.get_trials(deepcopy=False)
    counts = study_counts(trials)
    write_trials_csv(trials, params, out / "trials.csv")
    print(f"\nfleetrl tune: study {study.study_name!r}: {plural(len(trials), 'trial')} "
          f"({counts['complete']} complete, {counts['pruned']} pruned, {counts['failed']} failed, {counts['running']} running elsewhere"
          + (f", {counts['queued']} queued: retries of interrupted trials" if counts["queued"] else "") + ")", flush=True)
    best = counts["best"]
    if best is not None:
        print(f"best: trial {best.number}, score {best.value:.6g}" + ("" if tuner_args.target_scores else " (mean return)"))
        width = max((len(p.name) for p in params), default=0)
        for p in params:
            print(f"  {p.name:<{width}}  {format_value(best.params.get(p.name))}")
        flags = [flag for p in params if p.name in best.params for flag in p.flags(best.params[p.name])]
        print("train with them:")
        for env_id in dict.fromkeys(tuner_args.env_ids):
            print(f"  {shlex.join([*algo.base, *flags, '--env-id', env_id])}")
        print(f"its runs: {' '.join(best.user_attrs.get('run_dirs', []))}")
    print(f"trials: {out / 'trials.csv'}")
    if plots:
        for note in write_plots(study, out):
            print(f"plot: {note}")
    print(f"dashboard: optuna-dashboard {shlex.quote(spec.shown)}   (pip install optuna-dashboard)", flush=True)
    failed = [t for t in trials if t.user_attrs.get("fail_reason") and t.user_attrs.get("log")]
    for t in failed[-FAILURES_SHOWN:]:
        print(f"\ntrial {t.number} failed: {t.user_attrs['fail_reason']}\n  log: {t.user_attrs['log']}")
        print("\n".join(f"  | {line}" for line in log_tail(Path(t.user_attrs["log"]), 8)))
