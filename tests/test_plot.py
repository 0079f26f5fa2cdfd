"""`fleetrl plot`: real runs grouped by env and experiment, seeds averaged on a common step grid, clear errors."""

from pathlib import Path

import numpy as np
import pytest

from fleetrl.monitor.tbread import read_scalars
from fleetrl.tools import plot as plot_tool
from fleetrl.tools.plot import common_grid, find_runs, group_runs, parse_run_name, smooth

from conftest import run_fleetrl, run_fleetrl_here, run_fleetrl_in_process

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_seed_runs(tmp_path_factory):
    """Two seeds of a 2048-step CartPole run, in CleanRL's folder names, trained one after the other in this process."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (1, 2):
        proc = run_fleetrl_here("train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "2048", "--seed", str(seed), "--no-cuda",
                                "--torch-threads", "1", "--no-progress", "--run-dir", str(root / f"CartPole-v1__ppo__{seed}__170000000{seed}"))
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.slow
def test_plot_writes_a_png_with_both_seeds_in_one_panel(two_seed_runs, tmp_path):
    out = tmp_path / "curves.png"
    # `fleetrl plot` in a process of its own (the other plots here run in this process)
    proc = run_fleetrl("plot", str(two_seed_runs), "-o", str(out), "--svg", "--smooth", "3", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 panel, 2 runs" in proc.stdout and "CartPole-v1: ppo, 2 runs" in proc.stdout
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 5000
    assert out.with_suffix(".svg").read_text().lstrip().startswith("<?xml")

    groups = group_runs([parse_run_name(run) for run in find_runs([two_seed_runs])])
    assert list(groups) == ["CartPole-v1"] and list(groups["CartPole-v1"]) == ["ppo"]
    assert sorted(run.seed for run in groups["CartPole-v1"]["ppo"]) == [1, 2]


@pytest.mark.slow
def test_plot_against_wall_time_draws_seconds_and_a_metric_with_no_points_is_a_clear_error(two_seed_runs, tmp_path, monkeypatch):
    svg = tmp_path / "time.svg"
    proc = run_fleetrl_here("plot", str(two_seed_runs), "--x", "time", "-o", str(svg))
    assert proc.returncode == 0, proc.stderr
    assert svg.read_text().lstrip().startswith("<?xml") and not svg.with_suffix(".png").exists()
    assert "wall time (s)" in svg.read_text() and "global step" not in svg.read_text()  # matplotlib keeps text as comments
    # the x values drawn are seconds since each run's first point, not steps
    drawn = {}
    monkeypatch.setattr(plot_tool, "draw", lambda groups, curves, args, outputs: drawn.update(curves))
    plot_tool.plot(plot_tool.PlotArgs(paths=[str(two_seed_runs)], output=str(tmp_path / "t.svg"), x="time"))
    for run_dir, (xs, _) in drawn.items():
        wall = [p.wall_time for p in read_scalars(run_dir, "charts/episodic_return")]
        steps = [p.step for p in read_scalars(run_dir, "charts/episodic_return")]
        assert xs[0] == 0 and xs[-1] == pytest.approx(max(wall) - wall[0]), "seconds since the run's first point"
        assert xs[-1] < 240 < max(steps), "a 2048-step run trains in seconds (the fixture allows 240 s): these are not steps"
    missing = run_fleetrl_here("plot", str(two_seed_runs), "--metric", "charts/no_such_tag", "-o", str(tmp_path / "x.png"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "has points for --metric charts/no_such_tag" in missing.stderr and "charts/episodic_return" in missing.stderr


def test_no_runs_is_a_clear_error(tmp_path):
    proc = run_fleetrl_in_process("plot", str(tmp_path), "-o", str(tmp_path / "c.png"))
    assert proc.returncode == 2 and "No TensorBoard runs" in proc.stderr and "Traceback" not in proc.stderr
    missing = run_fleetrl_in_process("plot", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    pdf = run_fleetrl_in_process("plot", str(tmp_path), "-o", "c.pdf")
    assert pdf.returncode == 2 and ".png or .svg" in pdf.stderr


def test_seeds_are_interpolated_onto_the_range_all_of_them_cover():
    a = (np.array([0.0, 10.0, 20.0]), np.array([0.0, 10.0, 20.0]))  # y = x
    b = (np.array([5.0, 15.0, 30.0]), np.array([10.0, 30.0, 60.0]))  # y = 2x
    grid, values = common_grid([a, b], points=6)
    assert grid[0] == 5.0 and grid[-1] == 20.0 and len(grid) == 3  # no more points than the longest curve has
    np.testing.assert_allclose(values[0], grid)
    np.testing.assert_allclose(values[1], 2 * grid)
    fine_grid, fine = common_grid([(np.linspace(0, 100, 50), np.linspace(0, 100, 50)), (np.array([0.0, 100.0]), np.array([100.0, 0.0]))])
    np.testing.assert_allclose(fine.mean(axis=0), np.full_like(fine_grid, 50.0))  # y = x and y = 100 - x average to 50
    with pytest.raises(ValueError, match="do not overlap"):
        common_grid([(np.array([0.0, 1.0]), np.zeros(2)), (np.array([2.0, 3.0]), np.zeros(2))])


def test_smoothing_is_a_trailing_mean():
    np.testing.assert_allclose(smooth(np.array([0.0, 2.0, 4.0, 6.0]), 2), [0.0, 1.0, 3.0, 5.0])
    np.testing.assert_allclose(smooth(np.array([1.0, 5.0]), 1), [1.0, 5.0])


def test_run_folder_names_give_env_experiment_and_seed():
    cleanrl = parse_run_name(Path("runs/CartPole-v1__ppo__3__1700000000"))
    assert (cleanrl.env, cleanrl.exp, cleanrl.seed) == ("CartPole-v1", "ppo", 3)
    bench = parse_run_name(Path("runs/benchmark_17/ALE-Pong-v5__2"))
    assert (bench.env, bench.exp, bench.seed) == ("ALE-Pong-v5", "benchmark_17", 2)
    other = parse_run_name(Path("runs/my_experiment"))
    assert (other.env, other.exp, other.seed) == ("my_experiment", "my_experiment", None)
