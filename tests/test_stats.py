"""Statistics on made-up scores whose intervals are known: IQM, median, mean and optimality gap with bootstrap intervals,
the probability of improvement, score normalisation, `fleetrl compare` on made-up runs, and its errors."""

from pathlib import Path

import numpy as np
import pytest

from fleetrl.errors import FleetError
from fleetrl.tools import stats
from fleetrl.tools.benchmark import RETURN_TAG, Result, Run, interval_summary
from fleetrl.tools.compare import CompareArgs, compare
from fleetrl.tools.scores import Scale, atari_random_human, env_scales

from conftest import run_fleetrl, run_fleetrl_in_process

REPS = 200  # enough for the checks below (exact points, an interval either side of 0.5), and fast
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def estimates(scores, normalised=False, seed=0):
    return stats.interval_estimates(np.asarray(scores, dtype=np.float64), normalised, REPS, seed)


# ---- the metrics and their intervals ------------------------------------------------------------


def test_runs_that_all_score_the_same_give_zero_width_intervals_at_that_score():
    result = estimates(np.full((10, 1), 0.75), normalised=True)
    assert set(result) == {"IQM", "median", "mean", "optimality gap"}
    for name, value in [("IQM", 0.75), ("median", 0.75), ("mean", 0.75), ("optimality gap", 0.25)]:
        assert result[name].point == pytest.approx(value) and result[name].low == pytest.approx(value) and result[name].high == pytest.approx(value)


def test_iqm_is_the_mean_of_the_middle_half_of_the_runs():
    # 8 runs: the lowest 2 and the highest 2 are cut, the outlier 100 with them: (3 + 4 + 5 + 6) / 4
    result = estimates(np.array([[7.0], [1.0], [100.0], [3.0], [5.0], [2.0], [6.0], [4.0]]))
    assert result["IQM"].point == pytest.approx(4.5)
    assert result["mean"].point == pytest.approx(128 / 8) and result["median"].point == pytest.approx(4.5)
    assert "optimality gap" not in result  # raw returns have no target to fall short of
    assert result["IQM"].low <= 4.5 <= result["IQM"].high
    # over envs the runs x envs scores are pooled: 4 runs x 2 envs, the middle 4 of the 8 values
    pooled = estimates(np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0], [3.0, 13.0]]), normalised=True)
    assert pooled["IQM"].point == pytest.approx((2 + 3 + 10 + 11) / 4)
    # one env's median is its median run; over envs it is the median of the envs' means (rliable's)
    three_envs = np.array([[0.0, 1.0, 5.0], [2.0, 3.0, 9.0]])
    assert estimates(three_envs, normalised=True)["median"].point == pytest.approx(2.0)
    assert estimates([[0.0], [0.0], [9.0]])["median"].point == 0.0


def test_optimality_gap_counts_how_far_normalised_runs_fall_short_of_one():
    result = estimates([[0.5], [1.5], [1.0], [0.0]], normalised=True)  # shortfalls 0.5, 0, 0, 1 (above 1 counts as 1)
    assert result["optimality gap"].point == pytest.approx(0.375)


def test_the_same_scores_and_seed_give_the_same_intervals_and_numpys_global_rng_is_left_as_it_was():
    scores = np.random.default_rng(3).normal(size=(10, 2))
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    first = estimates(scores, normalised=True)
    assert np.random.rand() == expected_next, "the caller's global RNG state is restored"
    assert estimates(scores, normalised=True) == first
    assert estimates(scores, normalised=True, seed=1) != first  # the seed is what fixes them
    poi = [stats.probability_of_improvement(scores, scores[::-1] + 0.1, REPS, 0) for _ in range(2)]
    assert poi[0] == poi[1]


def test_probability_of_improvement_is_one_for_separated_configurations_and_a_half_for_identical_ones():
    rng = np.random.default_rng(0)
    low, high = rng.uniform(0, 1, size=(10, 2)), rng.uniform(5, 6, size=(7, 2))  # run counts may differ
    better = stats.probability_of_improvement(high, low, REPS, 0)
    assert (better.point, better.low, better.high) == (1.0, 1.0, 1.0)
    worse = stats.probability_of_improvement(low, high, REPS, 0)
    assert (worse.point, worse.low, worse.high) == (0.0, 0.0, 0.0)
    same = stats.probability_of_improvement(low, low.copy(), REPS, 0)
    assert same.point == 0.5 and same.low < 0.5 < same.high
    constant = stats.probability_of_improvement(np.full((5, 1), 3.0), np.full((5, 1), 3.0), REPS, 0)
    assert (constant.point, constant.low, constant.high) == (0.5, 0.5, 0.5)  # ties count half


def independent_bootstrap(scores: np.ndarray, reps: int, seed: int) -> dict[str, tuple[float, float]]:
    """95% percentile intervals of a runs x envs array, written here from the definitions and not from rliable: each
    rep draws every env's runs again with replacement, each env on its own (stratified), and takes the metrics."""
    rng = np.random.default_rng(seed)
    runs, envs = scores.shape

    def metrics(x: np.ndarray) -> dict[str, float]:
        pooled = np.sort(x.ravel())
        cut = int(0.25 * pooled.size)  # the middle half of all runs x envs values
        return {"IQM": pooled[cut: pooled.size - cut].mean(), "mean": x.mean(), "optimality gap": np.maximum(1.0 - x, 0.0).mean()}

    drawn: dict[str, list[float]] = {}
    for _ in range(reps):
        rows = rng.integers(0, runs, size=(runs, envs))
        for name, value in metrics(scores[rows, np.arange(envs)]).items():
            drawn.setdefault(name, []).append(value)
    return {name: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for name, v in drawn.items()}


def test_the_intervals_match_an_independent_stratified_bootstrap():
    rng = np.random.default_rng(7)
    base = rng.normal(0.6, 0.25, size=(12, 1))
    # two envs whose runs rise and fall together: resampling whole rows would give the mean a sqrt(2) wider interval
    # than resampling each env's runs on its own, as a stratified bootstrap does
    scores = np.hstack([base, base + 0.3])
    ours = stats.interval_estimates(scores, True, 4000, 0)
    theirs = independent_bootstrap(scores, 4000, 1)
    for name, (low, high) in theirs.items():
        width = high - low
        assert abs(ours[name].low - low) < 0.05 * width and abs(ours[name].high - high) < 0.05 * width, (name, ours[name], low, high)


def test_about_95_percent_of_the_intervals_hold_the_true_value():
    """200 samples of 20 runs from a known distribution (normal, so its IQM, median and mean are all its centre):
    each metric's interval holds the centre in 90-99% of them (percentile intervals of 20 runs fall a little short).
    100 resamples each: the coverage is counted over the 200 samples, and 100 held 185-188 of them as 200 held 186-189."""
    rng, centre = np.random.default_rng(2026), 0.5
    held = {"IQM": 0, "median": 0, "mean": 0}
    for sample in range(200):
        result = stats.interval_estimates(rng.normal(centre, 0.2, size=(20, 1)), False, 100, sample)
        for name in held:
            held[name] += result[name].low <= centre <= result[name].high
    assert all(180 <= count <= 198 for count in held.values()), held


def test_a_cell_shows_the_estimate_and_its_interval():
    assert stats.Estimate(297.4, 276.52, 321.3).cell() == "297.4 [276.5, 321.3]"
    assert stats.Estimate(0.5, 0.25, 0.75).cell() == "0.500 [0.250, 0.750]"
    assert stats.Estimate(1.0, 1.0, 1.0).cell(decimals=3) == "1.000 [1.000, 1.000]"


# ---- normalisation ------------------------------------------------------------------------------


def test_atari_scores_are_human_normalised_with_the_published_random_and_human_scores():
    assert atari_random_human("ALE/Pong-v5") == (-20.7, 14.6)
    assert atari_random_human("ALE-Pong-v5") == (-20.7, 14.6)  # a benchmark's run folder name
    assert atari_random_human("MontezumaRevengeNoFrameskip-v4") == (0.0, 4753.3)
    assert atari_random_human("CartPole-v1") is None
    scales = env_scales("auto", [], ["ALE/Breakout-v5", "CartPole-v1"], "--env-ids")
    assert scales["ALE/Breakout-v5"] == Scale("human-normalised", 1.7, 30.5)
    np.testing.assert_allclose(scales["ALE/Breakout-v5"].apply([1.7, 30.5, 59.3]), [0.0, 1.0, 2.0])
    assert scales["CartPole-v1"] == Scale() and not scales["CartPole-v1"].normalised  # no published scores: the return
    np.testing.assert_allclose(scales["CartPole-v1"].apply([12.5]), [12.5])
    assert env_scales("human", [], ["ALE/Pong-v5"], "--env-ids")["ALE/Pong-v5"].kind == "human-normalised"
    assert env_scales("none", [], ["ALE/Pong-v5"], "--env-ids")["ALE/Pong-v5"] == Scale()


def test_user_bounds_scale_min_max_and_win_over_the_atari_table():
    scales = env_scales("auto", ["CartPole-v1=0,500", "ALE/Pong-v5=-21,21"], ["CartPole-v1", "ALE-Pong-v5"], "the runs")
    assert scales["CartPole-v1"] == Scale("min-max", 0.0, 500.0) and scales["ALE-Pong-v5"] == Scale("min-max", -21.0, 21.0)
    np.testing.assert_allclose(scales["CartPole-v1"].apply([0, 250, 500]), [0.0, 0.5, 1.0])
    lower_is_better = env_scales("minmax", ["Pendulum-v1=-1500,0"], ["Pendulum-v1"], "--env-ids")["Pendulum-v1"]
    np.testing.assert_allclose(lower_is_better.apply([-1500, -150]), [0.0, 0.9])


@pytest.mark.parametrize(
    "mode, bounds, env_ids, message",
    [
        ("human", [], ["CartPole-v1"], "only the 57 Atari games have; none for: CartPole-v1"),
        ("minmax", ["CartPole-v1=0,500"], ["CartPole-v1", "Acrobot-v1"], "--score-bounds ENV=LO,HI for every env; missing: Acrobot-v1"),
        ("none", ["CartPole-v1=0,500"], ["CartPole-v1"], "--score-bounds and --normalize none contradict each other"),
        ("auto", ["CartPole-v1=5,5"], ["CartPole-v1"], "--score-bounds takes ENV=LO,HI with two different finite numbers"),
        ("auto", ["CartPole-v1=0"], ["CartPole-v1"], "--score-bounds takes ENV=LO,HI"),
        ("auto", ["Acrobot-v1=-500,0"], ["CartPole-v1"], "--score-bounds names 'Acrobot-v1', which is not one of --env-ids CartPole-v1"),
    ],
)
def test_bad_normalisation_flags_are_refused_with_the_fix(mode, bounds, env_ids, message):
    with pytest.raises(FleetError, match=None) as error:
        env_scales(mode, bounds, env_ids, "--env-ids")
    assert message in str(error.value)


# ---- the benchmark summary -----------------------------------------------------------------------


def results(returns_by_env: dict[str, list[float | None]]) -> list[Result]:
    return [Result(Run(env, seed), 0, 1.0, final_return=value) for env, values in returns_by_env.items()
            for seed, value in enumerate(values, 1)]  # fmt: skip


def test_benchmark_summary_has_a_row_per_env_and_one_over_all_envs_once_every_env_is_normalised():
    made_up = results({"CartPole-v1": [500.0] * 4, "Acrobot-v1": [-250.0] * 3 + [None]})  # a run without a return
    args = stats.StatsArgs(score_bounds=["CartPole-v1=0,500", "Acrobot-v1=-500,0"], bootstrap_reps=REPS)
    scales = stats.check_args(args, ["CartPole-v1", "Acrobot-v1"], "--env-ids")
    rows, notes = interval_summary(["CartPole-v1", "Acrobot-v1"], made_up, scales, args)
    assert [row.env for row in rows] == ["CartPole-v1", "Acrobot-v1", stats.ALL_ENVS] and notes == []
    assert rows[0].estimates["IQM"] == stats.Estimate(1.0, 1.0, 1.0) and rows[1].estimates["mean"].point == pytest.approx(0.5)
    # all envs: 3 runs of each (the fourth CartPole run is left out so that the array is runs x envs)
    assert rows[2].runs == 3 and "the first 3 of each" in rows[2].cells()[2]
    assert rows[2].estimates["mean"].point == pytest.approx(0.75) and rows[2].estimates["optimality gap"].point == pytest.approx(0.25)

    raw_args = stats.StatsArgs(bootstrap_reps=REPS)
    raw = stats.check_args(raw_args, ["CartPole-v1", "Acrobot-v1"], "--env-ids")
    rows, notes = interval_summary(["CartPole-v1", "Acrobot-v1"], made_up, raw, raw_args)
    assert [row.env for row in rows] == ["CartPole-v1", "Acrobot-v1"] and rows[0].cells()[-1] == "-"
    assert "No row over all envs" in notes[0] and "--score-bounds" in notes[0]
    one_seed, notes = interval_summary(["CartPole-v1"], results({"CartPole-v1": [10.0]}), raw, raw_args)
    assert one_seed == [] and "2 or more seeds" in notes[0]


# ---- `fleetrl compare` on made-up runs ----------------------------------------------------------


def write_run(run_dir: Path, final: float, points: int = 20, steps_per_point: int = 100, tag: str = RETURN_TAG) -> None:
    """A run whose returns climb to ``final`` and stay there for its last 10 points: its final return is ``final``."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    for i in range(points):
        writer.add_scalar(tag, final * min(1.0, (i + 1) / (points - 10)), (i + 1) * steps_per_point)
    writer.close()


def write_benchmark(folder: Path, finals_by_env: dict[str, list[float]]) -> Path:
    for env, finals in finals_by_env.items():
        for seed, final in enumerate(finals, 1):
            write_run(folder / f"{env}__{seed}", final)
    return folder


@pytest.fixture(scope="module")
def two_configurations(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    good = write_benchmark(root / "good", {"CartPole-v1": [400.0 + 10 * i for i in range(10)]})
    bad = write_benchmark(root / "bad", {"CartPole-v1": [40.0 + 5 * i for i in range(10)]})
    return good, bad


def test_compare_prints_intervals_and_a_probability_of_improvement_that_repeats_and_draws_three_pngs(two_configurations, tmp_path, capsys):
    good, bad = two_configurations
    args = CompareArgs(paths=(str(good), str(bad)), out=str(tmp_path / "out"),
                       stats=stats.StatsArgs(score_bounds=["CartPole-v1=0,500"], bootstrap_reps=REPS))  # fmt: skip
    compare(args)
    first = capsys.readouterr().out
    # IQM of 400, 410, ..., 490 by hand: the middle 6 (420..470), 445, normalised by 500
    assert "| good | CartPole-v1 | min-max (0, 500) | 10 | 0.890 [" in first
    assert "| good | bad | 1.000 [1.000, 1.000] |" in first and "| bad | good | 0.000 [0.000, 0.000] |" in first
    for name in ("intervals.png", "profiles.png", "sample_efficiency.png"):
        assert (tmp_path / "out" / name).read_bytes().startswith(PNG_MAGIC)
    assert "| good | bad | 1.000 [1.000, 1.000] |" in (tmp_path / "out" / "compare.md").read_text()
    compare(args)
    assert capsys.readouterr().out == first


def test_compare_of_identical_configurations_gives_a_probability_of_improvement_of_one_half(two_configurations, tmp_path, capsys):
    good, _ = two_configurations
    twin = write_benchmark(tmp_path / "twin", {"CartPole-v1": [400.0 + 10 * i for i in range(10)]})
    compare(CompareArgs(paths=(str(good), str(twin)), out=str(tmp_path / "out"), stats=stats.StatsArgs(bootstrap_reps=REPS)))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| good | twin |")]
    point, low, high = (float(x) for x in rows[0].split("|")[3].replace("[", " ").replace("]", " ").replace(",", " ").split())
    assert point == 0.5 and low < 0.5 < high


def test_compare_of_several_envs_without_normalisation_prints_per_env_intervals_and_no_figures(tmp_path, capsys):
    a = write_benchmark(tmp_path / "a", {"CartPole-v1": [100.0, 200.0, 300.0], "Acrobot-v1": [-100.0, -90.0, -80.0]})
    b = write_benchmark(tmp_path / "b", {"CartPole-v1": [10.0, 20.0, 30.0], "Acrobot-v1": [-500.0, -400.0, -300.0]})
    compare(CompareArgs(paths=(str(a), str(b)), labels=["A", "B"], out=str(tmp_path / "out"), stats=stats.StatsArgs(bootstrap_reps=REPS)))
    out = capsys.readouterr().out
    assert "| A | CartPole-v1 | return | 3 | 200.0 [" in out and "| A | Acrobot-v1 | return | 3 |" in out
    assert "| A | B | 1.000 [1.000, 1.000] |" in out  # the probability of improvement needs no normalisation
    assert "No row over all envs" in out and "No figures" in out and not (tmp_path / "out" / "intervals.png").exists()


def test_bad_compare_input_is_one_clear_paragraph_and_a_non_zero_exit(two_configurations, tmp_path):
    good, bad = two_configurations
    empty = tmp_path / "empty"
    empty.mkdir()
    acrobot = write_benchmark(tmp_path / "acrobot", {"Acrobot-v1": [-100.0, -90.0]})
    no_returns = tmp_path / "no_returns"
    write_run(no_returns / "CartPole-v1__1", 1.0, tag="charts/SPS")
    cases = [
        ([], "needs one folder per configuration"),
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(empty)], f"No runs under {empty}"),
        ([str(good), str(acrobot)], "The configurations ran different envs (good: CartPole-v1; acrobot: Acrobot-v1)"),
        ([str(good), str(bad), "--labels", "only-one"], "--labels gives 1 name for 2 configurations"),
        ([str(no_returns)], "No run of no_returns on CartPole-v1 logged a return"),
        ([str(good), str(good / "CartPole-v1__1")], "is in two configurations"),
        ([str(good), "--normalize", "human"], "only the 57 Atari games have; none for: CartPole-v1"),
        ([str(good), "--bootstrap-reps", "0"], "--bootstrap-reps must be"),
    ]
    for i, (flags, message) in enumerate(cases):  # the first through a real process, the rest in this one
        proc = (run_fleetrl if i == 0 else run_fleetrl_in_process)("compare", *flags, "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, (flags, proc.stdout, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, (flags, proc.stderr)
