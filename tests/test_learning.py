"""Every algorithm learns something measurable in about 20 s of one core: seed 1, CleanRL's defaults but for the budget
(and, for SAC, TD3 and DDPG, an earlier start of learning), run in this process and stopped as soon as its rolling mean
of 10 episodes reaches a bar well above a random policy's (--stop-at-return), with the eval of the trained policies.
Each algorithm is a class, so the xdist workers share them out (--dist loadscope keeps a class together).

The minutes-long runs that used to be here (each algorithm to a higher bar, PPO to 950 on InvertedPendulum, SAC to
300) and the full-budget comparisons are `make bench-learning` (benchmarks/learning.py), with their table in
docs/benchmarks.md. Learning checks in other files: C51 (test_c51.py), Rainbow (test_rainbow.py), PQN (test_pqn.py)
and parameter-shared multi-agent PPO (test_multiagent.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars

from conftest import require_module, run_fleetrl_in_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a loaded host: a run's CPU seconds stretch
PENDULUM = ["--env-id", "InvertedPendulum-v5", "--env-backend", "sync"]
CARTPOLE = ["--env-id", "CartPole-v1"]
NO_VELOCITY = ["--env-id", "CartPoleNoVel-v1"]
# the on-policy networks' precision pinned: --precision auto measures bf16 against fp32 on a host with native bf16, so
# its choice, and the numbers a seed gives, would follow the host; TestPpo.test_learns_at_bf16 runs the other path
FP32 = ["--precision", "fp32"]
WINDOW = 10  # episodes in the rolling mean that a bar asks for (--stop-window)
# A random policy scores 22.7 on CartPole-v1 and CartPoleNoVel-v1, 5.1 on InvertedPendulum-v5 (200 episodes each).


@dataclass(frozen=True)
class Check:
    flags: list[str]
    budget: int  # about twice the steps seed 1 needs, so a slower host or another numerics path has room
    bar: float


# the step at which seed 1's rolling mean reached each bar (measured 2026-12-07 at fp32, one torch thread)
CHECKS = {
    "ppo": Check(["ppo", *CARTPOLE, *FP32], 40_000, 200),  # 18.8k steps
    "ppo-bf16": Check(["ppo", *CARTPOLE, "--precision", "bf16"], 40_000, 200),  # 16.2k
    # the sampler thread acts one update behind the learner, and it still learns: 12.5k
    "ppo-lag": Check(["ppo", *CARTPOLE, *FP32, "--policy-lag", "1"], 40_000, 200),
    # PPO's continuous actions, its MuJoCo defaults: 200, 40x a random policy, at 18.9k (950 at 30k: make bench-learning)
    "ppo-continuous": Check(["ppo", *PENDULUM, *FP32], 40_000, 200),
    # PPG, its classic-control defaults (ppo.py's, 1 policy epoch, an auxiliary phase every 32 iterations of 512 steps,
    # observations and rewards normalised): 200 at 20.2k, past its first auxiliary phase (16.4k)
    "ppg": Check(["ppg", *CARTPOLE, *FP32], 40_000, 200),
    # PPO-RND, its classic-control defaults (ppo.py's, with RND's coefficients; the statistics started by 50 random
    # rollouts): 100 at 21k (150 at 47k)
    "ppo_rnd": Check(["ppo_rnd", *CARTPOLE, *FP32], 60_000, 100),
    # CartPoleNoVel-v1 hides the velocities: ppo_lstm 100 at 4.5k (150 at 9.4k, 500 at 28k); memoryless PPO's best
    # rolling mean is 39 in these 12k steps, 53 in 30k. Not a shorter budget: the learning rate anneals over it, so at
    # 9k ppo_lstm needs 6.8k steps, and memoryless PPO's whole 12k take 1.4 s
    "ppo_lstm": Check(["ppo_lstm", *NO_VELOCITY, *FP32], 12_000, 100),
    "ppo-no-memory": Check(["ppo", *NO_VELOCITY, *FP32], 12_000, 100),
    # DQN, its defaults (epsilon falls over 20k steps, learning from 10k): 150 at 26.6k
    "dqn": Check(["dqn", *CARTPOLE], 40_000, 150),
    # discrete SAC, its classic-control defaults (learning from 5k): 150 at 11.9k
    "sac_discrete": Check(["sac_discrete", *CARTPOLE], 25_000, 150),
    # SAC learning from 1k with minibatches of 128 (CleanRL: 5k and 256): 75, 15x a random policy, at 2.4k (300 at 13k:
    # make bench-learning)
    "sac": Check(["sac", *PENDULUM, "--learning-starts", "1000", "--batch-size", "128"], 6_000, 75),
    # TD3 learning from 5k instead of CleanRL's 25k: 50, 10x a random policy, at 6.2k (100 at 12k, 950 with a later
    # start at 46k: make bench-learning)
    "td3": Check(["td3", *PENDULUM, "--learning-starts", "5000"], 15_000, 50),
    # DDPG, TD3's settings: 75, 15x a random policy, at 7.6k
    "ddpg": Check(["ddpg", *PENDULUM, "--learning-starts", "5000"], 15_000, 75),
}


@dataclass
class Learned:
    run_dir: Path
    stdout: str
    steps: list[int]
    returns: list[float]

    def best_rolling_mean(self) -> float:
        return best_rolling_mean(self.returns, WINDOW)


def best_rolling_mean(values: list[float], window: int) -> float:
    if len(values) < window:
        return -np.inf
    return float(np.convolve(np.asarray(values, float), np.ones(window) / window, mode="valid").max())


def learn(root: Path, name: str, stop: bool = True) -> Learned:
    """``fleetrl train`` of one check in this process with one torch thread (this worker's count restored after),
    stopping at the check's bar unless ``stop`` is False."""
    import torch

    check, run_dir, threads = CHECKS[name], root / name, torch.get_num_threads()
    stop_flags = ["--stop-at-return", str(check.bar), "--stop-window", str(WINDOW)] if stop else []
    try:
        proc = run_fleetrl_in_process("train", *check.flags, "--seed", "1", "--total-timesteps", str(check.budget), "--no-cuda",
                                      "--torch-threads", "1", "--no-progress", *stop_flags, "--run-dir", str(run_dir))
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = read_scalars(run_dir, "charts/episodic_return")
    return Learned(run_dir, proc.stdout, [p.step for p in points], [p.value for p in points])


def assert_learned(name: str, run: Learned) -> None:
    """It reached its bar within its budget, from the level of the policy it started with."""
    check = CHECKS[name]
    assert run.best_rolling_mean() >= check.bar, (f"{name}: best rolling mean of {WINDOW} episodes in {check.budget:,} steps: "
                                                  f"{run.best_rolling_mean():.1f}, not {check.bar}")
    first = float(np.mean(run.returns[:WINDOW]))
    assert first < check.bar / 2, f"{name}: its first {WINDOW} episodes already averaged {first:.1f}: nothing to learn"


def evaluate(run_dir: Path, episodes: int, *flags: str) -> dict:
    """`fleetrl eval RUN --json`'s result, in this process."""
    proc = run_fleetrl_in_process("eval", str(run_dir), "--episodes", str(episodes), "--json", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def losses_logged(run: Learned, *tags: str) -> list[str]:
    return [tag for tag in tags if read_scalars(run.run_dir, f"losses/{tag}")]


@pytest.fixture(scope="class")
def trained(request, tmp_path_factory) -> Learned:
    """The run of the class's ``CHECK``, made once for the class's tests."""
    return learn(tmp_path_factory.mktemp("learning"), request.cls.CHECK)


# ------------------------------------------------------------------------------------------ PPO and its variants
class TestPpo:
    def test_learns_cartpole(self, tmp_path):
        assert_learned("ppo", learn(tmp_path, "ppo"))

    def test_learns_at_bf16(self, tmp_path):
        # the network's other numerics path (autocast around the network; emulated where the CPU lacks native bf16):
        # the same bar holds
        run = learn(tmp_path, "ppo-bf16")
        assert_learned("ppo-bf16", run)
        assert checkpoint.load_checkpoint(run.run_dir)["remembered"]["accel"]["dtype"] == "bf16"  # the choice it trained with

    def test_learns_one_update_behind_with_policy_lag_1(self, tmp_path):
        run = learn(tmp_path, "ppo-lag")
        assert_learned("ppo-lag", run)
        assert "one update behind the learner" in run.stdout
        assert [p.value for p in read_scalars(run.run_dir, "charts/policy_lag")][1:5] == [1, 1, 1, 1]

    def test_continuous_learns_inverted_pendulum_and_eval_plays_as_well_as_training_ended(self, tmp_path):
        require_module("mujoco", "mujoco")
        run = learn(tmp_path, "ppo-continuous")
        assert_learned("ppo-continuous", run)
        last10 = float(np.mean(run.returns[-WINDOW:]))
        result = evaluate(run.run_dir, 10)  # the final policy's mean action
        assert result["mean_return"] >= 0.9 * last10, (result["mean_return"], last10)


class TestPpoLstm:
    def test_memory_learns_cartpole_without_velocities_where_memoryless_ppo_does_not(self, tmp_path):
        # the velocities are hidden, so a policy must infer them from the observations it has seen: ppo_lstm reaches
        # the bar; memoryless PPO, given the same budget whole, stays below it (benchmarks/learning.py --suite memory:
        # 300k steps, 3 seeds each)
        assert_learned("ppo_lstm", learn(tmp_path, "ppo_lstm"))
        memoryless = learn(tmp_path, "ppo-no-memory", stop=False)
        assert memoryless.steps[-1] >= 0.9 * CHECKS["ppo-no-memory"].budget, "memoryless PPO ran its whole budget"
        assert memoryless.best_rolling_mean() < CHECKS["ppo_lstm"].bar, memoryless.best_rolling_mean()


class TestPpg:
    CHECK = "ppg"

    def test_learns_cartpole_and_logs_cleanrls_scalars(self, trained):
        assert_learned(self.CHECK, trained)
        # CleanRL's ppg_procgen.py scalars: PPO's, and the auxiliary phase's once a phase
        scalars = ["policy_loss", "value_loss", "entropy", "approx_kl"]
        assert losses_logged(trained, *scalars) == scalars
        assert [p.step for p in read_scalars(trained.run_dir, "losses/aux/kl_loss")][:1] == [32 * 512]

    def test_eval_plays_the_trained_policy_greedily_and_repeatably_with_its_observation_statistics(self, trained):
        # the run stopped at a rolling 207 (20.2k steps); its greedy policy plays 500 three times, its samples 282, 358
        # and 128
        greedy, again = evaluate(trained.run_dir, 3), evaluate(trained.run_dir, 3)
        assert again["returns"] == greedy["returns"], "the greedy policy plays the same episodes from the same seed"
        assert greedy["mean_return"] >= CHECKS[self.CHECK].bar, greedy


class TestPpoRnd:
    CHECK = "ppo_rnd"

    def test_learns_cartpole_and_logs_cleanrls_scalars_and_the_curiosity(self, trained):
        assert_learned(self.CHECK, trained)
        scalars = ["policy_loss", "value_loss", "fwd_loss", "approx_kl"]  # CleanRL's ppo_rnd_envpool.py scalars
        assert losses_logged(trained, *scalars) == scalars
        assert all(p.value > 0 for p in read_scalars(trained.run_dir, "charts/curiosity_reward"))

    def test_eval_plays_the_trained_policy_greedily_and_repeatably(self, trained):
        # the run stopped at a rolling 114 (24k steps); its greedy policy plays 78, 78 and 89, its samples 55, 76 and 54
        greedy, again = evaluate(trained.run_dir, 3), evaluate(trained.run_dir, 3)
        assert again["returns"] == greedy["returns"], "the greedy policy plays the same episodes from the same seed"
        assert greedy["mean_return"] >= 50, greedy  # over twice a random policy's 22.7


# ------------------------------------------------------------------------------------------ DQN and discrete SAC
class TestDqn:
    CHECK = "dqn"

    def test_learns_cartpole_and_logs_cleanrls_scalars(self, trained):
        assert_learned(self.CHECK, trained)
        assert all(read_scalars(trained.run_dir, tag) for tag in ("losses/td_loss", "losses/q_values", "charts/epsilon", "charts/SPS"))

    def test_eval_plays_greedy_repeatably_and_stochastic_explores(self, trained):
        # the greedy policy of the run that reached 150 (26.6k steps, epsilon 0.05) plays 239 over 5 episodes;
        # --stochastic explores at the run's final epsilon, so the same seed's episodes end elsewhere (237)
        greedy, again, stochastic = (evaluate(trained.run_dir, 5, *flags) for flags in ([], [], ["--stochastic"]))
        assert greedy["episodes"] == 5 and greedy["mean_return"] >= CHECKS[self.CHECK].bar, greedy
        assert again["returns"] == greedy["returns"], "a greedy policy plays the same episodes from the same seed"
        assert stochastic["returns"] != greedy["returns"], "--stochastic must take exploring actions"
        assert stochastic["mean_return"] >= 0.5 * CHECKS[self.CHECK].bar, stochastic  # 5% random actions, not a random policy (22.7)


class TestSacDiscrete:
    CHECK = "sac_discrete"

    def test_learns_cartpole_and_logs_cleanrls_scalars(self, trained):
        assert_learned(self.CHECK, trained)
        scalars = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss", "alpha", "alpha_loss"]  # sac_atari.py's
        assert losses_logged(trained, *scalars) == scalars

    def test_eval_plays_the_trained_actor_greedily_repeatably_and_better_than_its_samples(self, trained):
        # the run stopped at a rolling 163 (11.8k steps); its greedy actor plays 500, 433 and 253, its samples 154, 209
        # and 249 (the entropy target keeps the policy at least 70/30 on CartPole's two actions)
        greedy, again, sampled = (evaluate(trained.run_dir, 3, *flags) for flags in ([], [], ["--stochastic"]))
        assert again["returns"] == greedy["returns"], "the greedy actor plays the same episodes from the same seed"
        assert greedy["mean_return"] >= CHECKS[self.CHECK].bar and greedy["mean_return"] > sampled["mean_return"], (greedy, sampled)


# ------------------------------------------------------------------------------------------ SAC, TD3, DDPG
class TestSac:
    CHECK = "sac"

    def test_learns_inverted_pendulum_and_logs_cleanrls_scalars(self, trained):
        assert_learned(self.CHECK, trained)
        scalars = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss", "alpha", "alpha_loss"]
        assert losses_logged(trained, *scalars) == scalars

    def test_eval_runs_the_policy_deterministically_as_well_as_it_samples_and_as_training_reached(self, trained):
        # the run stopped at a rolling 81 (2.5k steps); its mean action plays 93 over 10 episodes, its samples 91.
        # Training's returns carry SAC's sampling noise and its earlier, weaker policies. So young a policy samples
        # about as well as it acts on its mean, hence the 0.9 (at 300, 13k steps, the mean action played 1,000)
        deterministic, sampled = evaluate(trained.run_dir, 10), evaluate(trained.run_dir, 10, "--stochastic")
        assert deterministic["episodes"] == sampled["episodes"] == 10
        assert deterministic["returns"] != sampled["returns"], "--stochastic must sample the actions"
        assert deterministic["mean_return"] >= 0.9 * sampled["mean_return"], (deterministic, sampled)
        assert deterministic["mean_return"] >= trained.best_rolling_mean(), (deterministic, trained.best_rolling_mean())


class TestTd3:
    def test_learns_inverted_pendulum_and_logs_cleanrls_scalars_without_alpha(self, tmp_path):
        run = learn(tmp_path, "td3")
        assert_learned("td3", run)
        scalars = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss"]
        assert losses_logged(run, *scalars, "alpha") == scalars


class TestDdpg:
    CHECK = "ddpg"

    def test_learns_inverted_pendulum_and_logs_cleanrls_scalars_of_one_critic(self, trained):
        assert_learned(self.CHECK, trained)
        scalars = ["qf1_values", "qf1_loss", "actor_loss"]  # CleanRL's DDPG scalars: one critic
        assert losses_logged(trained, *scalars, "qf2_loss", "qf_loss") == scalars

    def test_eval_plays_the_actor_deterministically_and_repeatably_and_stochastic_explores(self, trained):
        # the final actor of the run that reached 75 (7.6k steps) plays 70, 70 and 66; --stochastic adds its exploration
        # noise, so the episodes differ
        deterministic, again, stochastic = (evaluate(trained.run_dir, 3, *flags) for flags in ([], [], ["--stochastic"]))
        assert again["returns"] == deterministic["returns"], "the deterministic actor plays the same episodes from the same seed"
        assert deterministic["mean_return"] >= 25, deterministic  # 5x a random policy
        assert stochastic["returns"] != deterministic["returns"], "--stochastic must add the exploration noise"
