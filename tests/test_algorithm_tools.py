"""The tools work for the algorithms of issue 36 as for PPO: `fleetrl benchmark` runs their seeds and prints the
interval summary, `fleetrl plot` and `fleetrl compare` read those runs, and `fleetrl tune` passes a trial's values to
their flags. (eval, torchrun, resume and SIGTERM are each algorithm's own test file's; `--slurm` is the benchmark
runner's, whatever the command; several trials at once are test_tune's, and the bootstrap's own checks test_stats's,
so 100 resamples do here.) The tools run in this process; the runs they start are real `fleetrl train` processes."""

from __future__ import annotations

import shutil

import pytest
from optuna.trial import TrialState

from conftest import run_fleetrl_here
from fleetrl.checkpoint import load_checkpoint
from test_tune import load, tune_args, write_space

pytestmark = pytest.mark.slow

# per algorithm: a tiny CartPole run (ppg: 2 iterations, then one auxiliary phase; ppo_rnd: 2 iterations; sac_discrete:
# updates from step 250 of 500), and a search space over two of its own flags
ALGOS = {
    "ppg": (["--total-timesteps", "512", "--num-envs", "2", "--num-steps", "128", "--n-iteration", "2", "--e-auxiliary", "1",
             "--num-aux-rollouts", "2"],
            "learning-rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\nbeta-clone: {type: float, low: 0.5, high: 1.0}\n"),
    "ppo_rnd": (["--total-timesteps", "512", "--num-envs", "2", "--num-steps", "128", "--num-iterations-obs-norm-init", "1"],
                "learning-rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\nint-coef: {type: float, low: 0.5, high: 1.0}\n"),
    "sac_discrete": (["--total-timesteps", "500", "--learning-starts", "250", "--buffer-size", "500", "--batch-size", "32"],
                     "q-lr: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\ntarget-entropy-scale: {type: float, low: 0.5, high: 0.9}\n"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_benchmark_plot_compare_and_tune_run_the_algorithm(tmp_path, algo, child_env):
    flags, space = ALGOS[algo]
    command = ["fleetrl", "train", algo, *flags, "--env-backend", "sync"]
    out = tmp_path / "bench"
    # 100 resamples (the least allowed), not 2,000: the intervals' bootstrap was most of this test's own CPU
    bench = run_fleetrl_here("benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "2", "--workers", "2", "--bootstrap-reps", "100",
                             "--out", str(out), "--", *command)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "| CartPole-v1 | return | 2 |" in bench.stdout and "IQM [95% CI]" in bench.stdout

    plot = run_fleetrl_here("plot", str(out), "-o", str(tmp_path / "curves.png"))
    assert plot.returncode == 0 and (tmp_path / "curves.png").stat().st_size > 0, plot.stderr[-3000:]
    shutil.copytree(out, tmp_path / "same")  # a second configuration of the same runs: P(a > b) is one half
    compare = run_fleetrl_here("compare", str(out), str(tmp_path / "same"), "--labels", "a", "b", "--bootstrap-reps", "100",
                               "--out", str(tmp_path / "compare"))
    assert compare.returncode == 0 and "| a | b | 0.500 [" in compare.stdout, compare.stdout + compare.stderr

    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    # one trial shows the algorithm's flags reach its trainer; --parallel 2 gives it one thread, as a run beside another
    tune = run_fleetrl_here(*tune_args(tmp_path, "--trials", "1", "--parallel", "2", "--storage", storage, "--out", str(tmp_path / "tune"),
                                       space=write_space(tmp_path, space), command=command))
    assert tune.returncode == 0, tune.stdout + tune.stderr
    study = load(storage)
    assert len(study.trials) == 1 and all(t.state == TrialState.COMPLETE for t in study.trials)
    assert f"fleetrl train {algo}" in tune.stdout
    for trial in study.trials:  # each tuned value is what the algorithm's trainer trained with, as its checkpoint saved it
        assert sorted(trial.params) == sorted(line.split(":")[0] for line in space.splitlines()), trial.params
        assert len(trial.user_attrs["run_dirs"]) == 1, trial.user_attrs  # one seed: one run
        for run_dir in trial.user_attrs["run_dirs"]:
            state = load_checkpoint(run_dir)
            saved = state["args"]
            assert state["algo"] == algo
            assert {name: saved[name.replace("-", "_")] for name in trial.params} == trial.params, run_dir
            assert saved["total_timesteps"] == int(flags[flags.index("--total-timesteps") + 1]), "the command's fixed flags too"
