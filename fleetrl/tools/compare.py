"""`fleetrl compare DIR [DIR ...]`: configurations side by side, each a `fleetrl benchmark --out` folder or a folder of
runs: their confidence intervals, the probability of improvement of each over the others, and rliable's figures."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

from fleetrl import config
from fleetrl.errors import FleetError
from fleetrl.tools import stats
from fleetrl.tools.plot import EVENTS_PREFIX, RunInfo, common_grid, curve_of, find_runs, parse_run_name, smooth
from fleetrl.tools.returns import FINAL_POINTS, RETURN_TAG, mean_of_last
from fleetrl.tools.scores import Scale, env_scales
from fleetrl.tools.text import markdown_table, plural, print_table

CURVE_POINTS = 20  # steps at which the sample-efficiency curves are estimated; each is a bootstrap over every run
PROFILE_POINTS = 101  # thresholds of the performance profiles
FIGURE_DPI = 120
POI_HEADER = ["configuration X", "over Y", "P(X > Y) [95% CI]"]


@dataclass
class CompareArgs:
    paths: tyro.conf.Positional[tuple[str, ...]]
    """one folder per configuration: a `fleetrl benchmark --out` folder, or a folder of run folders (a folder holding runs of several experiments, such as runs/, gives one configuration per experiment)"""
    labels: list[str] = field(default_factory=list)
    """names for the configurations, in the order they are found [each benchmark folder's name, or the experiment name]"""
    out: str = "compare"
    """folder for compare.md and the figures: intervals.png, profiles.png, sample_efficiency.png"""
    stats: tyro.conf.OmitArgPrefixes[stats.StatsArgs] = field(default_factory=stats.StatsArgs)
    """how returns become scores, and the bootstrap"""


@dataclass
class Configuration:
    """The runs of one configuration that logged returns, by env, in seed order."""

    label: str
    source: Path
    runs: dict[str, list[RunInfo]] = field(default_factory=dict)
    finals: dict[str, list[float]] = field(default_factory=dict)  # each run's final return, as `fleetrl benchmark` computes it
    curves: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)  # each run's (step, trailing mean)

    def run_counts(self) -> str:
        counts = sorted({len(runs) for runs in self.runs.values()})
        return plural(counts[0], "run") if len(counts) == 1 else f"{counts[0]}-{counts[-1]} runs"


# ---- reading the folders ------------------------------------------------------------------------


def find_configurations(paths: tuple[str, ...], labels: list[str]) -> list[Configuration]:
    """Each folder's runs, one configuration per experiment in it, by env in seed order (their returns not read yet)."""
    if not paths:
        raise FleetError("`fleetrl compare` needs one folder per configuration, e.g. "
                         "fleetrl compare runs/bench_defaults runs/bench_lr_low (each a `fleetrl benchmark --out` folder).")
    configs: list[Configuration] = []
    owner: dict[Path, str] = {}
    for path in paths:
        run_dirs = find_runs([path])
        if not run_dirs:
            raise FleetError(f"No runs under {path}: no folder there holds TensorBoard event files ({EVENTS_PREFIX}*). Give a "
                             "`fleetrl benchmark --out` folder, or a folder of `fleetrl train` run folders, one per configuration.")
        by_exp: dict[str, list[RunInfo]] = {}
        for info in map(parse_run_name, run_dirs):
            by_exp.setdefault(info.exp, []).append(info)
        for exp, infos in by_exp.items():
            configuration = Configuration(exp, Path(path))
            for info in sorted(infos, key=lambda info: (info.seed is None, info.seed or 0, str(info.path))):
                key = info.path.resolve()
                if key in owner:
                    raise FleetError(f"The run {info.path} is in two configurations ({owner[key]} and {path}): the folders "
                                     "overlap. Give each configuration's folder once, and no folder inside another.")
                owner[key] = str(path)
                configuration.runs.setdefault(info.env, []).append(info)
            configs.append(configuration)
    name_labels(configs, labels)
    return configs


def name_labels(configs: list[Configuration], labels: list[str]) -> None:
    if labels and len(labels) != len(configs):
        found = ", ".join(f"{c.label} ({c.source})" for c in configs)
        raise FleetError(f"--labels gives {plural(len(labels), 'name')} for {plural(len(configs), 'configuration')}: {found}. "
                         "Give one name per configuration, in that order.")
    for configuration, label in zip(configs, labels):
        configuration.label = label
    names = [c.label for c in configs]
    for configuration in configs:
        if names.count(configuration.label) > 1:  # e.g. two runs/ folders whose runs all have the experiment name ppo
            configuration.label = f"{configuration.label} ({configuration.source})"
    names = [c.label for c in configs]
    if len(set(names)) < len(names):
        raise FleetError(f"Two configurations have the same name ({', '.join(names)}). Name them apart with --labels.")


def read_returns(configuration: Configuration) -> None:
    """Each run's final return and its curve, the trailing mean of FINAL_POINTS returns, so that a curve ends near the final
    return; runs that logged no return are left out with a note."""
    from fleetrl.monitor.tbread import read_scalars  # tensorboard (and torch, through fleetrl.monitor) are slow to import

    for env, infos in list(configuration.runs.items()):
        kept = []
        for info in infos:
            points = read_scalars(info.path, RETURN_TAG)  # read once: a run's events take about 0.4 s to parse
            value, (steps, returns) = mean_of_last(points), curve_of(points, "step")
            if value is None or not len(steps):
                print(f"note: {info.path} has no {RETURN_TAG} points; left out of {configuration.label}")
                continue
            kept.append(info)
            configuration.finals.setdefault(env, []).append(value)
            configuration.curves.setdefault(env, []).append((steps, smooth(returns, FINAL_POINTS)))
        if not kept:
            raise FleetError(f"No run of {configuration.label} on {env} logged a return ({RETURN_TAG}) under {configuration.source}: "
                             "they failed or stopped before their first episode ended. Rerun them (a `fleetrl benchmark` "
                             "rerun with the same --out finishes them), or give another folder.")
        configuration.runs[env] = kept


def check_same_envs(configs: list[Configuration]) -> list[str]:
    envs = sorted(configs[0].runs)
    if any(sorted(c.runs) != envs for c in configs):
        listed = "; ".join(f"{c.label}: {' '.join(sorted(c.runs))}" for c in configs)
        raise FleetError(f"The configurations ran different envs ({listed}). Compare configurations on the same envs: "
                         "rerun the missing envs, or give only the folders that share them.")
    return envs


# ---- the numbers --------------------------------------------------------------------------------


def scores_by_env(configuration: Configuration, scales: dict[str, Scale]) -> dict[str, np.ndarray]:
    return {env: scales[env].apply(configuration.finals[env]) for env in scales}


def improvement_table(configs: list[Configuration], scales: dict[str, Scale], args: stats.StatsArgs) -> list[list[str]]:
    """P(X > Y) for every ordered pair, on scores (so that min-max bounds with LO > HI mean lower is better). P(Y > X) is
    1 - P(X > Y) exactly (ties count half), so each pair is bootstrapped once and mirrored."""
    arrays = []
    for c in configs:
        array, kept = stats.stack_runs(scores_by_env(c, scales))
        if kept:
            print(f"note: {c.label} has more runs of some envs than of others; P(X > Y) uses the first {kept} (by seed) of each")
        arrays.append(array)
    rows: dict[tuple[int, int], stats.Estimate] = {}
    for i in range(len(configs)):
        for j in range(i + 1, len(configs)):
            p = stats.probability_of_improvement(arrays[i], arrays[j], args.bootstrap_reps, args.bootstrap_seed)
            rows[i, j] = p
            rows[j, i] = stats.Estimate(1 - p.point, 1 - p.high, 1 - p.low)
    return [[configs[i].label, configs[j].label, rows[i, j].cell(decimals=3)] for i, j in sorted(rows)]


def aggregate_level(configs: list[Configuration], scales: dict[str, Scale], rows: dict[str, list[stats.IntervalRow]]):
    """Per configuration, its runs x envs scores and the table row the figures show (the env, or all envs)."""
    wanted = stats.ALL_ENVS if len(scales) > 1 else next(iter(scales))
    return {c.label: (stats.stack_runs(scores_by_env(c, scales))[0], next(r for r in rows[c.label] if r.env == wanted)) for c in configs}


# ---- the figures --------------------------------------------------------------------------------


def draw_figures(configs: list[Configuration], scales: dict[str, Scale], rows: dict[str, list[stats.IntervalRow]], args: stats.StatsArgs,
                 out: Path) -> list[Path]:
    """Interval estimates, performance profiles and sample-efficiency curves of the scores over all envs (or the one env)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a cluster node or in CI
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    level = aggregate_level(configs, scales, rows)
    normalised = all(scale.normalised for scale in scales.values())
    score_name = "normalised score" if normalised else f"{next(iter(scales))} return"
    labels = [c.label for c in configs]
    written = []

    def save(fig, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    metrics = [m for m in stats.METRICS if m in level[labels[0]][1].estimates]
    points = {label: np.array([row.estimates[m].point for m in metrics]) for label, (_, row) in level.items()}
    intervals = {label: np.array([[row.estimates[m].low for m in metrics], [row.estimates[m].high for m in metrics]]) for label, (_, row) in level.items()}
    fig, axes = plot_utils.plot_interval_estimates(points, intervals, metric_names=metrics, algorithms=labels, xlabel="",
                                                   subfigure_width=3.6, row_height=max(0.6, 1.5 / len(labels)))
    for ax in np.atleast_1d(axes):  # rliable places one label in figure coordinates, which a short figure puts on the ticks
        ax.set_xlabel(score_name, fontsize="large")
    save(fig, "intervals.png")

    everything = np.concatenate([array.ravel() for array, _ in level.values()])
    low, high = float(everything.min()), float(everything.max())
    taus = np.linspace(low, high if high > low else low + 1, PROFILE_POINTS)
    profiles, profile_cis = {}, {}
    for label, (array, _) in level.items():
        profiles[label], profile_cis[label] = stats.performance_profile(array, taus, args.bootstrap_reps, args.bootstrap_seed)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=profile_cis, ax=ax, xlabel=f"{score_name} (τ)",
                                         ylabel="fraction of runs with score > τ", labelsize="large", ticklabelsize="large")
    ax.legend(loc="best")
    save(fig, "profiles.png")

    grid, curves = sample_efficiency(configs, scales)
    estimates, cis = {}, {}
    for label, array in curves.items():
        estimates[label], cis[label] = stats.iqm_curve(array, args.bootstrap_reps, args.bootstrap_seed)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_utils.plot_sample_efficiency_curve(grid, estimates, cis, algorithms=labels, ax=ax, xlabel="environment steps",
                                            ylabel=f"IQM of the {score_name}", labelsize="large", ticklabelsize="large")
    ax.legend(loc="best")
    save(fig, "sample_efficiency.png")
    return written


def sample_efficiency(configs: list[Configuration], scales: dict[str, Scale]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every run's curve, scaled, on one step grid (the range all runs cover): per configuration, runs x envs x points."""
    every = [(steps, scales[env].apply(ys)) for c in configs for env in scales for steps, ys in c.curves[env]]
    try:
        grid, values = common_grid(every, CURVE_POINTS)
    except ValueError as exc:
        raise FleetError(f"No sample-efficiency curves: {exc}. Compare runs with overlapping step ranges "
                         "(the same --total-timesteps).") from None
    curves, at = {}, 0
    for c in configs:
        per_env = {}
        for env in scales:
            per_env[env] = values[at : at + len(c.curves[env])]
            at += len(c.curves[env])
        kept = min(len(v) for v in per_env.values())
        curves[c.label] = np.stack([v[:kept] for v in per_env.values()], axis=1)
    return grid, curves


# ---- the command --------------------------------------------------------------------------------


def compare(args: CompareArgs, argv: list[str] | None = None) -> None:
    """Print the tables and write compare.md (with the command, ``argv``) and the figures into --out."""
    config.check_ranges(args.stats, stats.RANGES)
    configs = find_configurations(args.paths, args.labels)
    envs = check_same_envs(configs)
    scales = env_scales(args.stats.normalize, args.stats.score_bounds, envs, "the envs of the runs found:")
    stats.require_rliable()  # the 'stats' extra, or a clear error before the runs are read
    for c in configs:
        read_returns(c)  # runs without a return are left out, said so
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FleetError(f"Cannot create the output folder {out} ({exc.strerror or exc}). Give another --out.") from None

    print(f"fleetrl compare: {plural(len(configs), 'configuration')} ({', '.join(f'{c.label}: {c.run_counts()}' for c in configs)}) "
          f"on {plural(len(envs), 'env')}: {' '.join(envs)}", flush=True)
    rows = {c.label: stats.interval_rows({env: c.finals[env] for env in envs}, scales, args.stats) for c in configs}
    interval_cells = [[c.label, *row.cells()] for c in configs for row in rows[c.label]]
    header = ["configuration", *stats.INTERVAL_HEADER]
    print()
    print_table(header, interval_cells, stats.TITLE)
    notes = [note for note in [stats.aggregate_note(scales)] if note]
    print("\n" + "\n".join([*notes, stats.explain(args.stats)]))
    command = [f"`{shlex.join(['fleetrl', 'compare', *argv])}`"] if argv is not None else []
    parts = ["# fleetrl compare", *command, stats.explain(args.stats), markdown_table(header, interval_cells), *notes]

    if len(configs) > 1:
        poi = improvement_table(configs, scales, args.stats)
        print()
        print_table(POI_HEADER, poi, "probability of improvement")
        print()
        explained = ("P(X > Y): the probability that a run of X scores above a run of Y on the same env (ties count half), "
                     "averaged over the envs; an interval that excludes 0.5 is a significant difference.")
        print(explained)
        parts += ["## Probability of improvement", explained, markdown_table(POI_HEADER, poi)]
    else:
        print("\nOne configuration: give two or more folders for the probability of improvement.")

    figures = []
    if len(envs) == 1 or stats.can_aggregate(scales):
        if all(len(c.finals[env]) >= stats.MIN_RUNS for c in configs for env in envs):
            figures = draw_figures(configs, scales, rows, args.stats, out)
            parts += ["## Figures", *(f"![{p.stem}]({p.name})" for p in figures)]
        else:
            print(f"No figures: each configuration needs {stats.MIN_RUNS} or more runs of every env.")
    else:
        print("No figures: they show the scores over all envs, which need every env normalised (see the note above).")
    report = out / "compare.md"
    report.write_text("\n\n".join(parts) + "\n")
    print(f"\nwrote {', '.join(map(str, [report, *figures]))}")
