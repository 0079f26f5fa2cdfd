"""fleetrl's optimizers are torch's, bit for bit, and a run that does not compile never imports torch._dynamo (which
costs every process 1.4 s of CPU at its start: fleetrl/optim.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fleetrl import optim

from conftest import fleetrl_env


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def _train(net, optimizer, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        net(torch.randn(32, 4, generator=generator)).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("fused", [True, False])
def test_adam_trains_bit_for_bit_as_torchs_and_their_state_dicts_load_into_each_other(fused):
    ours, theirs = _net(), _net()
    ours_opt = optim.Adam(ours.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    theirs_opt = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    _train(ours, ours_opt, 20)
    _train(theirs, theirs_opt, 20)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))

    # a checkpoint's optimizer state moves either way and training goes on identically
    resumed_ours, resumed_theirs = _net(), _net()
    resumed_ours.load_state_dict(theirs.state_dict())
    resumed_theirs.load_state_dict(ours.state_dict())
    ours_again = optim.Adam(resumed_ours.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    theirs_again = torch.optim.Adam(resumed_theirs.parameters(), lr=1e-3, eps=1e-5, fused=fused)
    ours_again.load_state_dict(theirs_opt.state_dict())
    theirs_again.load_state_dict(ours_opt.state_dict())
    _train(resumed_ours, ours_again, 5, seed=2)
    _train(resumed_theirs, theirs_again, 5, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(resumed_ours.parameters(), resumed_theirs.parameters()))


def test_sgd_steps_as_torchs():
    ours, theirs = _net(), _net()
    _train(ours, optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), 10)
    _train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9), 10)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


@pytest.mark.parametrize("algo, flags", [
    # a CNN at fp32 has a memory format to measure on every CPU (an MLP's only choice, bf16, exists only where the CPU
    # runs bf16 natively), so PPO's precision probe trains here on any host
    pytest.param("ppo", ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "1",
                         "--update-epochs", "1", "--total-timesteps", "32", "--precision", "fp32"], id="ppo-cnn-precision-probe"),
    pytest.param("ppo", ["--env-id", "CartPole-v1", "--total-timesteps", "512"], id="ppo-mlp"),
    pytest.param("dqn", ["--env-id", "CartPole-v1", "--total-timesteps", "600", "--learning-starts", "500"], id="dqn"),
])
def test_a_run_that_does_not_compile_never_imports_torch_dynamo(algo, flags, tmp_path):
    # in a fresh process with a fresh cache of measured settings, so PPO's precision probe trains too
    code = ("import sys; from fleetrl.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch._dynamo imported:', 'torch._dynamo' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, "train", algo, *flags, "--no-cuda", "--no-progress", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env={**fleetrl_env(1), "FLEETRL_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "--precision" in flags:  # the precision probe's training steps ran in this process too
        assert "precision:" in proc.stdout and "measured" in proc.stdout and "before" not in proc.stdout, proc.stdout
    assert proc.stdout.strip().endswith("torch._dynamo imported: False"), proc.stdout[-2000:]
