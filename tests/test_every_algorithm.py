"""Every algorithm under torchrun, and the compute layer's checks on 2 real ranks, from one 2-rank job on 127.0.0.1
(tests/dist_every_algorithm.py): each algorithm's replicas end bit-identical, with what is particular to it (a replay
shard per rank, PPG's auxiliary phases, RND's shared statistics, Rainbow's shared noise); the averaged gradient and
update equal one process's; advantage and observation normalisation see both ranks' data. One launch and one torch
import per rank serve them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars
from fleetrl.sampling import normalize

from conftest import TESTS_DIR, fleetrl_env

import dist_every_algorithm as job  # noqa: E402  (the tests folder is importable: conftest puts it on sys.path)

REPLICAS_IN_SYNC = "replicas in sync: 2 ranks hold bit-identical parameters"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The folder of the one 2-rank job that ran every check; its launcher's output is in launcher.log."""
    out = tmp_path_factory.mktemp("every_algorithm")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(TESTS_DIR / "dist_every_algorithm.py"), str(out)], capture_output=True, text=True, timeout=1500,
                          env=fleetrl_env())
    (out / "launcher.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return out


def finished(out: Path, name: str) -> str:
    """Rank 0's output of job ``name``, once both ranks are shown to have ended it with status 0."""
    folder = out / name
    for rank in (0, 1):
        status = folder / f"rank{rank}.json"
        assert status.exists(), f"rank {rank} never finished {name}: " + (out / "launcher.log").read_text()[-3000:]
        log = (folder / f"rank{rank}.log").read_text()
        assert json.loads(status.read_text())["returncode"] == 0, f"rank {rank} of {name} failed:\n{log[-4000:]}"
    return (folder / "rank0.log").read_text()


def test_the_job_trains_every_algorithm_fleetrl_has():
    from fleetrl.algos import ALGOS

    one_process = {"qdagger"}  # refuses torchrun (tests/test_qdagger.py): its distillation weight reads each episode's end
    assert set(job.TRAIN) | one_process == set(ALGOS), "an algorithm added to fleetrl gets its 2-rank run in dist_every_algorithm.TRAIN"


# ------------------------------------------------------------------------------------------ every algorithm's replicas
def particular_to(algo: str, run_dir: Path, state: dict) -> None:
    """What each algorithm's 2-rank run proves besides identical replicas."""
    if algo == "ppo":
        total = 4 * 512
        lengths = [p.value for p in read_scalars(run_dir, "charts/episodic_length")]
        # every env step of both ranks belongs to a logged episode, except each env's unfinished last one
        assert sum(lengths) > total - 4 * 500 and sum(lengths) > 0.75 * total, (sum(lengths), total)
        assert int(state["global_step"]) == total
    elif algo == "ppg":  # through two auxiliary phases, whose all-reduced updates keep the replicas equal
        assert [p.step for p in read_scalars(run_dir, "losses/aux/kl_loss")] == [256, 512]
    elif algo == "ppo_rnd":
        # the statistics took in both ranks' observations: 2 random rollouts and 4 training ones of 4 envs x 32 steps
        assert float(state["rnd_obs_rms"]["count"]) == pytest.approx(6 * 4 * 32, abs=1e-3)
        assert [p.step for p in read_scalars(run_dir, "losses/fwd_loss")] == [128, 256, 384, 512]
    elif algo == "pqn":
        assert int(state["global_step"]) == 512 and read_scalars(run_dir, "losses/td_loss")
    elif algo in ("dqn", "c51"):  # each rank its own envs and replay shard: its sampling RNG saved per rank
        assert int(state["global_step"]) == (2400 if algo == "dqn" else 1000) and len(state["ranks"]) == 2
        assert read_scalars(run_dir, "losses/td_loss" if algo == "dqn" else "losses/loss")
    elif algo == "rainbow":
        # each rank samples its own shard by its own priorities; the noise comes from a generator rank 0 seeds
        # (fleetrl.distributed.shared_generator), else the noise buffers, and so the replicas, would differ
        assert state["world_size"] == 2 and state["global_step"] == 1200
    elif algo in ("sac_discrete", "sac", "td3", "ddpg"):
        assert state["global_step"] == 600 and read_scalars(run_dir, "losses/qf1_loss")


@pytest.mark.slow
@pytest.mark.timeout(1600)
@pytest.mark.parametrize("algo", list(job.TRAIN))
def test_two_ranks_train_to_bit_identical_replicas(two_ranks, algo):
    output = finished(two_ranks, algo)
    assert REPLICAS_IN_SYNC in output, output[-3000:]
    run_dir = two_ranks / algo / "run"
    state = checkpoint.load_checkpoint(run_dir)
    assert state["world_size"] == 2, state["world_size"]
    particular_to(algo, run_dir, state)


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_a_bad_flag_under_torchrun_is_refused_once_not_by_every_rank(two_ranks):
    statuses = [json.loads((two_ranks / "bad_flag" / f"rank{rank}.json").read_text())["returncode"] for rank in (0, 1)]
    output = "".join((two_ranks / "bad_flag" / f"rank{rank}.log").read_text() for rank in (0, 1))
    assert 0 not in statuses and output.count("fleetrl: error:") == 1 and "--num-minibatches 7" in output, (statuses, output[-3000:])


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_torchrun_two_ranks_train_parameter_shared_ppo_to_identical_replicas(two_ranks):
    # a multi-agent game's agents share PPO's parameters; each rank steps whole games, and the replicas stay equal
    output = finished(two_ranks, "ma_ppo")
    assert REPLICAS_IN_SYNC in output, output[-3000:]
    assert [p.step for p in read_scalars(two_ranks / "ma_ppo" / "run", "losses/policy_loss")] == [128, 256, 384, 512]
    # 6 agent rows are 3 games of 2 agents, which 2 ranks cannot split into whole games
    statuses = [json.loads((two_ranks / "ma_bad_rows" / f"rank{rank}.json").read_text())["returncode"] for rank in (0, 1)]
    output = "".join((two_ranks / "ma_bad_rows" / f"rank{rank}.log").read_text() for rank in (0, 1))
    assert 0 not in statuses and "multiple of 4" in output, (statuses, output[-3000:])


# ------------------------------------------------------------------------------------------ the compute layer
def in_one_process(script_main, folder: Path) -> None:
    """A dist_*_check script's ``main`` at world size 1, here; it may change the default dtype (float64), restored after."""
    folder.mkdir()
    dtype = torch.get_default_dtype()
    try:
        script_main(str(folder))
    finally:
        torch.set_default_dtype(dtype)


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_averaged_gradient_and_update_at_world_size_two_equal_world_size_one(two_ranks, tmp_path):
    import dist_grad_check

    finished(two_ranks, "grad")
    in_one_process(dist_grad_check.main, tmp_path / "w1")
    w1 = torch.load(tmp_path / "w1" / "rank0.pt")
    r0, r1 = torch.load(two_ranks / "grad" / "rank0.pt"), torch.load(two_ranks / "grad" / "rank1.pt")
    assert torch.equal(r0["grads"], r1["grads"]) and torch.equal(r0["params"], r1["params"]), "replicas take the identical step"
    torch.testing.assert_close(r0["grads"], w1["grads"], atol=1e-5, rtol=0)
    torch.testing.assert_close(r0["params"], w1["params"], atol=1e-5, rtol=0)
    assert w1["grads"].abs().max() > 1e-3, "a meaningful gradient, not zeros"


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_advantages_with_a_large_mean_normalise_on_two_ranks_as_in_one_process(two_ranks, tmp_path):
    import dist_adv_norm_check

    finished(two_ranks, "adv_norm")
    in_one_process(dist_adv_norm_check.main, tmp_path / "w1")
    whole = torch.load(tmp_path / "w1" / "rank0.pt")
    halves = torch.cat([torch.load(two_ranks / "adv_norm" / f"rank{r}.pt") for r in (0, 1)])
    assert 0.9 < float(whole.std()) < 1.1, "normalised to unit spread"
    torch.testing.assert_close(halves, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_every_backward_pattern_of_two_syncs_averages_to_the_global_batch_gradient_on_two_ranks(two_ranks):
    # tests/test_grad_sync.py's worker: twin critics and an actor through every call pattern of two GradientSyncs
    finished(two_ranks, "grad_sync")
    for rank in range(2):
        output = (two_ranks / "grad_sync" / f"rank{rank}.log").read_text()
        assert f"rank {rank}: every gradient equals the global batch's" in output, output[-3000:]


def recorded_statistics(record_dir: Path, gamma: float) -> dict[str, np.ndarray]:
    """The statistics a single normaliser would hold after seeing every rank's env data: observations (reset ones,
    and step ones but for a finished episode's final one, which the same-step reset replaces) and discounted returns."""
    observations, returns = [], []
    for path in record_dir.glob("*.txt"):
        ret = 0.0
        for line in path.read_text().splitlines():
            kind, *values = line.split()
            if kind == "reset":
                observations.append([float(v) for v in values])
                continue
            done, reward, obs = int(values[0]), float(values[1]), [float(v) for v in values[2:]]
            ret = ret * gamma + reward
            returns.append(ret)
            if done:
                ret = 0.0
            else:
                observations.append(obs)

    def from_prior(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        prior = normalize.RunningMeanStd(data.shape[1:])
        prior.merge_sums(np.concatenate([[len(data)], data.sum(0).ravel(), np.square(data).sum(0).ravel()]))
        return prior.mean, prior.var

    (obs_mean, obs_var), (ret_mean, ret_var) = from_prior(np.array(observations, np.float32).astype(np.float64)), from_prior(np.array(returns))
    return {"obs_mean": obs_mean, "obs_var": obs_var, "reward_mean": ret_mean, "reward_var": ret_var,
            "obs_count": len(observations), "reward_count": len(returns)}


@pytest.mark.slow
@pytest.mark.timeout(1600)
def test_normalisation_statistics_are_identical_on_both_ranks_and_equal_those_of_both_ranks_data(two_ranks):
    finished(two_ranks, "norm")
    folder = two_ranks / "norm"
    record_dir, run_dir = folder / "records", folder / "run"
    ranks = [dict(np.load(folder / f"rank{r}.npz")) for r in (0, 1)]
    for key in ranks[0]:
        assert np.array_equal(ranks[0][key], ranks[1][key]), f"{key} differs between the ranks"
    gamma = checkpoint.load_checkpoint(run_dir)["args"].get("gamma") or 0.99
    expected = recorded_statistics(record_dir, gamma)
    assert len(list(record_dir.glob("*.txt"))) == 4, "two envs per rank, each recording its data"
    assert ranks[0]["obs_count"] == pytest.approx(expected["obs_count"] + 1e-4) and ranks[0]["reward_count"] == pytest.approx(expected["reward_count"] + 1e-4)
    for key in ("obs_mean", "obs_var", "reward_mean", "reward_var"):
        np.testing.assert_allclose(ranks[0][key], expected[key], rtol=1e-7, err_msg=key)
    saved = checkpoint.load_checkpoint(run_dir)
    np.testing.assert_allclose(saved["obs_rms"]["mean"].numpy(), expected["obs_mean"], rtol=1e-7)
