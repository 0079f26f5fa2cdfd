"""Checkpoints: atomic writes, retention, safe loading that refuses code, clear errors."""

import os

import pytest
import torch

from fleetrl import checkpoint
from fleetrl.errors import FleetError

from conftest import run_fleetrl_in_process


def state(step):
    return {"args": {"env_id": "CartPole-v1"}, "model": {"w": torch.full((3,), float(step))}, "global_step": step, "iteration": step}


def test_keeps_only_the_newest_checkpoints(tmp_path):
    for step in (100, 200, 300, 400):
        checkpoint.save_checkpoint(state(step), tmp_path, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt_000000000300.pt", "ckpt_000000000400.pt"]
    assert checkpoint.load_checkpoint(tmp_path)["global_step"] == 400  # a run folder means its newest


def test_a_crash_while_writing_leaves_the_last_good_checkpoint_intact(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(state(100), tmp_path, keep=3)
    real_save = torch.save

    def crash_midway(obj, f, *a, **k):
        f.write(b"partial bytes of a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(checkpoint.CheckpointWriteError, match="disk full"):  # streamed to disk: reported as a failed write
        checkpoint.save_checkpoint(state(200), tmp_path, keep=3)
    monkeypatch.setattr(torch, "save", real_save)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt_000000000100.pt"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["ckpt_000000000100.json", "ckpt_000000000100.pt"], "no temporary file is left behind"
    assert checkpoint.load_checkpoint(tmp_path)["model"]["w"].tolist() == [100.0] * 3


class Payload:
    """An object whose unpickling would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_with_pickled_code_is_refused_and_nothing_executes(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({**state(1), "extra": Payload(marker)}, evil)
    with pytest.raises(FleetError, match="Refused to load"):
        checkpoint.load_checkpoint(evil)
    assert not marker.exists()
    # the same through the command line: a clear error, a non-zero exit, no traceback, nothing run
    for command in (["eval", str(evil)], ["train", "ppo", "--resume", str(evil), "--run-dir", str(tmp_path / "r")]):
        proc = run_fleetrl_in_process(*command)
        assert proc.returncode != 0
        assert "Refused to load" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_missing_and_corrupt_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(FleetError, match="does not exist"):
        checkpoint.load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(FleetError, match="No checkpoint"):
        checkpoint.load_checkpoint(tmp_path)
    corrupt = tmp_path / "corrupt.pt"
    checkpoint.save_checkpoint(state(5), tmp_path, keep=1)
    corrupt.write_bytes(checkpoint.list_checkpoints(tmp_path)[0].read_bytes()[:100])
    with pytest.raises(FleetError, match="corrupt or truncated"):
        checkpoint.load_checkpoint(corrupt)


def test_rng_state_round_trips_through_a_safe_checkpoint(tmp_path):
    import random

    import numpy as np

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = checkpoint.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpoint.save_checkpoint({**state(1), "rng": saved}, tmp_path, keep=1)
    checkpoint.set_rng_state(checkpoint.load_checkpoint(tmp_path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
