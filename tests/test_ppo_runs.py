"""Real PPO runs: kill and resume, a planted non-finite loss, a stop at a return. The killed run and one eval are
processes of their own (SIGKILL, and eval's real process); the other runs go through the CLI's entry point in the test's
process (issue 46: a process start that imports torch costs about 2.5 s)."""

import os
import signal
import time

import pytest

from fleetrl import checkpoint
from fleetrl.monitor.tbread import read_scalars

from conftest import killed_on_exit, run_fleetrl, run_fleetrl_here, start_fleetrl_group

pytestmark = pytest.mark.slow


def wait_for_checkpoints(run_dir, count, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(checkpoint.list_checkpoints(run_dir)) >= count:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    raise AssertionError(f"no {count} checkpoints in {run_dir} after {timeout}s")


@pytest.mark.timeout(900)
def test_killed_run_resumes_to_the_requested_steps_with_continuous_step_lr_and_logs(tmp_path):
    run_dir = tmp_path / "run"
    # killed after its second checkpoint (iteration 10) and half a second: on a fast host (~20 iterations a second) still
    # far from iteration 60
    iterations, batch = 60, 512
    proc = start_fleetrl_group("train", "ppo", "--total-timesteps", str(iterations * batch), "--checkpoint-every", "5",
                               "--keep-checkpoints", "5", "--run-dir", str(run_dir), "--no-cuda")
    with killed_on_exit(proc):
        wait_for_checkpoints(run_dir, 2, proc)
        time.sleep(0.5)  # let it run past the checkpoint, so the killed run leaves logs to purge
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = checkpoint.load_checkpoint(run_dir)
    k_iter, k_step = int(killed_at["iteration"]), int(killed_at["global_step"])
    assert k_step == k_iter * batch and k_iter < iterations

    resumed = run_fleetrl_here("train", "ppo", "--resume", str(run_dir), "--no-cuda")  # only the killed run's process is under test
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = checkpoint.load_checkpoint(run_dir)
    assert int(final["global_step"]) == iterations * batch and int(final["iteration"]) == iterations

    lr = read_scalars(run_dir, "charts/learning_rate")
    steps = [p.step for p in lr]
    assert steps == [batch * i for i in range(1, iterations + 1)], "every iteration logged exactly once, no repeats"
    first_resumed = next(p for p in lr if p.step == (k_iter + 1) * batch)
    assert first_resumed.value == pytest.approx(2.5e-4 * (1 - k_iter / iterations), rel=1e-5), "the LR schedule continues"
    returns = read_scalars(run_dir, "charts/episodic_return")
    assert returns and all(p.step <= iterations * batch for p in returns)


def test_planted_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "nan"
    # the env returns a finite but huge reward (1e38) from its 1501st step, which passes the env output check and
    # overflows the loss: 4 envs x 128 steps puts that in iteration 12
    proc = run_fleetrl_here("train", "ppo", "--env-id", "fleetrl_test_envs:HugeReward-v0", "--total-timesteps", "51200",
                            "--checkpoint-every", "1", "--run-dir", str(run_dir), "--no-cuda")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "non-finite" in proc.stderr and "iteration 12" in proc.stderr and "ckpt_000000005632.pt" in proc.stderr
    assert "Traceback" not in proc.stderr
    last_good = checkpoint.load_checkpoint(run_dir)
    assert int(last_good["iteration"]) == 11
    # eval's own process, kept: the in-process evals elsewhere name this one (and test_pqn.py's, test_c51.py's)
    evaluated = run_fleetrl("eval", str(run_dir), "--env-id", "fleetrl_test_envs:HugeReward-v0", "--episodes", "2", timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stop_at_return_ends_the_run_once_the_recent_mean_reaches_it_and_checkpoints_that_step(tmp_path):
    run_dir, total = tmp_path / "run", 200_000
    proc = run_fleetrl_here("train", "ppo", "--env-id", "CartPole-v1", "--no-cuda", "--total-timesteps", str(total), "--stop-at-return", "60",
                            "--stop-window", "10", "--checkpoint-every", "1000", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    stopped_at = int(checkpoint.load_checkpoint(run_dir)["global_step"])
    assert stopped_at < total and f"global step {stopped_at:,}" in proc.stdout and "stopping early" in proc.stdout, proc.stdout[-2000:]
    episodes = read_scalars(run_dir, "charts/episodic_return")
    iteration_steps = [p.step for p in read_scalars(run_dir, "charts/SPS")]

    def reached_by(step):
        window = [p.value for p in episodes if p.step <= step][-10:]
        return len(window) == 10 and sum(window) / 10 >= 60

    assert iteration_steps[-1] == stopped_at, "the stop iteration is logged, then checkpointed"
    assert next(step for step in iteration_steps if reached_by(step)) == stopped_at, "it stops at the first iteration that reaches it"
    # a resume of the stopped run refills its window of episodes before it can stop again: it trains on, then stops
    resumed = run_fleetrl_here("train", "ppo", "--resume", "auto", "--run-dir", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert stopped_at < int(checkpoint.load_checkpoint(run_dir)["global_step"]) < total
