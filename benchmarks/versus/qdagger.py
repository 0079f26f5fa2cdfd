"""QDagger against CleanRL's qdagger_dqn_atari_impalacnn.py (issue 48): the lockstep of the three phases on CartPole-v1.

CleanRL's side is its loop run in this repository (benchmarks/cleanrl/loops/qdagger.py: its update code and schedule,
run on dqn.py's MLP since the file is Atari-only; SB3's buffer; gymnasium 1.x same-step autoreset). Both sides get the
same teacher: a short fleetrl DQN run, its weights loaded into CleanRL's QNetwork by order, and the returns fleetrl's
evaluation of it gave (CleanRL's evaluate draws from Python's ``random``).

``--lockstep``: fleetrl's loop recorded at its engine calls (each env step's action, each optimiser step's loss and
distillation weight, each target copy), and CleanRL's given fleetrl's exploration draws, its fused Adam and the
teacher buffer's true next observations: the same actions, updates, weights and losses, bit for bit, through the
teacher's rollouts, the offline phase and the online phase, where the weight turns from 1 to CleanRL's formula once
10 online episodes have ended. CleanRL's script itself needs a Hugging Face teacher (no network here): not run.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from versus.common import Algo, cleanrl_on_path, compare, fleetrl_run, patched, recording

cleanrl_on_path()
from loops.qdagger import QDaggerArgs, QDaggerTrace, plain_qdagger  # noqa: E402

RECORDS = ("actions", "update_steps", "losses", "target_steps", "distill_coeffs")
# short phases, each with target copies, and enough online steps for 10 episodes of a weak student
LOCKSTEP_FLAGS = dict(teacher_steps=300, offline_steps=300, total_timesteps=900, learning_starts=100, target_network_frequency=100,
                      train_frequency=4, batch_size=32, buffer_size=2000)
LOCKSTEP_TEACHER_STEPS = 700  # a weak teacher: its student's episodes are short, so 10 end and the weight turns to the formula


def train_teacher(run_dir: str | Path, steps: int = 3000, env_id: str = "CartPole-v1", seed: int = 1) -> str:
    """A short fleetrl DQN run into ``run_dir``: the teacher (updates every step from step 500, so it learns a little)."""
    from fleetrl.algos import dqn

    dqn.train(dqn.Args(env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=500, train_frequency=1, learning_rate=1e-3,
                       exploration_fraction=0.3, target_network_frequency=100, buffer_size=steps, torch_threads=1, cuda=False,
                       env_backend="sync", progress=False, run_dir=str(run_dir)))
    return str(run_dir)


def fleetrl_trace(teacher: str, seed: int, env_id: str = "CartPole-v1", **flags) -> tuple[QDaggerTrace, dict]:
    """fleetrl's QDagger run from ``teacher``, its actions, updates (loss and distillation weight) and target copies
    recorded; and its last checkpoint."""
    from fleetrl.algos import qdagger

    trace, loss = QDaggerTrace(), qdagger.qdagger_loss

    def recording_loss(q_network, target_network, teacher_network, data, distill_coeff, args):
        trace.distill_coeffs.append(float(distill_coeff))
        return loss(q_network, target_network, teacher_network, data, distill_coeff, args)

    with patched(qdagger, qdagger_loss=recording_loss), recording(qdagger, trace):
        _, state = fleetrl_run(qdagger, env_id=env_id, seed=seed, teacher_checkpoint=teacher, **flags)
    trace.final_params = state["q_network"]
    return trace, state


def cleanrl_trace(teacher_state: dict, teacher_returns: list[float], seed: int, env_id: str = "CartPole-v1", **flags) -> QDaggerTrace:
    """CleanRL's loop with fleetrl's three differences switched on, recorded."""
    trace = QDaggerTrace()
    plain_qdagger(env_id, teacher_state, teacher_returns, seed=seed, args=QDaggerArgs(**flags), numpy_draws=True, fused_adam=True,
                  true_next_obs=True, trace=trace)
    return trace


def compare_sides(teacher: str, seed: int, env_id: str = "CartPole-v1", **flags) -> tuple[dict[str, str], QDaggerTrace, dict]:
    """Both sides from the same teacher: the verdicts, fleetrl's trace and its last checkpoint."""
    from fleetrl import checkpoint

    ours, state = fleetrl_trace(teacher, seed, env_id, **flags)
    teacher_state = checkpoint.load_checkpoint(teacher)["q_network"]
    theirs = cleanrl_trace(teacher_state, state["distillation"]["teacher_returns"], seed, env_id, **flags)
    return compare(ours, theirs, records=RECORDS, by_order=("", "")), ours, state


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    cleanrl_on_path()
    with tempfile.TemporaryDirectory() as folder:
        teacher = train_teacher(Path(folder) / "teacher", steps=LOCKSTEP_TEACHER_STEPS, env_id=opts.env_id)
        flags = {**LOCKSTEP_FLAGS, "total_timesteps": opts.steps, "learning_starts": opts.learning_starts}
        verdicts, ours, _ = compare_sides(teacher, opts.seed, opts.env_id, **flags)
    coeffs = ours.distill_coeffs
    verdicts["distillation weight"] = (f"1.0 for {sum(c == 1.0 for c in coeffs)} updates, then the formula for "
                                       f"{sum(c != 1.0 for c in coeffs)} (last {coeffs[-1]:.3f})" if coeffs else "no update")
    return verdicts


ALGO = Algo("qdagger", "qdagger_dqn_atari_impalacnn.py", "CartPole-v1", {"lockstep": LOCKSTEP_FLAGS["total_timesteps"]},
            learning_starts={"lockstep": LOCKSTEP_FLAGS["learning_starts"]}, lockstep=lockstep, modes=("lockstep",))
