"""Procgen through EnvPool, trained by PPO with the IMPALA CNN (skips without envpool's Procgen)."""

import pytest

from conftest import run_fleetrl


@pytest.mark.slow
def test_ppo_trains_procgen_with_the_impala_cnn(tmp_path):
    pytest.importorskip("envpool")
    from fleetrl.envs.native import native_backend_support

    if not native_backend_support("CoinrunEasy-v0", "procgen")["envpool"]:
        pytest.skip("EnvPool's Procgen needs the system Qt 5 GUI library (apt-get install libqt5gui5)")
    run_dir = tmp_path / "coinrun"
    proc = run_fleetrl("train", "ppo", "--env-id", "CoinrunEasy-v0", "--num-envs", "4", "--num-steps", "32",
                       "--total-timesteps", "256", "--run-dir", str(run_dir), "--no-cuda", timeout=600, threads=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "env backend: envpool" in proc.stdout and "(procgen)" in proc.stdout
    import torch

    state = torch.load(next((run_dir / "checkpoints").glob("*.pt")), weights_only=True)
    assert any("trunk.net" in k for k in state["model"]) and state["family"] == "procgen"
