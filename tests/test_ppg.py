"""PPG: CleanRL's ppg_procgen.py update code in lockstep (on EnvPool's Procgen), its network weight for weight, exact
resume mid-phase after a real SIGTERM (more stops, and a run extended past where it ended: test_exact_resume.py) from
a checkpoint that writes the phase's rollouts without copying them, --checkpoint-every at phase ends, and its bad input
refused. Learning on CartPole and greedy eval are test_learning.py's; the copy template,
test_user_algos.py's."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl import checkpoint
from fleetrl.algos import ppg
from fleetrl.errors import FleetError
from fleetrl.run import StoppedBySignal

from conftest import (assert_train_refused, killed_on_exit, require_module, run_fleetrl_here, skip_unless_ci, start_fleetrl_group,
                      wait_for_checkpoint)
from test_procgen import qt5_gui_installed

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def require_procgen() -> None:
    require_module("envpool", "envpool")
    if not qt5_gui_installed():  # as test_procgen.py: under CI=true a failure, where apt is there to install it
        skip_unless_ci("EnvPool's Procgen needs the system Qt 5 GUI library (apt-get install libqt5gui5)",
                       ci_provides=shutil.which("apt-get") is not None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lockstep_with_cleanrls_ppg_update_code_identical_given_fleetrls_rounding_and_close_without(monkeypatch):
    # benchmarks/vs_cleanrl.py ppg --lockstep's job on 2 envs x 16 steps (the benchmark's 4 x 32 took 3x the time): 2
    # phases of 2 iterations on StarpilotEasy-v0, the policy phase's 8 minibatch steps and the auxiliary phases' 8 (2
    # epochs of 2 minibatches of the phase's 4 rollouts, each phase). Given fleetrl's rounding of two quantities (the
    # whole-batch advantage normalisation in float64, the log-probabilities without torch.distributions) CleanRL's code
    # gives the same bits; rounding its own way it parts by 3e-4 (relative, losses) and 4e-4 (absolute, weights: Adam's
    # steps are lr-sized whatever the gradient, so a near-zero gradient that rounds to the other sign moves its weight
    # by 2 lr); at 4 x 32, 9e-4 and 1e-3
    require_procgen()
    from versus import ppg as lockstep
    from loops.ppg import LOCKSTEP  # the job both sides run (benchmarks/cleanrl/loops/ppg.py)

    for name, value in {"num_envs": 2, "num_steps": 16, "total_timesteps": 4 * 2 * 16}.items():
        monkeypatch.setitem(LOCKSTEP, name, value)
    verdicts = lockstep.lockstep(SimpleNamespace(env_id="StarpilotEasy-v0", seed=1))
    exact = {name: v for name, v in verdicts.items() if "CleanRL's rounding" not in name}
    assert all(v.startswith("identical") for v in exact.values()), verdicts
    assert exact["policy-phase losses"] == "identical (8)" and exact["auxiliary losses"] == "identical (8)", verdicts
    assert exact["weights after phase 2"] == "identical (38)", verdicts
    rounded = {name: v for name, v in verdicts.items() if "CleanRL's rounding" in name}
    assert rounded["initial weights, CleanRL's rounding"].startswith("identical"), verdicts
    for name, verdict in rounded.items():
        if not verdict.startswith("identical"):
            assert float(verdict.split("difference ")[1].split()[0]) < 1e-2, (name, verdict)


def test_the_procgen_network_is_cleanrls_weight_for_weight_from_the_same_seed():
    require_module("envpool", "envpool")  # the ported script imports it
    sys.path.insert(0, str(BENCHMARKS / "cleanrl"))
    import ppg_procgen

    envs = SimpleNamespace(single_observation_space=gym.spaces.Box(0, 255, (3, 64, 64), np.uint8), single_action_space=gym.spaces.Discrete(15))
    torch.manual_seed(4)
    theirs = ppg_procgen.Agent(envs)
    torch.manual_seed(4)
    ours = ppg.Agent((3, 64, 64), envs.single_action_space)
    assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    frames = torch.randint(0, 256, (5, 3, 64, 64), dtype=torch.uint8)
    logits, value = ours(frames)
    hidden = theirs.network(frames.float() / 255.0)
    torch.testing.assert_close(logits, theirs.actor(hidden), rtol=0, atol=0)
    torch.testing.assert_close(value, theirs.get_value(frames.float()).view(-1), rtol=0, atol=0)
    torch.testing.assert_close(ours.get_pi_value_and_aux_value(frames)[2], theirs.get_pi_value_and_aux_value(frames.float())[2], rtol=0, atol=0)


def test_the_value_head_reads_the_features_with_their_gradient_stopped_and_the_auxiliary_head_trains_the_encoder():
    torch.manual_seed(0)
    agent = ppg.Agent((4,), gym.spaces.Discrete(2))
    obs = torch.randn(8, 4)
    agent(obs)[1].sum().backward()  # the policy phase's value loss
    assert all(p.grad is None for p in agent.trunk.parameters()) and agent.critic.weight.grad is not None
    agent.zero_grad(set_to_none=True)
    agent.get_pi_value_and_aux_value(obs)[2].sum().backward()  # the auxiliary value loss
    assert all(p.grad is not None for p in agent.trunk.parameters())


PPG_TINY = ["train", "ppg", "--env-id", "fleetrl_test_envs:Stateless-v0", "--no-cuda", "--env-backend", "sync", "--no-progress",
            "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--n-iteration", "4", "--e-auxiliary", "2",
            "--num-aux-rollouts", "2", "--precision", "fp32",
            # normalisation would see the resumed run's restarted episodes; the model, optimiser, RNG streams and the
            # phase's stored rollouts must carry over exactly
            "--normalize", "False"]


def same_model(a: Path, b: Path) -> None:
    first, second = checkpoint.load_checkpoint(a), checkpoint.load_checkpoint(b)
    assert first["global_step"] == second["global_step"]
    for key in first["model"]:
        assert torch.equal(first["model"][key], second["model"][key]), key


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("stop_rollouts_gb", ["1"])  # "0", and a stop that surely lands mid-phase: test_exact_resume.py
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, stop_rollouts_gb):
    # each env step sleeps 5 ms: an iteration (2 x 16 steps) lasts 0.16 s or more, while 40 auxiliary epochs keep
    # every fourth iteration busy for longer, so the SIGTERM often arrives in an auxiliary phase; wherever it lands,
    # the run stops at the end of its iteration: under --stop-rollouts-gb (1 GB; the phase's rollouts are KBs) with a
    # checkpoint (mid-phase: with its stored rollouts), above it (0) mid-phase without one, resuming from the phase's
    # end before; either way the resumed run ends where an uninterrupted one does
    # the stopped run is the process the signal is sent to; the uninterrupted reference and the resume run in this process
    common = [*PPG_TINY, "--env-id", "fleetrl_test_envs:SlowStateless-v0", "--e-auxiliary", "40", "--total-timesteps", str(12 * 32),
              "--checkpoint-every", "4", "--stop-rollouts-gb", stop_rollouts_gb]
    whole = run_fleetrl_here(*common, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    proc = start_fleetrl_group(*common, "--run-dir", str(tmp_path / "part"))
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, tmp_path / "part", min_step=4 * 32)  # the first phase's end
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    stopped = checkpoint.load_checkpoint(tmp_path / "part")
    assert 4 * 32 <= stopped["global_step"] < 12 * 32
    if stop_rollouts_gb == "0":
        assert stopped["global_step"] % (4 * 32) == 0, "a stop mid-phase above the limit writes no checkpoint"
    resumed = run_fleetrl_here(*common, "--run-dir", str(tmp_path / "part"), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_model(tmp_path / "whole", tmp_path / "part")


def tiny_phase(num_envs: int = 2, num_steps: int = 8, n_iteration: int = 4, stop_rollouts_gb: float = 1.0,
               stop: bool = False) -> ppg.AuxiliaryPhase:
    """An auxiliary phase of ``n_iteration`` iterations of ``num_envs`` x ``num_steps`` 3x16x16 frames, outside a run
    (``stop``: the run got SIGTERM)."""
    args = ppg.Args(num_steps=num_steps, n_iteration=n_iteration, stop_rollouts_gb=stop_rollouts_gb, run_dir="runs/x")
    run = SimpleNamespace(args=args, dist=SimpleNamespace(world_size=1, is_main=True), device=torch.device("cpu"),
                          local_num_envs=num_envs, register_shard=lambda **objects: None, stop_requested=lambda: stop,
                          stopped=lambda: StoppedBySignal("stopped by SIGTERM at global step 16.", signal.SIGTERM),
                          last_checkpoint="runs/x/checkpoints/ckpt_000000000128.pt", command="fleetrl train ppg")
    return ppg.AuxiliaryPhase(run, agent=None, optimizer=None, grad_sync=None)


def store(phase: ppg.AuxiliaryPhase, iteration: int) -> None:
    """Keep iteration ``iteration``'s rollout (frames and returns that say which iteration, env and step they are)."""
    n, steps = phase.num_envs, phase.args.num_steps
    obs = torch.randint(0, 256, (steps * n, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(iteration))
    returns = torch.arange(steps * n, dtype=torch.float32) + 1000 * iteration
    assert phase.after_update(iteration, {"obs": obs, "returns": returns}) == {}


def test_a_mid_phase_checkpoint_writes_the_stored_rollouts_from_the_phases_own_tensors_and_reads_them_back(tmp_path):
    # a phase of 4 iterations holding 3: the checkpoint's rollouts are the phase's tensors themselves (a copy of 6.4 GB
    # at Procgen's defaults was most of a SIGTERM's time: benchmarks/costs.py preemption), 3/4 of the phase on disk, and
    # a fresh phase loaded from the file serves every rollout as the one that wrote it
    phase = tiny_phase()
    for iteration in (1, 2, 3):
        store(phase, iteration)
    state = phase.state_dict()
    assert state["stored"] == 6 and len(state["aux_obs"]) == 3
    assert all(saved.data_ptr() == kept.data_ptr() for saved, kept in zip(state["aux_obs"], phase.aux_obs)), "copied before writing"
    entry = checkpoint.write_shard({"aux_rollouts": state}, tmp_path, global_step=48, rank=0)
    frames = 3 * phase.aux_obs[0].nbytes  # 12 KB each; the archive's own records are a few KB
    assert frames <= entry["size"] < frames + phase.aux_obs[0].nbytes, "the file holds the stored rollouts, not the phase's storage"

    back = tiny_phase()
    back.load_state_dict(checkpoint.load_shard(tmp_path / "checkpoints" / entry["name"])["aux_rollouts"])
    every = np.arange(6)
    assert back.stored == 6 and torch.equal(back.rollouts(every), phase.rollouts(every))
    assert torch.equal(back.aux_returns[:, :6], phase.aux_returns[:, :6])


def test_the_auxiliary_phase_reads_the_rollouts_the_phase_wide_tensor_held_and_loads_its_checkpoints():
    # the distillation's minibatches gather whole env rollouts across the iterations' tensors: the very frames that
    # CleanRL's (num_steps, rollouts) tensor gives for the same indices; and a checkpoint of that layout still loads
    phase = tiny_phase()
    for iteration in (1, 2, 3):
        store(phase, iteration)
    wide = torch.cat(phase.aux_obs[:3], dim=1)  # (num_steps, 6 rollouts, 3, 16, 16), as fleetrl stored them before
    inds = np.array([5, 0, 3, 2])
    assert torch.equal(phase.rollouts(inds), wide[:, inds])
    old = tiny_phase()
    old.load_state_dict({"stored": 6, "aux_obs": wide.clone(), "aux_returns": phase.aux_returns[:, :6].clone()})
    assert torch.equal(old.rollouts(np.arange(6)), wide)


def test_a_checkpoint_of_a_phase_of_another_size_is_refused_in_one_paragraph():
    phase = tiny_phase()
    for iteration in (1, 2, 3):
        store(phase, iteration)
    with pytest.raises(FleetError, match=r"holds 6 rollouts .* --n-iteration 2 x 2 envs .* Resume it with the --n-iteration"):
        tiny_phase(n_iteration=2).load_state_dict(phase.state_dict())


def test_a_stop_mid_phase_writes_the_rollouts_up_to_the_limit_and_above_it_stops_at_once_naming_the_checkpoint_to_resume(capsys):
    # under --stop-rollouts-gb the stop's checkpoint holds them; above it (a Procgen phase's GBs would outlast the grace)
    # the checkpoint is not written and the run stops at once: its last checkpoint, at a phase's end, resumes it
    phases = {(stop, limit): tiny_phase(stop=stop, stop_rollouts_gb=limit) for stop in (True, False) for limit in (1.0, 0.0)}
    for phase in phases.values():
        store(phase, 1)
    assert phases[True, 1.0].state_dict()["stored"] == 2, "12 KB: the stop's checkpoint holds them"
    assert phases[False, 0.0].state_dict()["stored"] == 2, "no stop (the run's end): a checkpoint holds them whatever their size"
    assert capsys.readouterr().err == ""
    with pytest.raises(StoppedBySignal) as stopped:
        phases[True, 0.0].state_dict()
    assert stopped.value.exit_code == 143  # the run's own stop (Run.stopped), which names the checkpoint and the command
    said = capsys.readouterr().err
    assert len(said.strip().splitlines()) == 1, said
    for words in ("stopping mid-phase without a checkpoint", "--stop-rollouts-gb 0", "from the last checkpoint, "
                  "runs/x/checkpoints/ckpt_000000000128.pt, redoing the iterations since"):
        assert words in said, said


@pytest.mark.parametrize("given, n_iteration, becomes, noted", [(None, 32, 32, False), (None, 5, 5, False), (64, 32, 64, False),
                                                                (1, 4, 4, True), (100, 32, 128, True)])
def test_checkpoint_every_falls_on_phase_ends_rounded_up_with_a_note(given, n_iteration, becomes, noted, capsys):
    args = ppg.Args(env_id="CartPole-v1", n_iteration=n_iteration, checkpoint_every=given, num_envs=4, num_steps=128, num_minibatches=4,
                    total_timesteps=500_000, learning_rate=2.5e-4, clip_coef=0.2, ent_coef=0.01, gamma=0.99)
    ppg.validate(args)
    assert args.checkpoint_every == becomes
    said = " ".join(capsys.readouterr().err.split())
    if noted:
        assert f"--checkpoint-every {given} is rounded up to {becomes}, a multiple of --n-iteration {n_iteration}" in said, said
    else:
        assert said == ""


@pytest.mark.parametrize("flags, needles", [
    (["--env-id", "Pendulum-v1"], ["PPG", "Pendulum-v1"]),
    (["--env-id", "CartPole-v1", "--n-iteration", "0"], ["--n-iteration", "0"]),
    (["--env-id", "CartPole-v1", "--v-value", "2"], ["--v-value", "2"]),
    (["--env-id", "CartPole-v1", "--beta-clone", "-1"], ["--beta-clone", "-1"]),
    (["--env-id", "CartPole-v1", "--num-aux-rollouts", "0"], ["--num-aux-rollouts", "0"]),
    (["--env-id", "CartPole-v1", "--ent-coef", "-0.5"], ["--ent-coef", "-0.5"]),
    (["--env-id", "CartPole-v1", "--async-batch", "2"], ["--async-batch 2", "whole rollout"]),
    (["--env-id", "CartPole-v1", "--policy-lag", "1"], ["--policy-lag"]),
])
def test_bad_input_is_refused_in_one_paragraph_before_anything_starts(tmp_path, flags, needles):
    assert_train_refused("ppg", flags, needles, tmp_path / "run")
