"""`fleetrl plot`: learning curves from TensorBoard run folders, one panel per env, one line per experiment
(the mean over seeds, with a ± std band)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import numpy as np
import tyro

from fleetrl import config
from fleetrl.errors import FleetError
from fleetrl.tools.text import plural

EVENTS_PREFIX = "events.out.tfevents."
GRID_POINTS = 500  # points of the common x grid the seeds are averaged on; enough for a smooth line
MAX_SMOOTH = 10**9  # --smooth's largest window: past any run's points (numpy's int64 arithmetic overflows at 2**63)
PANEL_COLUMNS = 3
PANEL_SIZE_IN = (5.0, 3.6)


@dataclass
class PlotArgs:
    paths: tyro.conf.Positional[tuple[str, ...]]
    """run folders, or folders to search for runs (e.g. runs/ or a benchmark's --out)"""
    output: Annotated[str, tyro.conf.arg(aliases=("-o",))] = "curves.png"
    """the image to write: .png, or .svg"""
    metric: str = "charts/episodic_return"
    """the TensorBoard scalar to plot"""
    x: Literal["step", "time"] = "step"
    """x axis: the global step, or wall time in seconds since each run's first point"""
    smooth: int = 1
    """average each run over a trailing window of this many points before averaging the seeds (1: no smoothing)"""
    svg: bool = False
    """also write an SVG next to the PNG"""
    title: str | None = None
    """a title over the whole figure (the panels are titled by env, the y axes by the metric)"""


class RunInfo(NamedTuple):
    path: Path
    env: str
    exp: str
    seed: int | None


# ---- finding runs and naming them ---------------------------------------------------------------


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Every folder under ``paths`` that holds TensorBoard event files (a path may itself be one)."""
    found: dict[Path, None] = {}  # a dict keeps the order and drops a run reached from two paths
    for path in map(Path, paths):
        if not path.exists():
            raise FleetError(f"{path} does not exist. Give run folders, or a folder that holds them (e.g. runs/).")
        if path.is_file():
            path = path.parent  # an events file given directly stands for its run
        for root, dirs, files in os.walk(path):
            dirs.sort()
            if any(name.startswith(EVENTS_PREFIX) for name in files):
                found[Path(root)] = None
    return list(found)


def parse_run_name(run_dir: Path) -> RunInfo:
    """env, experiment and seed from the folder name.

    ``{env_id}__{exp_name}__{seed}__{timestamp}`` is CleanRL's and `fleetrl train`'s name;
    ``{env}__{seed}`` is the benchmark runner's, whose experiment is then the benchmark folder.
    Anything else is its own env and experiment, under its folder name.
    """
    parts = run_dir.name.split("__")
    if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
        return RunInfo(run_dir, parts[0], parts[1], int(parts[2]))
    if len(parts) == 2 and parts[1].isdigit():
        return RunInfo(run_dir, parts[0], run_dir.resolve().parent.name, int(parts[1]))
    return RunInfo(run_dir, run_dir.name, run_dir.name, None)


def group_runs(runs: list[RunInfo]) -> dict[str, dict[str, list[RunInfo]]]:
    """env -> experiment -> its runs (the seeds), in the order the runs were found."""
    groups: dict[str, dict[str, list[RunInfo]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        groups[run.env][run.exp].append(run)
    return {env: dict(exps) for env, exps in groups.items()}


# ---- curves -------------------------------------------------------------------------------------


def load_curve(run_dir: Path, metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """One run's (x, y), sorted by x, with points at the same x averaged (several episodes can end
    in the same logged step, and np.interp needs increasing x)."""
    from fleetrl.monitor.tbread import read_scalars  # tensorboard is slow to import; only when needed

    return curve_of(read_scalars(run_dir, metric), x)


def curve_of(points: list, x: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`load_curve` of points already read (tbread.Point)."""
    if not points:
        return np.empty(0), np.empty(0)
    if x == "time":
        xs = np.array([p.wall_time for p in points]) - points[0].wall_time
    else:
        xs = np.array([p.step for p in points], dtype=np.float64)
    ys = np.array([p.value for p in points], dtype=np.float64)
    order = np.argsort(xs, kind="stable")
    xs, ys = xs[order], ys[order]
    unique, index, counts = np.unique(xs, return_inverse=True, return_counts=True)
    return unique, np.bincount(index, weights=ys) / counts


def smooth(ys: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average; the first points average over what there is so far."""
    if window <= 1 or len(ys) == 0:
        return ys
    sums = np.cumsum(np.insert(ys, 0, 0.0))
    ends = np.arange(1, len(ys) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def common_grid(curves: list[tuple[np.ndarray, np.ndarray]], points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Interpolate every curve onto one x grid over the range all of them cover.

    Seeds log episodes at different steps, so their points never line up; averaging needs one grid.
    Returns (grid, values) with values of shape (curves, grid points). Outside the overlap some
    seed would be extrapolated, so the grid stops where the shortest curve stops.
    """
    if not curves or any(len(xs) == 0 for xs, _ in curves):
        raise ValueError("every curve needs at least one point")
    lo = max(float(xs[0]) for xs, _ in curves)
    hi = min(float(xs[-1]) for xs, _ in curves)
    if hi < lo:
        raise ValueError(f"the curves do not overlap in x (latest start {lo:g} is after the earliest end {hi:g})")
    grid = np.linspace(lo, hi, min(points, max(len(xs) for xs, _ in curves))) if hi > lo else np.array([lo])
    return grid, np.stack([np.interp(grid, xs, ys) for xs, ys in curves])


# ---- the figure ---------------------------------------------------------------------------------


def output_paths(output: str, svg: bool) -> list[Path]:
    path = Path(output)
    if path.suffix.lower() not in (".png", ".svg"):
        raise FleetError(f"-o {output}: the image must end in .png or .svg, e.g. -o curves.png")
    paths = [path]
    if svg and path.suffix.lower() == ".png":
        paths.append(path.with_suffix(".svg"))
    return paths


def plot(args: PlotArgs) -> list[Path]:
    """Draw the figure; returns the files written."""
    if not args.paths:
        raise FleetError("`fleetrl plot` needs run folders, or a folder that holds them: fleetrl plot runs/ -o curves.png")
    config.check_ranges(args, {"smooth": config.count("points in the trailing average; 1: no smoothing", high=MAX_SMOOTH)})
    outputs = output_paths(args.output, args.svg)
    run_dirs = find_runs(list(args.paths))
    if not run_dirs:
        raise FleetError(
            f"No TensorBoard runs (folders with {EVENTS_PREFIX}* files) under {', '.join(args.paths)}. "
            "Point at the folder your runs are in (default runs/), or at a `fleetrl benchmark --out` folder."
        )

    curves: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
    for run_dir in run_dirs:
        xs, ys = load_curve(run_dir, args.metric, args.x)
        if len(xs):
            curves[run_dir] = (xs, smooth(ys, args.smooth))
    if not curves:
        from fleetrl.monitor.tbread import scalar_tags

        tags = sorted(set().union(*(scalar_tags(d) for d in run_dirs)))
        raise FleetError(
            f"None of the {len(run_dirs)} runs found has points for --metric {args.metric}. "
            f"Their scalars: {', '.join(tags) or 'none'}. Pick one with --metric, or let the runs log some episodes first."
        )
    missing = [d for d in run_dirs if d not in curves]
    if missing:
        print(f"note: {len(missing)} of {len(run_dirs)} runs have no {args.metric} points and are left out: {', '.join(map(str, missing))}")

    groups = group_runs([parse_run_name(d) for d in curves])
    draw(groups, curves, args, outputs)
    for env, exps in groups.items():
        for exp, runs in exps.items():
            print(f"{env}: {exp}, {plural(len(runs), 'run')}")
    print(f"wrote {', '.join(map(str, outputs))} ({plural(len(groups), 'panel')}, {plural(len(curves), 'run')})")
    return outputs


def draw(groups: dict[str, dict[str, list[RunInfo]]], curves: dict[Path, tuple[np.ndarray, np.ndarray]], args: PlotArgs, outputs: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    cols = min(PANEL_COLUMNS, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL_SIZE_IN[0] * cols, PANEL_SIZE_IN[1] * rows), squeeze=False)
    for ax, (env, exps) in zip(axes.flat, groups.items()):
        for exp, runs in exps.items():
            try:
                grid, values = common_grid([curves[run.path] for run in runs])
            except ValueError as exc:
                raise FleetError(f"{env} / {exp}: cannot average its {len(runs)} runs: {exc}. Plot them separately.") from None
            mean, std = values.mean(axis=0), values.std(axis=0)
            (line,) = ax.plot(grid, mean, label=f"{exp} ({plural(len(runs), 'seed' if runs[0].seed is not None else 'run')})", linewidth=1.5)
            if len(runs) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(env)
        ax.set_xlabel("global step" if args.x == "step" else "wall time (s)")
        ax.set_ylabel(args.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    try:
        for path in outputs:
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
    except OSError as exc:
        raise FleetError(f"Cannot write {path} ({exc.strerror or exc}). Give another -o.") from None
    finally:
        plt.close(fig)
