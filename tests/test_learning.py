"""Learning actually happens, with the default hyperparameters and full step budgets."""

import numpy as np
import pytest

from fleetrl.monitor.tbread import read_scalars

from conftest import killed_on_exit, require_module, run_fleetrl, start_fleetrl_group

pytestmark = pytest.mark.slow


def best_rolling_mean(values, window):
    values = np.asarray(values, float)
    if len(values) < window:
        return -np.inf
    return float(np.convolve(values, np.ones(window) / window, mode="valid").max())


@pytest.mark.timeout(1500)
def test_ppo_solves_cartpole_with_default_hyperparameters_for_two_of_three_seeds(tmp_path):
    seeds = (1, 2, 3)
    procs = {seed: start_fleetrl_group("train", "ppo", "--env-id", "CartPole-v1", "--seed", str(seed), "--torch-threads", "1",
                                 "--run-dir", str(tmp_path / f"s{seed}"), "--no-cuda", "--checkpoint-every", "1000",
                                 "--stop-at-return", "475", "--stop-window", "20")  # a seed that reaches it is done
             for seed in seeds}
    best = {}
    with killed_on_exit(*procs.values()):
        for seed, proc in procs.items():
            out, _ = proc.communicate(timeout=1200)
            assert proc.returncode == 0, out[-3000:]
            returns = [p.value for p in read_scalars(tmp_path / f"s{seed}", "charts/episodic_return")]
            best[seed] = best_rolling_mean(returns, 20)
    assert sum(b >= 475 for b in best.values()) >= 2, f"best rolling mean of 20 episodes per seed: {best}"


@pytest.mark.timeout(1900)
def test_ppo_continuous_solves_inverted_pendulum_and_eval_matches_training(tmp_path):
    require_module("mujoco", "mujoco")
    run_dir = tmp_path / "ip"
    proc = run_fleetrl("train", "ppo", "--env-id", "InvertedPendulum-v5", "--total-timesteps", "150000", "--stop-at-return", "950",
                       "--stop-window", "10", "--run-dir", str(run_dir), "--no-cuda", timeout=1200, threads=2)  # eval: the policy that reached it
    assert proc.returncode == 0, proc.stderr[-3000:]
    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    assert best_rolling_mean(returns, 10) >= 950, f"best rolling mean of 10: {best_rolling_mean(returns, 10)}"
    last10 = float(np.mean(returns[-10:]))
    evaluated = run_fleetrl("eval", str(run_dir), "--episodes", "10", "--json", timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    import json

    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert result["mean_return"] >= 0.9 * last10, (result["mean_return"], last10)
