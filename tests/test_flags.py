"""PPO flags change what they say: each checked on the loss, the optimiser or a real run, not only parsed."""

import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos.ppo import Agent, Args, ppo_loss
from fleetrl.distributed import Dist
from fleetrl.monitor.tbread import read_scalars

from conftest import fleetrl_env, require_module, run_fleetrl_here

TINY = ["--num-envs", "2", "--num-steps", "64", "--checkpoint-every", "1000"]  # 128 a batch
CARTPOLE = ["--env-id", "CartPole-v1", "--no-cuda", *TINY]


def minibatch(seed: int = 0) -> tuple[Agent, dict]:
    """An agent and a minibatch whose new values stray past the clip range, with advantages far from mean 0 std 1."""
    torch.manual_seed(seed)
    agent = Agent((4,), gym.spaces.Discrete(2))
    obs = torch.randn(32, 4)
    with torch.no_grad():
        actions = torch.randint(0, 2, (32,))
        logprobs, _, values = agent.evaluate({"obs": obs, "actions": actions})
    mb = {"obs": obs, "actions": actions, "logprobs": logprobs + 0.3 * torch.randn(32), "advantages": 5 + 3 * torch.randn(32),
          "returns": values.flatten() + 2 * torch.randn(32), "values": values.flatten() + torch.randn(32)}
    return agent, mb


@pytest.mark.parametrize("flag", ["norm_adv", "clip_vloss"])
def test_no_norm_adv_and_no_clip_vloss_change_the_loss(flag):
    agent, mb = minibatch()
    on_loss, on = ppo_loss(agent, mb, Args(clip_coef=0.2, ent_coef=0.01), Dist())
    off_loss, off = ppo_loss(agent, mb, Args(clip_coef=0.2, ent_coef=0.01, **{flag: False}), Dist())
    changed = "policy_loss" if flag == "norm_adv" else "value_loss"
    kept = "value_loss" if flag == "norm_adv" else "policy_loss"
    assert not torch.isclose(on[changed], off[changed]), f"--no-{flag.replace('_', '-')} must change the {changed}"
    assert torch.equal(on[kept], off[kept]) and not torch.isclose(on_loss, off_loss)
    if flag == "clip_vloss":  # unclipped: the plain squared error
        assert off["value_loss"] == pytest.approx(0.5 * ((agent.evaluate(mb)[2].flatten() - mb["returns"]) ** 2).mean().item())


def lr_steps(run_dir) -> list[float]:
    return [p.value for p in read_scalars(run_dir, "charts/learning_rate")]


@pytest.mark.slow
def test_no_anneal_lr_keeps_the_learning_rate_flat_and_target_kl_stops_the_epochs_early(tmp_path):
    runs = {"default": [], "flat": ["--no-anneal-lr"], "kl": ["--target-kl", "1e-9"]}
    for name, flags in runs.items():
        proc = run_fleetrl_here("train", "ppo", *CARTPOLE, "--total-timesteps", "384", "--no-progress", "--run-dir", str(tmp_path / name), *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert lr_steps(tmp_path / "flat") == pytest.approx([2.5e-4] * 3)
    annealed = lr_steps(tmp_path / "default")
    assert annealed[0] == pytest.approx(2.5e-4) and annealed[-1] == pytest.approx(2.5e-4 / 3), annealed

    def adam_steps(name: str) -> int:
        state = checkpoint.load_checkpoint(tmp_path / name)["optimizer"]["state"]
        return int(next(iter(state.values()))["step"])

    # 3 iterations of 4 epochs x 4 minibatches; a KL target nothing meets stops each after its first epoch
    assert adam_steps("default") == 3 * 4 * 4
    assert adam_steps("kl") == 3 * 4


def run_probed(tmp_path, *flags: str, cuda: bool = False, here: bool = False) -> list[tuple[str, int, int]]:
    """Train on TorchProbe-v0 in one process (sync envs): (when, torch threads, CUDA bytes allocated) at each env
    reset and at close. ``here``: in this process (torch's threads restored after), else in a process of its own."""
    probe = tmp_path / "probe"
    argv = ["train", "ppo", *TINY, "--env-id", "fleetrl_test_envs:TorchProbe-v0", "--env-backend", "sync", "--total-timesteps", "256",
            "--run-dir", str(tmp_path / "run"), "--cuda" if cuda else "--no-cuda", *flags]
    if here:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FLEETRL_TORCH_PROBE", str(probe))
            proc = run_fleetrl_here(*argv, "--no-progress")
    else:
        env = {**fleetrl_env(threads=1), "FLEETRL_TORCH_PROBE": str(probe)}
        proc = subprocess.run([sys.executable, "-m", "fleetrl", *argv], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [(when, int(threads), int(cuda_bytes)) for when, threads, cuda_bytes in (line.split() for line in probe.read_text().splitlines())]


@pytest.mark.slow
def test_torch_threads_sets_the_learners_threads(tmp_path):
    # acting runs on 1 thread by design (sampler.py); the learner's threads are the trainer thread's outside rollouts
    # in this process, whose own thread count is restored after each run
    closes = [threads for when, threads, _ in run_probed(tmp_path, "--torch-threads", "3", here=True) if when == "close"]
    assert closes[-1] == 3, closes  # the training envs close last (an env made earlier to read the spaces may close first)
    (tmp_path / "default").mkdir()
    default = [threads for when, threads, _ in run_probed(tmp_path / "default", here=True) if when == "close"]
    assert default[-1] != 3, "without the flag the plan picks another count (cores / processes): the flag made the difference"


@pytest.mark.slow
def test_resume_with_a_larger_total_continues_to_it_and_keeps_the_saved_flags(tmp_path):
    run_dir = tmp_path / "run"
    first = run_fleetrl_here("train", "ppo", *CARTPOLE, "--total-timesteps", "512", "--learning-rate", "1e-3", "--ent-coef", "0.02",
                             "--run-dir", str(run_dir), "--no-progress")
    assert first.returncode == 0, first.stderr[-3000:]
    more = run_fleetrl_here("train", "ppo", "--resume", "auto", "--run-dir", str(run_dir), "--total-timesteps", "1024", "--no-cuda", "--no-progress")
    assert more.returncode == 0, more.stderr[-3000:]
    final = checkpoint.load_checkpoint(run_dir)
    assert int(final["global_step"]) == 1024
    assert final["args"]["total_timesteps"] == 1024, "the flag given again wins"
    assert final["args"]["learning_rate"] == 1e-3 and final["args"]["ent_coef"] == 0.02 and final["args"]["num_envs"] == 2, "saved flags kept"
    steps = [p.step for p in read_scalars(run_dir, "charts/learning_rate")]
    assert steps == [128 * i for i in range(1, 9)], "continued to the new total, no TensorBoard step repeated"
    assert min(lr_steps(run_dir)) > 2.5e-4 / 8, "the saved learning rate (1e-3), not the default, drives the schedule"


@pytest.mark.slow
def test_sticky_actions_reaches_the_atari_env(tmp_path, monkeypatch):
    require_module("ale_py", "atari")
    from fleetrl.cli import main
    from fleetrl.envs import atari

    made, real_make = [], gym.make

    def recording_make(*args, **kwargs):  # the real env, its settings noted
        made.append(kwargs.get("repeat_action_probability"))
        return real_make(*args, **kwargs)

    monkeypatch.setattr(atari.gym, "make", recording_make)
    main(["train", "ppo", "--env-id", "BreakoutNoFrameskip-v4", "--env-backend", "sync", "--num-envs", "2", "--num-steps", "8",
          "--num-minibatches", "2", "--total-timesteps", "16", "--sticky-actions", "0.4", "--run-dir", str(tmp_path / "run"), "--no-cuda",
          "--no-progress"])
    assert checkpoint.load_checkpoint(tmp_path / "run")["global_step"] == 16
    assert made and set(made) == {0.4}, made  # NoFrameskip-v4 would otherwise get 0
