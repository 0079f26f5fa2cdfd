"""DDPG: CleanRL's ddpg_continuous_action.py loop step for step (lockstep), and the soft target update as CleanRL
writes it. Discrete actions refused are test_sac_td3.py's, an exact resume and one that refills the buffer
test_exact_resume.py's, torchrun replicas test_every_algorithm.py's; learning and eval on InvertedPendulum are
test_learning.py's; the copy template, test_user_algos.py's."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fleetrl.offpolicy import soft_update


sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lockstep_with_cleanrls_ddpg_loop_actions_updates_losses_and_weights_bit_for_bit():
    # benchmarks/vs_cleanrl.py ddpg --lockstep, short: CleanRL's loop given fleetrl's three differences (numpy warm-up
    # draws, copied target networks, fused Adam). It found three more, all fixed in fleetrl: updates started one step
    # early and the actor updated on the odd steps (the loop counted the step being taken); the soft update was lerp_,
    # which rounds otherwise than CleanRL's tau * p + (1 - tau) * t; and the exploration noise was randn * scale * 0.1,
    # where CleanRL's torch.normal(0, scale * 0.1) is randn * (scale * 0.1).
    # 300 steps reach each of those: the warm-up's end at 100, 199 critic steps, the actor and both targets on the 99
    # even steps after it, and 80 episode ends (a young actor keeps the pole up for 2 to 10 steps). Each of the bugs
    # parted the bits at its first step, so the 1,500 steps from 500 that this ran before (4x the time) proved no more
    from versus import ddpg as lockstep

    opts = SimpleNamespace(env_id="InvertedPendulum-v5", steps=300, learning_starts=100, seed=3)
    verdicts = lockstep.lockstep(opts)
    assert all(v.startswith("identical") for v in verdicts.values()), verdicts
    assert verdicts["update_steps"] == "identical (298)" and verdicts["target_steps"] == "identical (99)", verdicts


def test_soft_update_is_cleanrls_arithmetic_and_tau_1_copies():
    torch.manual_seed(0)
    source, target = torch.nn.Linear(7, 5), torch.nn.Linear(7, 5)
    expected = [(0.005 * p.data + (1 - 0.005) * t.data) for p, t in zip(source.parameters(), target.parameters())]
    soft_update(target, source, 0.005)
    assert all(torch.equal(t, e) for t, e in zip(target.parameters(), expected))
    soft_update(target, source, 1.0)  # DQN's target copy
    assert all(torch.equal(t, p) for t, p in zip(target.parameters(), source.parameters()))
