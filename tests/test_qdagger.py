"""QDagger: CleanRL's three phases bit for bit (teacher rollouts, offline distillation, online distillation with its
weight schedule), its IMPALA student, a student that plays like its teacher after the offline phase (eval and export
of it), an exact resume in the offline phase, and the refused teachers. Real envs and real learning; the teachers are
short fleetrl DQN runs made once for the module, in this process."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fleetrl import checkpoint, config
from fleetrl.algos import qdagger
from fleetrl.errors import FleetError
from fleetrl.monitor.tbread import read_scalars

from conftest import TESTS_DIR, assert_train_refused, run_fleetrl_in_process

sys.path.insert(0, str(TESTS_DIR.parent / "benchmarks"))
from versus import qdagger as versus  # noqa: E402  (puts benchmarks/cleanrl on the path too)

import qdagger_dqn_atari_impalacnn as cleanrl_qdagger  # noqa: E402  CleanRL's file (gymnasium 1.x port)

SHORT = dict(torch_threads=1, cuda=False, env_backend="sync", progress=False)


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, str]:
    """Two DQN teachers on CartPole-v1: ``weak`` (700 steps: its student's episodes are short, so 10 end within a
    short online phase and the distillation weight turns to the formula) and ``trained`` (3,000 steps, about 400)."""
    folder = tmp_path_factory.mktemp("teachers")
    return {"weak": versus.train_teacher(folder / "weak", steps=versus.LOCKSTEP_TEACHER_STEPS), "trained": versus.train_teacher(folder / "trained", steps=3000)}


# ------------------------------------------------------------------------------------------ CleanRL's algorithm
def test_three_phases_take_cleanrls_actions_updates_weights_and_losses_bit_for_bit(teachers):
    # CleanRL's file is Atari-only; its update code is network-agnostic, so benchmarks/cleanrl/loops/qdagger.py runs it on
    # dqn.py's MLP: 300 teacher steps, 300 offline updates (target copies at 0, 100, 200), 900 online steps
    verdicts, ours, state = versus.compare_sides(teachers["weak"], seed=3, **versus.LOCKSTEP_FLAGS)
    assert all(v.startswith("identical") for v in verdicts.values()), verdicts
    assert len(ours.actions) == 300 + 900 and ours.target_steps[:3] == [299, 299, 299], "three offline target copies"
    online = ours.distill_coeffs[300:]
    assert ours.distill_coeffs[:300] == [1.0] * 300, "the offline phase distils at weight 1"
    assert online[0] == 1.0 and online[-1] != 1.0, "the weight turns to CleanRL's formula once 10 online episodes ended"
    teacher_mean, last10 = np.mean(state["distillation"]["teacher_returns"]), np.mean(state["distillation"]["online_returns"])
    assert online[-1] == max(1 - last10 / teacher_mean, 0)


def test_impala_student_is_cleanrls_network_its_weights_and_q_values_for_the_same_seed():
    envs = type("Envs", (), {"single_observation_space": type("S", (), {"shape": (4, 84, 84)})(),
                             "single_action_space": type("A", (), {"n": 6})()})()
    cleanrl_qdagger.envs = envs  # CleanRL's QNetwork reads the module's global envs
    torch.manual_seed(5)
    ours = qdagger.make_student((4, 84, 84), 6)
    torch.manual_seed(5)
    theirs = cleanrl_qdagger.QNetwork(envs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8))
    with torch.no_grad():
        assert torch.equal(ours(frames), theirs(frames))
        # acting goes through the same scaling of uint8 frames (it once called the layers without it)
        np.testing.assert_array_equal(ours.q_values_on_host(torch.device("cpu"))(frames.numpy()), ours(frames).numpy())


def test_distillation_loss_is_cleanrls_kl_summed_over_the_batch_and_actions():
    teacher, student = torch.randn(32, 4), torch.randn(32, 4)
    per_sample = torch.nn.functional.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(qdagger.kl_divergence_with_logits(teacher, student), per_sample.sum())
    assert torch.equal(qdagger.kl_divergence_with_logits(teacher, student), cleanrl_qdagger.kl_divergence_with_logits(teacher, student))


# ------------------------------------------------------------------------------------------ learning, eval, export
@pytest.fixture(scope="module")
def student(teachers, tmp_path_factory) -> Path:
    """A student of the trained teacher: 2,000 teacher steps, 2,000 offline updates, 1,000 online steps."""
    run_dir = tmp_path_factory.mktemp("student") / "run"
    qdagger.train(qdagger.Args(env_id="CartPole-v1", teacher_checkpoint=teachers["trained"], teacher_steps=2000, offline_steps=2000,
                               total_timesteps=1000, learning_starts=500, run_dir=str(run_dir), **SHORT))
    return run_dir


def test_student_plays_near_its_teacher_after_the_offline_phase_where_dqn_has_barely_begun(student):
    # the bar: fleetrl eval's greedy return at least half the teacher's evaluated return, and far above what DQN does
    # with the same 3,000 env steps (tests/test_dqn.py: DQN learns from step 10,000; a random policy scores about 22)
    state = checkpoint.load_checkpoint(student)
    teacher_mean = float(np.mean(state["distillation"]["teacher_returns"]))
    assert teacher_mean > 200, state["distillation"]
    proc = run_fleetrl_in_process("eval", str(student), "--episodes", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    result = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert result["mean_return"] >= max(0.5 * teacher_mean, 150), (result, teacher_mean)


def test_student_logs_cleanrls_scalars_for_each_phase(student):
    assert [p.step for p in read_scalars(student, "charts/teacher/avg_episodic_return")] == [0]
    assert [p.step for p in read_scalars(student, "charts/offline/avg_episodic_return")] == [2100], "evaluated at offline step 0"
    for name in ("charts/offline/loss", "charts/offline/td_loss", "charts/offline/distill_loss"):
        assert [p.step for p in read_scalars(student, name)] == list(range(2100, 4001, 100)), name  # after the teacher's 2,000 steps
    for name in ("losses/loss", "losses/td_loss", "losses/distill_loss", "losses/q_values", "charts/distill_coeff", "charts/epsilon"):
        assert read_scalars(student, name) and read_scalars(student, name)[-1].step == 5000, name
    assert read_scalars(student, "charts/episodic_return"), "the student's online episodes, not the teacher's"
    assert min(p.step for p in read_scalars(student, "charts/episodic_return")) > 4000


def test_student_exports_to_onnx_that_acts_as_eval_does(student, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "student.onnx"
    proc = run_fleetrl_in_process("export", str(student), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out))
    state = checkpoint.load_checkpoint(student)
    network = qdagger.make_student((4,), 2)
    network.load_state_dict(state["q_network"])
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    actions = session.run(None, {session.get_inputs()[0].name: obs})[0]
    assert np.array_equal(np.asarray(actions).reshape(-1), network(torch.from_numpy(obs)).argmax(1).numpy())


# ------------------------------------------------------------------------------------------ resume
def test_a_resume_in_the_offline_phase_ends_bit_for_bit_where_the_whole_run_ends(teachers, tmp_path, capsys):
    # the phase and its position come from the checkpoint's iteration; with --save-buffer the teacher's buffer too
    flags = dict(env_id="CartPole-v1", teacher_checkpoint=teachers["weak"], teacher_steps=300, offline_steps=300, total_timesteps=300,
                 learning_starts=100, batch_size=32, buffer_size=2000, save_buffer=True, checkpoint_every=1, keep_checkpoints=20, **SHORT)
    whole = tmp_path / "whole"
    qdagger.train(qdagger.Args(run_dir=str(whole), **flags))
    mid_offline = next(p for p in checkpoint.list_checkpoints(whole) if checkpoint.load_checkpoint(p)["global_step"] == 400)
    resumed = tmp_path / "resumed"
    qdagger.train(qdagger.Args(run_dir=str(resumed), resume=str(mid_offline), **flags))
    assert min(checkpoint.load_checkpoint(p)["global_step"] for p in checkpoint.list_checkpoints(resumed)) == 500, "it resumed at 400"
    a, b = checkpoint.load_checkpoint(whole), checkpoint.load_checkpoint(resumed)
    assert a["global_step"] == b["global_step"] == 900
    assert all(torch.equal(a["q_network"][k], b["q_network"][k]) for k in a["q_network"])
    assert a["distillation"] == b["distillation"]
    # without the saved buffer the teacher's rollouts run again first, and the run ends where it should
    args = qdagger.Args(run_dir=str(tmp_path / "refilled"), resume=str(mid_offline), **{**flags, "save_buffer": False})
    qdagger.train(args, explicit=config.fields_differing_from_default(args) | {"save_buffer"})
    assert "the teacher's rollouts run again for 300 steps" in capsys.readouterr().err
    assert checkpoint.load_checkpoint(tmp_path / "refilled")["global_step"] == 900


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def other_checkpoints(teachers, student, tmp_path_factory) -> dict[str, str]:
    """A DQN checkpoint of another env, and a copy of the trained teacher with one byte of its checkpoint changed."""
    from fleetrl.algos import dqn

    folder = tmp_path_factory.mktemp("others")
    dqn.train(dqn.Args(env_id="Acrobot-v1", total_timesteps=100, learning_starts=50, run_dir=str(folder / "acrobot"), **SHORT))
    corrupt = folder / "corrupt"
    shutil.copytree(teachers["trained"], corrupt)
    path = checkpoint.resolve_checkpoint(corrupt)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return {"acrobot": str(folder / "acrobot"), "corrupt": str(path), "student": str(student)}


@pytest.mark.parametrize("case", ["none", "another_algorithm", "another_env", "does_not_verify"])
def test_a_bad_teacher_is_refused_in_one_paragraph_before_anything_trains(case, other_checkpoints, tmp_path):
    teacher_flag = {"none": [], "another_algorithm": ["--teacher-checkpoint", other_checkpoints["student"]],
                    "another_env": ["--teacher-checkpoint", other_checkpoints["acrobot"]],
                    "does_not_verify": ["--teacher-checkpoint", other_checkpoints["corrupt"]]}[case]
    needles = {"none": ["--teacher-checkpoint", "fleetrl train dqn --env-id CartPole-v1"],
               "another_algorithm": ["written by qdagger, not dqn", "QDagger's teacher"],
               "another_env": ["trained on Acrobot-v1, not CartPole-v1", "QDagger's teacher"],
               "does_not_verify": ["corrupt", "QDagger's teacher"]}[case]
    assert_train_refused("qdagger", ["--env-id", "CartPole-v1", "--no-cuda", "--env-backend", "sync", *teacher_flag], needles, tmp_path / "run")


def test_torchrun_is_refused_with_the_reason(teachers):
    # the distillation weight reads the last 10 returns as each episode ends: ranks would weigh their updates apart
    args = qdagger.Args(env_id="CartPole-v1", teacher_checkpoint=teachers["weak"], **qdagger.FAMILY_DEFAULTS["classic"])
    qdagger.validate(args, world_size=1)
    with pytest.raises(FleetError, match="one process, not under torchrun"):
        qdagger.validate(args, world_size=2)
