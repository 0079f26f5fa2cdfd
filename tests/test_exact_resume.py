"""Every algorithm resumes exactly, in this process: a run stopped as SIGTERM stops it (at the end of a chosen iteration),
then resumed with --resume auto, ends bit for bit where an uninterrupted run ends: networks, optimisers, and with them
the RNG streams, the replay buffer (--save-buffer) and each algorithm's own state (RND's statistics, the LSTM's states
in flight, PPG's stored rollouts). The stop is the signal handler's own flag set at a known step, so no run races a
signal; each stop path keeps one test with a real SIGTERM (test_sac_discrete.py, test_ppo_rnd.py, test_ppg.py)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars
from fleetrl.run import Run

from conftest import assert_same_learner, run_fleetrl_in_process

# envs whose episodes never differ: a resume starts fresh episodes (docs/reliability.md), and the resumed run sees
# what the uninterrupted one saw, so only the learner, the buffer and the RNG streams carry over
# (one torch thread, as the suite's runs in their own processes have: a run sets this process's count)
STATELESS = ["--env-id", "fleetrl_test_envs:Stateless-v0", "--no-cuda", "--env-backend", "sync", "--no-progress", "--torch-threads", "1"]
STATELESS_BOX = ["--env-id", "fleetrl_test_envs:StatelessBox-v0", *STATELESS[2:]]
OFF_POLICY = ["--total-timesteps", "1000", "--learning-starts", "300", "--batch-size", "32", "--checkpoint-every", "2", "--save-buffer"]
ON_POLICY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--precision", "fp32",
             # normalisation would see the resumed run's restarted episodes (one more reset observation, discounted
             # returns from 0), which no env can avoid
             "--normalize", "False"]
PPG = ["ppg", *STATELESS, *ON_POLICY, "--n-iteration", "4", "--e-auxiliary", "2", "--num-aux-rollouts", "2",
       "--total-timesteps", str(12 * 32), "--checkpoint-every", "4"]
TWIN_Q = (("actor", "qf", "target_actor", "qf_target"), ("q_optimizer", "actor_optimizer"))
# SAC makes an actor and an alpha update besides each critic update, the costliest per step: 700 steps (400 updates, the
# stop after 200) reach the same branches, its target updates each step and its policy updates every second
SAC_OFF_POLICY = [flag if flag != "1000" else "700" for flag in OFF_POLICY]


@dataclass
class Case:
    train: list[str]  # `fleetrl train` and these flags
    stop_at: int  # the stop comes in the iteration that reaches this global step
    networks: tuple[str, ...] = ("model",)
    optimizers: tuple[str, ...] = ("optimizer",)
    logged: tuple[str, list[int]] | None = None  # a scalar each iteration logs once, and its steps
    mid_phase: bool | None = None  # PPG: whether the stopped run's checkpoint is mid-phase
    exact: bool = True  # False: a resume without the replay buffer, which refills it and so learns on other samples
    extra: dict = field(default_factory=dict)


def steps(first: int, last: int, every: int) -> list[int]:
    return list(range(first, last + 1, every))


CASES = {
    "ppo": Case(["ppo", *STATELESS, *ON_POLICY, "--total-timesteps", str(12 * 32), "--checkpoint-every", "3"], 5 * 32,
                logged=("charts/learning_rate", steps(32, 12 * 32, 32))),
    "ppo_lstm": Case(["ppo_lstm", *STATELESS, *ON_POLICY, "--update-epochs", "2", "--total-timesteps", str(12 * 32), "--checkpoint-every", "3"],
                     5 * 32),
    "ppo_rnd": Case(["ppo_rnd", *STATELESS, *ON_POLICY[:-2], "--num-iterations-obs-norm-init", "2", "--total-timesteps", str(12 * 32),
                     "--checkpoint-every", "1"], 5 * 32, logged=("losses/fwd_loss", steps(32, 12 * 32, 32))),
    # PPG stopped halfway through its second phase: under --stop-rollouts-gb with a checkpoint that holds the phase's
    # stored rollouts; above it (0) at once without one, resuming from the phase's end before
    "ppg": Case([*PPG, "--stop-rollouts-gb", "1"], 6 * 32, mid_phase=True),
    "ppg_over_the_rollouts_limit": Case([*PPG, "--stop-rollouts-gb", "0"], 6 * 32, mid_phase=False),
    "pqn": Case(["pqn", *STATELESS, "--num-steps", "32", "--precision", "fp32", "--total-timesteps", str(10 * 128), "--checkpoint-every", "2"],
                5 * 128, logged=("charts/epsilon", steps(128, 10 * 128, 128))),
    "dqn": Case(["dqn", *STATELESS, *OFF_POLICY, "--buffer-size", "1000", "--target-network-frequency", "200"], 600,
                ("q_network", "target_network"), logged=("charts/epsilon", steps(100, 1000, 100))),
    "c51": Case(["c51", *STATELESS, *OFF_POLICY, "--buffer-size", "1000", "--target-network-frequency", "200"], 600,
                ("q_network", "target_network"), logged=("charts/epsilon", steps(100, 1000, 100))),
    # the buffer's priorities and waiting n-step transitions, and the noise buffers, carry over too
    "rainbow": Case(["rainbow", *STATELESS, *OFF_POLICY, "--buffer-size", "1000"], 600, ("q_network", "target_network"),
                    logged=("charts/beta", steps(100, 1000, 100))),
    # alpha and the three Adams carry over
    "sac_discrete": Case(["sac_discrete", *STATELESS, *OFF_POLICY, "--target-network-frequency", "200"], 600,
                         ("actor", "qf1", "qf2", "qf1_target", "qf2_target"), ("q_optimizer", "actor_optimizer", "a_optimizer"),
                         logged=("losses/alpha_loss", steps(400, 1000, 100))),
    "sac": Case(["sac", *STATELESS_BOX, *SAC_OFF_POLICY], 500, ("actor", "qf", "qf_target"), ("q_optimizer", "actor_optimizer", "a_optimizer"),
                logged=("losses/qf1_loss", steps(400, 700, 100))),
    # without --save-buffer the resume refills the buffer and says so, then runs to the end (as after kill -9:
    # test_dqn.py's real SIGKILL)
    "sac_without_its_buffer": Case(["sac", *STATELESS_BOX, *(flag for flag in OFF_POLICY if flag != "--save-buffer")], 600,
                                   exact=False),
    "td3": Case(["td3", *STATELESS_BOX, *OFF_POLICY], 600, *TWIN_Q, logged=("losses/actor_loss", steps(400, 1000, 100))),
    "ddpg": Case(["ddpg", *STATELESS_BOX, *OFF_POLICY], 600, *TWIN_Q, logged=("losses/actor_loss", steps(400, 1000, 100))),
}


def stopping_at(stop_at: int):
    """``Run.end_iteration`` that, in the iteration reaching ``stop_at``, finds the flag the SIGTERM handler sets."""
    end_iteration = Run.end_iteration

    def end_iteration_stopped(self: Run, iteration: int, global_step: int, *args, **kwargs):
        if global_step >= stop_at:
            self._signal = signal.SIGTERM
        return end_iteration(self, iteration, global_step, *args, **kwargs)

    return end_iteration_stopped


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """The runs set this process's torch threads (--torch-threads 1); the tests after get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def train(case: Case, run_dir: Path, *more: str):
    return run_fleetrl_in_process("train", *case.train, "--run-dir", str(run_dir), *more)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CASES))
def test_a_stopped_run_resumed_ends_bit_identical_to_an_uninterrupted_one(tmp_path, monkeypatch, name):
    case = CASES[name]
    if case.exact:  # the uninterrupted run to compare with (a resume that refills its buffer is compared with its budget)
        whole = train(case, tmp_path / "whole")
        assert whole.returncode == 0, whole.stderr[-3000:]

    with monkeypatch.context() as patch:
        patch.setattr(Run, "end_iteration", stopping_at(case.stop_at))
        stopped = train(case, tmp_path / "part")
    assert stopped.returncode != 0 and "stopped by SIGTERM" in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    at_stop = checkpoint.load_checkpoint(tmp_path / "part")
    budget = int(case.train[case.train.index("--total-timesteps") + 1])
    total = int(checkpoint.load_checkpoint(tmp_path / "whole")["global_step"]) if case.exact else budget
    assert total == budget
    if case.mid_phase is None:
        assert case.stop_at <= int(at_stop["global_step"]) < total, "the stopped run checkpointed the iteration it stopped in"
    else:  # PPG's phases are 4 iterations of 32 steps
        assert (int(at_stop["global_step"]) % (4 * 32) != 0) is case.mid_phase, int(at_stop["global_step"])
    if name == "ppo_lstm":
        assert "recurrent_state" in at_stop["ranks"][0]["actor"], "the states in flight are in the checkpoint"
    if name == "ppo_rnd":
        assert at_stop["rnd_obs_rms"]["count"] > 2 * 2 * 16 and at_stop["ranks"][0]["rnd_reward_filter"]["rewems"].abs().sum() > 0

    resumed = train(case, tmp_path / "part", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    if "--save-buffer" in case.train:
        assert "refills" not in resumed.stderr, "with --save-buffer a resume keeps the buffer"
    if not case.exact:
        assert "refills" in resumed.stderr, "a resume without --save-buffer says it refills the buffer"
        assert int(checkpoint.load_checkpoint(tmp_path / "part")["global_step"]) == total
        return
    if name == "ppg":
        assert "distils the" not in resumed.stderr, "the stored rollouts came back"
    if name == "ppo_rnd":
        assert "random actions" not in resumed.stdout, "a resumed run keeps its statistics"

    a, b = checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(tmp_path / "part")
    assert_same_learner(a, b, case.networks, case.optimizers)
    if name in ("sac_discrete", "sac"):
        assert torch.equal(a["log_alpha"]["0"], b["log_alpha"]["0"]) and a["log_alpha"]["0"].item() != 0.0, "alpha was tuned alike"
    if name == "ppo_rnd":
        for stats in ("rnd_obs_rms", "rnd_reward_rms"):
            assert all(torch.equal(a[stats][k], b[stats][k]) for k in a[stats]), stats
    if case.logged:
        tag, expected = case.logged
        assert [p.step for p in read_scalars(tmp_path / "part", tag)] == expected, f"every iteration logged {tag} once"
    if name == "rainbow":
        # eval: greedy on the mean weights, the same returns for a seed (on CartPole: the same spaces, and episodes that end)
        results = []
        for _ in range(2):
            proc = run_fleetrl_in_process("eval", str(tmp_path / "whole"), "--env-id", "CartPole-v1", "--episodes", "2", "--seed", "5", "--json")
            assert proc.returncode == 0, proc.stderr[-3000:]
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        assert results[0]["episodes"] == 2 and results[0] == results[1], results


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ppg_run_that_ended_mid_phase_goes_on_from_its_stored_rollouts_exactly(tmp_path):
    # 6 iterations end halfway through the second phase: the checkpoint holds its 2 stored rollouts, and extended to 8
    # iterations the run distils them with the next 2, as an uninterrupted 8-iteration run does
    ppg = PPG[: PPG.index("--total-timesteps")]
    whole = run_fleetrl_in_process("train", *ppg, "--total-timesteps", str(8 * 32), "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    part = run_fleetrl_in_process("train", *ppg, "--total-timesteps", str(6 * 32), "--run-dir", str(tmp_path / "part"))
    assert part.returncode == 0, part.stderr[-3000:]
    longer = run_fleetrl_in_process("train", *ppg, "--total-timesteps", str(8 * 32), "--run-dir", str(tmp_path / "part"), "--resume", "auto")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "distils the" not in longer.stderr, "the stored rollouts came back"
    assert_same_learner(checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(tmp_path / "part"))
    assert [p.step for p in read_scalars(tmp_path / "part", "losses/aux/kl_loss")] == [4 * 32, 8 * 32]
