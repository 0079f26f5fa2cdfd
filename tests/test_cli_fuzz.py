"""Fuzzed command lines: random and boundary values (0, negatives, NaN, inf, huge numbers, empty strings,
unknown flags, paths that do not exist) thrown at `fleetrl train` (ppo, ppo_lstm, ppg, ppo_rnd, dqn, pqn, sac, td3, ddpg, sac_discrete), `eval`, `bench-env`,
`benchmark`, `tune`, `plot`, `compare` and `preflight`.

Two properties per command:
* numbers: every other flag valid, a few numeric flags drawn from boundary and random numbers. A value
  outside the flag's documented range (restated below, not imported) is refused before the start, by an
  error that names the flag; a command whose values are all in range starts, or is refused by a check
  across flags (a batch that does not split, ...);
* junk: anything, including text where a number goes, unknown flags, empty strings and bad paths. The
  command starts, or exits non-zero with one clear paragraph ("fleetrl: error: ..." or tyro's usage error),
  never a traceback.
Either way nothing is written outside the run folder: each call runs in a fresh working directory, and the
folder above it is checked too.

The calls run in-process (``fleetrl.cli.main``). A call that starts is stopped early by sentinels patched into the
engine: after its first iteration, or before building more envs, a bigger batch or replay buffer, a learner process,
a tuning trial, a figure or a bootstrap than a test should (a valid configuration, so starting is all there is to
prove). A handful of real subprocess calls (marked slow) check the same end to end.

Example counts: hypothesis's "ci" profile (tests/conftest.py) is the default: a few examples per command,
derandomised, so every run tries the same command lines, and no deadline. The nightly run draws many more, afresh
each time (a failure prints the blob that replays it):

    FLEETRL_HYPOTHESIS=full .venv/bin/python -m pytest tests/test_cli_fuzz.py

``FLEETRL_FUZZ_SHOW=1 pytest -s tests/test_cli_fuzz.py`` prints each command line and how it ended.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleetrl import cli

from conftest import hypothesis_examples, require_module, run_fleetrl, run_fleetrl_here


def fuzz(ci: int, full: int) -> settings:
    """``ci`` examples under the default profile, ``full`` under FLEETRL_HYPOTHESIS=full (the rest: the profile's)."""
    return settings(max_examples=hypothesis_examples(ci, full))


MAX_ENVS = 8  # a started call with more envs than this stops before building them
MAX_BATCH = 2048  # ... or before allocating a larger rollout or sampling a larger replay batch
MAX_MINIBATCHES = 256  # ... or after this many minibatch (or off-policy) updates (a huge --update-epochs)
MAX_BUFFER = 100_000  # ... or before allocating a larger replay buffer
ECHO = [sys.executable, "-c", "print('ok')"]  # a benchmark command that costs no training


class Started(Exception):
    """Raised by a sentinel: the call started (past every check) and was stopped on purpose."""


# ---- running one command line -------------------------------------------------------------------


@dataclass
class Outcome:
    argv: list[str]
    code: object  # 0 when it ran through or started; SystemExit's code otherwise; "traceback" for any other exception
    out: str
    err: str

    @property
    def started(self) -> bool:
        return self.code in (0, None)

    def __str__(self) -> str:
        return f"argv: {self.argv}\nexit: {self.code}\nstderr:\n{self.err}\nstdout (tail):\n{self.out[-2000:]}"


def call(argv: list[str]) -> Outcome:
    """``fleetrl.cli.main(argv)`` in this process; what it printed and how it ended."""
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
        except Started:
            code = 0
        except BaseException:  # noqa: BLE001 - what a user would see as a traceback
            err.write(traceback.format_exc())
            code = "traceback"
        finally:
            torch.set_num_threads(threads)
    return Outcome(argv, code, out.getvalue(), err.getvalue())


def check_clean(outcome: Outcome) -> None:
    """Started, or a non-zero exit with one clear paragraph; never a traceback."""
    assert "Traceback" not in outcome.err and outcome.code != "traceback", outcome
    if outcome.started:
        return
    assert isinstance(outcome.code, int) and outcome.code != 0, outcome
    ours = [line for line in outcome.err.splitlines() if line.startswith("fleetrl: error: ")]
    tyros = "For full helptext" in outcome.err  # tyro's usage error (unknown flag, a value of the wrong type)
    assert ours or tyros, outcome
    if ours:
        assert len(ours) == 1 and len(ours[0]) > len("fleetrl: error: ") + 20, outcome


def check_ranges(outcome: Outcome, bad: list[str], across: tuple[str, ...]) -> None:
    """Out of range: refused, naming every such flag. All in range: started, or refused by a check across
    flags (``across``: what such a refusal says)."""
    if bad:
        assert not outcome.started, f"accepted out-of-range {bad}\n{outcome}"
        assert all(flag in outcome.err for flag in bad), f"the error does not name {bad}\n{outcome}"
    else:
        assert outcome.started or any(needle in outcome.err for needle in across), f"refused values in range\n{outcome}"


@contextlib.contextmanager
def workspace():
    """A fresh working directory inside a fresh folder, so writes next to it are seen too."""
    before = os.getcwd()
    root = Path(tempfile.mkdtemp(prefix="fleetrl-fuzz-"))
    cwd = root / "cwd"
    cwd.mkdir()
    os.chdir(cwd)
    try:
        yield cwd
    finally:
        os.chdir(before)
        shutil.rmtree(root, ignore_errors=True)


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def check_writes(cwd: Path, before: set[str], allowed: set[str], outcome: Outcome) -> None:
    """Nothing new outside ``allowed`` (top-level names in the working directory), nor next to it."""
    new = listing(cwd) - before
    outside = sorted(p for p in new if Path(p).parts[0] not in allowed)
    assert not outside, f"written outside {sorted(allowed)}: {outside[:10]}\n{outcome}"
    assert [p.name for p in cwd.parent.iterdir()] == ["cwd"], f"written next to the working directory\n{outcome}"


def top(path: str) -> str:
    parts = Path(path).parts
    return parts[0] if parts else path


# ---- values and each flag's documented range ------------------------------------------------------

INTS = [1, 0, -1, 2, 3, 7, 2**31 - 1, 2**31, 2**63, 10**30, -(10**30)]
FLOATS = [0.5, 0.0, -0.0, -1.0, 1.0, 1.5, 1e-320, 1e308, 1e300, -1e300, math.nan, math.inf, -math.inf]
NOT_NUMBERS = ["", " ", "abc", "1e", "0x10", "--", "None"]
UNKNOWN_FLAGS = ["--bogus", "--num-env", "--learning_rate-x", "-x"]


def ints() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(INTS), st.integers(-3, 40))


def floats() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(FLOATS), st.floats(-2.0, 2.0))


def fmt(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def parsed(text: str, kind) -> object:
    """The value as tyro reads ``text`` for a flag of ``kind`` (ints or floats), or None if it cannot."""
    try:
        return int(text) if kind is ints else float(text)
    except ValueError:
        return None


def whole(low: int, high: float = math.inf):
    return lambda v: isinstance(v, int) and low <= v <= high


def real(low: float, high: float = math.inf, open_low: bool = False):
    return lambda v: math.isfinite(v) and (v > low if open_low else v >= low) and v <= high


SEED = whole(0, 2**31 - 1)
COEF_MAX = 1e30  # loss coefficients stay far below float32's largest (3.4e38)
POSITIVE, NON_NEGATIVE, FRACTION = real(0, COEF_MAX, open_low=True), real(0, COEF_MAX), real(0, 1)
COMMON_RANGES = {  # every algorithm's
    "--seed": (ints, SEED),
    "--total-timesteps": (ints, whole(1)),
    "--num-envs": (ints, whole(1)),
    "--sticky-actions": (floats, FRACTION),
    "--checkpoint-every": (ints, whole(1)),
    "--stop-at-return": (floats, real(-math.inf)),  # any finite return
    "--stop-window": (ints, whole(1)),
    "--keep-checkpoints": (ints, whole(1)),
    "--torch-threads": (ints, whole(1, 1024)),
    "--dist-timeout": (floats, real(0, 1e9, open_low=True)),
    "--max-env-restarts": (ints, whole(0)),
    "--env-timeout": (floats, real(0, 1e9)),
    "--env-workers": (ints, whole(1, 4096)),
    "--env-threads": (ints, whole(1, 4096)),
}
PPO_RANGES = {  # ppo and ppo_lstm
    **COMMON_RANGES,
    "--learning-rate": (floats, POSITIVE),
    "--num-steps": (ints, whole(1)),
    "--gamma": (floats, FRACTION),
    "--gae-lambda": (floats, FRACTION),
    "--num-minibatches": (ints, whole(1)),
    "--update-epochs": (ints, whole(1)),
    "--clip-coef": (floats, POSITIVE),
    "--ent-coef": (floats, NON_NEGATIVE),
    "--vf-coef": (floats, NON_NEGATIVE),
    "--max-grad-norm": (floats, POSITIVE),
    "--target-kl": (floats, POSITIVE),
    "--async-batch": (ints, whole(1)),
    "--policy-lag": (ints, whole(0, 1)),
    "--frame-stack": (ints, whole(1, 16)),
}
OFFPOLICY_RANGES = {
    **COMMON_RANGES,
    "--buffer-size": (ints, whole(1)),
    "--gamma": (floats, FRACTION),
    "--tau": (floats, FRACTION),
    "--batch-size": (ints, whole(1)),
    "--learning-starts": (ints, whole(0)),
}
DQN_RANGES = {
    **OFFPOLICY_RANGES,
    "--learning-rate": (floats, POSITIVE),
    "--target-network-frequency": (ints, whole(1)),
    "--start-e": (floats, FRACTION),
    "--end-e": (floats, FRACTION),
    "--exploration-fraction": (floats, real(0, 1, open_low=True)),
    "--train-frequency": (ints, whole(1)),
    "--policy-lag": (ints, whole(0, 1)),
}
SAC_RANGES = {
    **OFFPOLICY_RANGES,
    "--policy-lr": (floats, POSITIVE),
    "--q-lr": (floats, POSITIVE),
    "--policy-frequency": (ints, whole(1)),
    "--target-network-frequency": (ints, whole(1)),
    "--alpha": (floats, NON_NEGATIVE),
}
PPG_RANGES = {
    **{flag: check for flag, check in PPO_RANGES.items() if flag != "--update-epochs"},
    "--n-iteration": (ints, whole(1)),
    "--e-policy": (ints, whole(1)),
    "--v-value": (ints, whole(1, 1)),
    "--e-auxiliary": (ints, whole(0)),
    "--beta-clone": (floats, NON_NEGATIVE),
    "--num-aux-rollouts": (ints, whole(1)),
    "--n-aux-grad-accum": (ints, whole(1)),
}
PPO_RND_RANGES = {
    **PPO_RANGES,
    "--update-proportion": (floats, FRACTION),
    "--int-coef": (floats, NON_NEGATIVE),
    "--ext-coef": (floats, NON_NEGATIVE),
    "--int-gamma": (floats, FRACTION),
    "--num-iterations-obs-norm-init": (ints, whole(0)),
}
SAC_DISCRETE_RANGES = {
    **OFFPOLICY_RANGES,
    "--policy-lr": (floats, POSITIVE),
    "--q-lr": (floats, POSITIVE),
    "--update-frequency": (ints, whole(1)),
    "--target-network-frequency": (ints, whole(1)),
    "--alpha": (floats, NON_NEGATIVE),
    "--target-entropy-scale": (floats, NON_NEGATIVE),
}
DDPG_RANGES = {
    **OFFPOLICY_RANGES,
    "--learning-rate": (floats, POSITIVE),
    "--exploration-noise": (floats, NON_NEGATIVE),
    "--policy-frequency": (ints, whole(1)),
}
TD3_RANGES = {
    **DDPG_RANGES,
    "--policy-noise": (floats, NON_NEGATIVE),
    "--noise-clip": (floats, NON_NEGATIVE),
}
PQN_RANGES = {
    **COMMON_RANGES,
    "--learning-rate": (floats, POSITIVE),
    "--num-steps": (ints, whole(1)),
    "--num-minibatches": (ints, whole(1)),
    "--update-epochs": (ints, whole(1)),
    "--gamma": (floats, FRACTION),
    "--start-e": (floats, FRACTION),
    "--end-e": (floats, FRACTION),
    "--exploration-fraction": (floats, real(0, 1, open_low=True)),
    "--max-grad-norm": (floats, POSITIVE),
    "--q-lambda": (floats, FRACTION),
    "--async-batch": (ints, whole(1)),
    "--policy-lag": (ints, whole(0, 1)),
    "--frame-stack": (ints, whole(1, 16)),
}
EVAL_RANGES = {"--episodes": (ints, whole(1)), "--seed": (ints, SEED)}
BENCH_ENV_RANGES = {"--seconds": (floats, real(0, open_low=True)), "--repeats": (ints, whole(1)), "--async-batch": (ints, whole(1))}
BENCHMARK_RANGES = {"--num-seeds": (ints, whole(1, 10_000)), "--start-seed": (ints, SEED), "--workers": (ints, whole(1)),
                    "--slurm-cpus-per-task": (ints, whole(1))}


@st.composite
def numeric_flags(draw, ranges: dict, junk: bool = False, max_flags: int = 3) -> tuple[list[str], list[str]]:
    """(flags and values, the flags given a number outside their range). ``junk``: a value is sometimes a
    number of the other type (1.5 for a count), or not a number at all."""
    argv, bad = [], []
    for flag in draw(st.lists(st.sampled_from(sorted(ranges)), min_size=0 if junk else 1, max_size=max_flags, unique=True)):
        kind, accepts = ranges[flag]
        other = floats() if kind is ints else ints()
        text = fmt(draw(st.one_of(*[kind()] * 6, st.sampled_from(NOT_NUMBERS), other) if junk else kind()))
        argv += [flag, text]
        if (value := parsed(text, kind)) is not None and not accepts(value):
            bad.append(flag)
    return argv, bad


# ---- train ----------------------------------------------------------------------------------------

# what a refusal by a check across flags says (the flags' values each in range)
# --env-workers / --env-threads need worker processes, and a worker needs an env
ENGINE_ACROSS = ("and --env-backend sync has none", "must be between 1 and the envs of this process")
TRAIN_ACROSS = ("does not split", "do not split", "leaves 1 sample per minibatch", "--async-batch", "less than one batch",
                "The loss became non-finite", *ENGINE_ACROSS)
OFFPOLICY_ACROSS = ("is smaller than --batch-size", "cannot hold one step of", "is not below --total-timesteps", "less than one iteration", "do not split",
                    "does not split", "The loss became non-finite", *ENGINE_ACROSS)


@pytest.fixture
def engine_sentinels(monkeypatch):
    """Stop a started training run after its first iteration, or before it builds more than a test should."""
    import fleetrl.algos.dqn as dqn
    import fleetrl.algos.ppo as ppo
    import fleetrl.algos.pqn as pqn
    import fleetrl.algos.sac as sac
    import fleetrl.algos.sac_discrete as sac_discrete
    import fleetrl.algos.ddpg as ddpg  # trains in td3.train
    import fleetrl.algos.td3 as td3
    import fleetrl.monitor.trainlog as trainlog
    import fleetrl.offpolicy as offpolicy
    import fleetrl.onpolicy as onpolicy
    import fleetrl.run as run

    real_make, real_sampler, real_loss, real_replay = run.make_vector_env, onpolicy.Sampler, ppo.ppo_loss, offpolicy.make_replay
    real_learner, real_step = run.Learner, offpolicy.optimizer_step
    calls = {"loss": 0}

    def make_vector_env(env_id, num_envs, *args, **kwargs):
        calls["loss"] = 0  # a new run
        if num_envs > MAX_ENVS:
            raise Started(f"{num_envs} envs")
        return real_make(env_id, num_envs, *args, **kwargs)

    def sampler(envs, agent, num_steps, *args, **kwargs):
        if envs.num_envs * num_steps > MAX_BATCH:
            raise Started(f"a batch of {envs.num_envs * num_steps}")
        return real_sampler(envs, agent, num_steps, *args, **kwargs)

    def counted(real):
        def update(*args, **kwargs):
            calls["loss"] += 1
            if calls["loss"] > MAX_MINIBATCHES:
                raise Started("many minibatch updates")
            return real(*args, **kwargs)
        return update

    def make_replay(run_, envs):
        if run_.args.buffer_size > MAX_BUFFER or run_.args.batch_size > MAX_BATCH:
            raise Started(f"a replay buffer of {run_.args.buffer_size} sampled {run_.args.batch_size} at a time")
        return real_replay(run_, envs)

    def learner(updates, acting, owned, lag, *args, **kwargs):
        if lag:
            raise Started("a learner process")  # --policy-lag 1: a forked process of its own
        return real_learner(updates, acting, owned, lag, *args, **kwargs)

    class Progress(trainlog.Progress):
        def update(self, step, *args, **kwargs):
            if step < self.total:
                raise Started("after the first iteration")
            super().update(step, *args, **kwargs)

    monkeypatch.setattr(run, "make_vector_env", make_vector_env)  # the session builds the envs
    monkeypatch.setattr(run, "Learner", learner)
    monkeypatch.setattr(onpolicy, "Sampler", sampler)  # ppo, ppo_lstm, ppg and ppo_rnd build theirs there
    monkeypatch.setattr(ppo, "ppo_loss", counted(real_loss))
    monkeypatch.setattr(pqn, "Sampler", sampler)  # pqn builds its own sampler
    monkeypatch.setattr(pqn, "td_loss", counted(pqn.td_loss))
    for module in (offpolicy, sac, td3, sac_discrete):
        monkeypatch.setattr(module, "make_replay", make_replay)  # dqn calls offpolicy.make_replay
    for module in (dqn, sac, td3, sac_discrete):
        monkeypatch.setattr(module, "optimizer_step", counted(real_step))
    monkeypatch.setattr(trainlog, "Progress", Progress)


@st.composite
def train_sizes(draw) -> list[str]:
    """A small valid batch, and --total-timesteps of one batch: a run that starts is one iteration."""
    num_envs, num_steps = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([2, 8, 16]))
    return ["--num-envs", str(num_envs), "--num-steps", str(num_steps), "--num-minibatches", "1", "--update-epochs",
            draw(st.sampled_from(["1", "2"])), "--total-timesteps", str(num_envs * num_steps)]


@st.composite
def offpolicy_sizes(draw) -> list[str]:
    """One iteration (100 steps of each env), learning from its second half, from a small buffer."""
    num_envs = draw(st.sampled_from([1, 2]))
    return ["--num-envs", str(num_envs), "--total-timesteps", str(100 * num_envs), "--learning-starts", str(50 * num_envs),
            "--buffer-size", "1000", "--batch-size", draw(st.sampled_from(["8", "32"]))]


@st.composite
def ppg_sizes(draw) -> list[str]:
    """PPO's one-iteration run, its epochs PPG's --e-policy, its one iteration a phase (the auxiliary phase runs)."""
    sizes = draw(train_sizes())
    epochs = sizes.index("--update-epochs")
    return sizes[:epochs] + ["--e-policy", sizes[epochs + 1], "--n-iteration", "1", "--num-aux-rollouts", "1"] + sizes[epochs + 2:]


@st.composite
def ppo_rnd_sizes(draw) -> list[str]:
    """PPO's one-iteration run, after a random-action start of the observation statistics of 0 to 2 rollouts."""
    return draw(train_sizes()) + ["--num-iterations-obs-norm-init", draw(st.sampled_from(["0", "1", "2"]))]


# algorithm: (its env here, the sizes of a one-iteration run, its flags' ranges, what a check across flags says)
ALGOS = {
    "ppo": ("CartPole-v1", train_sizes, PPO_RANGES, TRAIN_ACROSS),
    "ppo_lstm": ("CartPole-v1", train_sizes, PPO_RANGES, TRAIN_ACROSS + ("sequence", "split evenly")),
    "ppg": ("CartPole-v1", ppg_sizes, PPG_RANGES, TRAIN_ACROSS),
    "ppo_rnd": ("CartPole-v1", ppo_rnd_sizes, PPO_RND_RANGES, TRAIN_ACROSS),
    "dqn": ("CartPole-v1", offpolicy_sizes, DQN_RANGES, OFFPOLICY_ACROSS),
    "pqn": ("CartPole-v1", train_sizes, PQN_RANGES, TRAIN_ACROSS),
    "sac": ("Pendulum-v1", offpolicy_sizes, SAC_RANGES, OFFPOLICY_ACROSS),
    "td3": ("Pendulum-v1", offpolicy_sizes, TD3_RANGES, OFFPOLICY_ACROSS),
    "ddpg": ("Pendulum-v1", offpolicy_sizes, DDPG_RANGES, OFFPOLICY_ACROSS),
    "sac_discrete": ("CartPole-v1", offpolicy_sizes, SAC_DISCRETE_RANGES, OFFPOLICY_ACROSS),
}


def check_train_numbers(algo: str, sizes: list[str], numbers: tuple[list[str], list[str]]) -> None:
    env_id, _, _, across = ALGOS[algo]
    flags, bad = numbers
    with workspace() as cwd:
        outcome = call(["train", algo, "--env-id", env_id, "--env-backend", "sync", "--no-progress", "--run-dir", "run", *sizes, *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, across)
        check_writes(cwd, set(), {"run"}, outcome)
        if bad:
            assert not (cwd / "run").exists(), "a refused run created its folder"


@fuzz(ci=25, full=300)
@given(sizes=train_sizes(), numbers=numeric_flags(PPO_RANGES))
# the engine's flags, each drawn at least once whatever the profile draws
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--stop-at-return", "nan", "--stop-window", "0"], ["--stop-at-return", "--stop-window"]))
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--stop-at-return", "-5.0", "--stop-window", "3"], []))
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--env-workers", "0", "--env-threads", "5000"], ["--env-workers", "--env-threads"]))
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--env-workers", "1", "--env-threads", "2"], []))
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--frame-stack", "17"], ["--frame-stack"]))
@example(sizes=["--num-envs", "2", "--num-steps", "8", "--total-timesteps", "16"], numbers=(["--frame-stack", "2"], []))
def test_train_refuses_every_number_out_of_its_range_and_starts_with_the_others(sizes, numbers, engine_sentinels):
    check_train_numbers("ppo", sizes, numbers)


@pytest.mark.parametrize("algo", ["ppo_lstm", "dqn", "pqn", "sac", "td3", "ddpg", "sac_discrete", "ppg", "ppo_rnd"])
def test_each_algorithm_refuses_every_number_out_of_its_range_and_starts_with_the_others(algo, engine_sentinels):
    _, sizes, ranges, _ = ALGOS[algo]

    @fuzz(ci=10, full=150)
    @given(sizes=sizes(), numbers=numeric_flags(ranges))
    def check(sizes, numbers):
        check_train_numbers(algo, sizes, numbers)

    check()


@st.composite
def train_junk(draw) -> tuple[list[str], str | None]:
    algo = draw(st.sampled_from(["ppo"] * 4 + ["ppo_lstm", "dqn", "pqn", "sac", "td3", "ddpg", "sac_discrete", "ppg", "ppo_rnd"]))
    env_id, sizes, ranges, _ = ALGOS[algo]
    run_dir = draw(st.sampled_from(["run", "run", "nested/deeper/run", "", ".", None]))
    argv = ["train", algo, *(["--run-dir", run_dir] if run_dir is not None else [])]
    argv += ["--env-backend", draw(st.sampled_from(["sync"] * 6 + ["auto", "async", "", "nope"]))]
    argv += ["--env-id", draw(st.sampled_from([env_id] * 6 + ["Pendulum-v1", "CartPole-v1", "", "NoSuchEnv-v0", "no_such_module:Env-v0"]))]
    argv += draw(sizes()) + draw(numeric_flags(ranges, junk=True))[0]
    options = {"--resume": ["auto", "missing.pt", "", "run"], "--precision": ["fp32", "bf16", "", "fp16"],
               "--memory-format": ["contiguous", "channels-last", "", "nhwc"],
               "--actor-device": ["cpu", "learner", "gpu", ""], "--exp-name": ["", "a/b", "x"]}
    for extra in draw(st.lists(st.sampled_from(["--no-progress", "--no-cuda", "--no-norm-adv", *options, *UNKNOWN_FLAGS]),
                               max_size=3, unique=True)):
        argv += [extra, draw(st.sampled_from(options[extra]))] if extra in options else [extra]
    return argv, run_dir


@fuzz(ci=25, full=300)
@given(case=train_junk())
def test_fuzzed_train_command_lines_start_or_fail_cleanly(case, engine_sentinels):
    argv, run_dir = case
    with workspace() as cwd:
        outcome = call(argv)
        check_clean(outcome)
        if run_dir == ".":  # the working directory is the run folder: only next to it is outside
            allowed = {p.name for p in cwd.iterdir()}
        else:
            allowed = {"runs"} if run_dir is None else {top(run_dir)} if run_dir else set()
        check_writes(cwd, set(), allowed, outcome)


# ---- eval -----------------------------------------------------------------------------------------

TARGETS = ["run", "run-file", "loose-file", "missing", "", "text", "empty", "folder", "garbage-in-run", "tensor", "no-env-id",
           "wrong-network", "cwd"]
CHECKPOINTS = ("run", "run-file", "loose-file")  # the targets that are a checkpoint; the others are refused


@pytest.fixture
def trained_run(tiny_cartpole_run):
    """A real run folder with its checkpoints (the session's tiny CartPole run: make_target copies it)."""
    return tiny_cartpole_run.run_dir


def make_target(kind: str, trained_run: Path, cwd: Path) -> str:
    """The checkpoint argument of one kind, laid out in the working directory."""
    if kind in ("run", "run-file", "garbage-in-run"):
        shutil.copytree(trained_run, cwd / "run")
        newest = sorted((cwd / "run" / "checkpoints").glob("ckpt_*.pt"))[-1]
        if kind == "garbage-in-run":
            newest.write_bytes(b"PK\x03\x04 not a zip archive")
        return str(newest.relative_to(cwd)) if kind == "run-file" else "run"
    if kind == "loose-file":
        shutil.copy(sorted((trained_run / "checkpoints").glob("ckpt_*.pt"))[-1], cwd / "model.pt")
        return "model.pt"
    if kind == "text":
        (cwd / "notes.txt").write_text("not a checkpoint\n")
        return "notes.txt"
    if kind == "empty":
        (cwd / "empty.pt").write_bytes(b"")
        return "empty.pt"
    if kind == "folder":
        (cwd / "folder" / "checkpoints").mkdir(parents=True)
        return "folder"
    if kind in ("tensor", "no-env-id", "wrong-network"):
        state = {"tensor": torch.zeros(3), "no-env-id": {"model": {}, "args": {"seed": 1}, "global_step": 1},
                 "wrong-network": {"model": {"w": torch.zeros(2)}, "args": {"env_id": "CartPole-v1"}, "global_step": 1}}[kind]
        torch.save(state, cwd / f"{kind}.pt")
        return f"{kind}.pt"
    return {"missing": "missing.pt", "": "", "cwd": "."}[kind]


@pytest.fixture
def first_episodes(monkeypatch):
    """Stop a started evaluation after its third episode (a huge --episodes would run on)."""
    import fleetrl.evaluate as evaluate

    real_stats, seen = evaluate.episode_stats, {"episodes": 0}

    def make_vector_env(*args, **kwargs):
        seen["episodes"] = 0  # a new evaluation
        return real_make(*args, **kwargs)

    def episode_stats(info):
        found = real_stats(info)
        seen["episodes"] += len(found)
        if seen["episodes"] >= 3:
            raise Started("after three episodes")
        return found

    real_make = evaluate.make_vector_env
    monkeypatch.setattr(evaluate, "make_vector_env", make_vector_env)
    monkeypatch.setattr(evaluate, "episode_stats", episode_stats)


@fuzz(ci=8, full=60)
@given(kind=st.sampled_from(CHECKPOINTS), numbers=numeric_flags(EVAL_RANGES))
def test_eval_refuses_every_number_out_of_its_range(kind, numbers, trained_run, first_episodes):
    flags, bad = numbers
    with workspace() as cwd:
        target = make_target(kind, trained_run, cwd)
        before = listing(cwd)
        outcome = call(["eval", target, *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, ())
        check_writes(cwd, before, set(), outcome)


@st.composite
def eval_junk(draw) -> tuple[str, list[str]]:
    kind = draw(st.sampled_from(TARGETS))
    flags = ["--env-backend", draw(st.sampled_from(["sync"] * 4 + ["", "nope", "ale"]))]
    flags += draw(numeric_flags(EVAL_RANGES, junk=True))[0]
    flags += draw(st.lists(st.sampled_from(["--stochastic", "--json", "--capture-video", *UNKNOWN_FLAGS]), max_size=2, unique=True))
    return kind, flags


@fuzz(ci=12, full=100)
@given(case=eval_junk())
def test_fuzzed_eval_command_lines_start_or_fail_cleanly(case, trained_run, first_episodes):
    kind, flags = case
    with workspace() as cwd:
        target = make_target(kind, trained_run, cwd)
        before = listing(cwd)
        outcome = call(["eval", target, *flags])
        check_clean(outcome)
        if kind not in CHECKPOINTS:
            assert not outcome.started, f"evaluated {kind!r}, which is no checkpoint\n{outcome}"
        check_writes(cwd, before, {"run"} if kind.startswith("run") else set(), outcome)  # videos go to the run folder


# ---- bench-env ------------------------------------------------------------------------------------


@pytest.fixture
def short_measurements(monkeypatch):
    """Each measurement steps briefly, and the call stops after two (a huge --repeats or --seconds would run on)."""
    import fleetrl.tools.bench_env as bench_env

    real, done = bench_env.measure, {"count": 0}

    def check_args(args):
        done["count"] = 0  # a new call
        return real_check(args)

    def measure(env_id, backend, num_envs, seconds, async_batch=None, stepping=None):
        if num_envs > MAX_ENVS or done["count"] >= 2:
            raise Started("measuring")
        done["count"] += 1
        return real(env_id, backend, num_envs, min(seconds, 0.01), async_batch, stepping)

    real_check = bench_env.check_args
    monkeypatch.setattr(bench_env, "check_args", check_args)
    monkeypatch.setattr(bench_env, "measure", measure)


@fuzz(ci=10, full=80)
@given(numbers=numeric_flags(BENCH_ENV_RANGES))
def test_bench_env_refuses_every_number_out_of_its_range(numbers, short_measurements):
    flags, bad = numbers
    with workspace() as cwd:
        outcome = call(["bench-env", "--backends", "sync", "--num-envs", "2", *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, ("must divide",))
        check_writes(cwd, set(), set(), outcome)


@st.composite
def bench_env_junk(draw) -> list[str]:
    argv = ["bench-env", "--backends", draw(st.sampled_from(["sync"] * 4 + ["", ",", "sync,nope", "auto", "gym-sync", "ale"])),
            "--num-envs", draw(st.sampled_from(["1", "2", "1,2", "", "0", "-1", "2,x", "1e3", "4,,2", str(10**30), "9" * 5000])),
            "--env-id", draw(st.sampled_from(["CartPole-v1"] * 4 + ["", "NoSuchEnv-v0", "Pendulum-v1"]))]
    argv += draw(numeric_flags(BENCH_ENV_RANGES, junk=True))[0]
    return argv + draw(st.lists(st.sampled_from(["--json", *UNKNOWN_FLAGS]), max_size=1))


@fuzz(ci=10, full=100)
@given(argv=bench_env_junk())
def test_fuzzed_bench_env_command_lines_start_or_fail_cleanly(argv, short_measurements):
    with workspace() as cwd:
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, set(), set(), outcome)


# ---- benchmark ------------------------------------------------------------------------------------


@pytest.fixture
def small_grids(monkeypatch):
    """A grid of more than four runs stops before it starts them; smaller ones run (the command is cheap)."""
    import fleetrl.tools.benchmark as benchmark

    real = benchmark.run_grid

    def run_grid(runs, *args, **kwargs):
        if len(runs) > 4:
            raise Started(f"{len(runs)} runs")
        return real(runs, *args, **kwargs)

    monkeypatch.setattr(benchmark, "run_grid", run_grid)


@fuzz(ci=8, full=60)
@given(numbers=numeric_flags(BENCHMARK_RANGES))
def test_benchmark_refuses_every_number_out_of_its_range(numbers, small_grids):
    flags, bad = numbers
    with workspace() as cwd:
        outcome = call(["benchmark", "--env-ids", "CartPole-v1", "--out", "bench", *flags, "--", *ECHO])
        check_clean(outcome)
        check_ranges(outcome, bad, ("runs seeds past",))
        check_writes(cwd, set(), {"bench"}, outcome)


@st.composite
def benchmark_junk(draw) -> tuple[list[str], str | None]:
    env_ids = draw(st.lists(st.sampled_from(["CartPole-v1", "Acrobot-v1", "", "ALE/Pong-v5", "a:b"]), max_size=2))
    argv = ["benchmark", "--env-ids", *env_ids, *draw(numeric_flags(BENCHMARK_RANGES, junk=True))[0]]
    out = draw(st.sampled_from(["bench", "bench", "deep/new/bench", "", "afile", None]))
    if out is not None:
        argv += ["--out", out]
    argv += draw(st.lists(st.sampled_from(["--slurm-template", *UNKNOWN_FLAGS]), max_size=1))
    command = draw(st.sampled_from([ECHO, ECHO, [], [*ECHO, "--seed", "3"], ["no-such-program-xyz"]]))
    if command or draw(st.booleans()):
        argv += ["--", *command]
    return argv, out


@fuzz(ci=10, full=80)
@given(case=benchmark_junk())
def test_fuzzed_benchmark_command_lines_start_or_fail_cleanly(case, small_grids):
    argv, out = case
    with workspace() as cwd:
        (cwd / "afile").write_text("a file where --out wants a folder\n")
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, {"afile"}, {top(out)} if out else {"runs"}, outcome)


# ---- tune ---------------------------------------------------------------------------------------

TUNE_RANGES = {
    "--trials": (ints, whole(0, 1_000_000)),
    "--parallel": (ints, whole(1)),
    "--num-seeds": (ints, whole(1, 1000)),
    "--start-seed": (ints, SEED),
    "--sampler-seed": (ints, whole(0, 2**32 - 1)),
    "--random-trials": (ints, whole(0)),
    "--prune-after-trials": (ints, whole(0)),
    "--prune-warmup": (floats, FRACTION),
    "--last-episodes": (ints, whole(1)),
    "--report-every": (ints, whole(1)),
    "--trial-timeout": (floats, real(0, 1e9, open_low=True)),
    "--stale-after": (floats, real(3, 1e9)),
    "--slurm-workers": (ints, whole(1, 10_000)),
    "--slurm-cpus-per-task": (ints, whole(1)),
}
SPACE = "learning-rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\nupdate-epochs: {type: int, low: 1, high: 4}\n"
SPACES = {"space.yaml": SPACE, "empty.yaml": "", "bad.yaml": "learning-rate: {type: float, low: [\n",
          "unknown.yaml": "no-such-flag: {type: int, low: 1, high: 2}\n", "inverted.yaml": "update-epochs: {type: int, low: 5, high: 1}\n"}
TUNED = ["fleetrl", "train", "ppo", "--total-timesteps", "1000"]


@pytest.fixture
def no_trials(monkeypatch):
    """A tuner that got past every check (its study open) stops before it starts a trial."""
    require_module("optuna", "tune")
    import fleetrl.tools.tune.cli as tune_cli

    def tuner(*args, **kwargs):
        raise Started("the tuner")

    monkeypatch.setattr(tune_cli, "Tuner", tuner)


def tune_workspace(cwd: Path) -> set[str]:
    for name, text in SPACES.items():
        (cwd / name).write_text(text)
    return listing(cwd)


@fuzz(ci=10, full=80)
@given(numbers=numeric_flags(TUNE_RANGES))
def test_tune_refuses_every_number_out_of_its_range(numbers, no_trials):
    flags, bad = numbers
    with workspace() as cwd:
        before = tune_workspace(cwd)
        outcome = call(["tune", "--env-ids", "CartPole-v1", "--search", "space.yaml", "--out", "out", *flags, "--", *TUNED])
        check_clean(outcome)
        check_ranges(outcome, bad, ("--report-every",))  # past --total-timesteps
        check_writes(cwd, before, {"out"}, outcome)


@st.composite
def tune_junk(draw) -> tuple[list[str], set[str]]:
    env_ids = draw(st.lists(st.sampled_from(["CartPole-v1", "Acrobot-v1", "", "CartPole/v1", "CartPole:v1"]), max_size=2))
    argv = ["tune", "--env-ids", *env_ids, "--search", draw(st.sampled_from([*SPACES, "space.yaml", "missing.yaml", ""]))]
    argv += draw(numeric_flags(TUNE_RANGES, junk=True))[0]
    out = draw(st.sampled_from(["out", "out", "deep/out", "", "space.yaml", None]))
    argv += ["--out", out] if out is not None else []
    storage = draw(st.sampled_from([None, None, "", "sqlite:///study.db", "journal:///journal.log", "journal.log", "bogus://x"]))
    argv += ["--storage", storage] if storage is not None else []
    options = {"--sampler": ["tpe", "random", "cmaes", "", "grid"], "--pruner": ["median", "hyperband", "none", "x"],
               "--aggregate": ["mean", "median", ""], "--target-scores": ["CartPole-v1=0,500", "CartPole-v1=5,5", "x", ""],
               "--study-name": ["s", "", "a/b"]}
    for extra in draw(st.lists(st.sampled_from([*options, "--slurm-template", *UNKNOWN_FLAGS]), max_size=2, unique=True)):
        argv += [extra, draw(st.sampled_from(options[extra]))] if extra in options else [extra]
    command = draw(st.sampled_from([TUNED, TUNED, ["fleetrl", "train", "dqn", "--total-timesteps", "1000"], [], ["fleetrl", "train"],
                                    ["fleetrl", "train", "nope"], ["no-such-program-xyz"], ["fleetrl", "eval", "run"]]))
    if command or draw(st.booleans()):
        argv += ["--", *command]
    allowed = {top(out) if out else "runs", "study.db", "journal.log"}  # the storage's file, where it names one here
    return argv, allowed


@fuzz(ci=12, full=100)
@given(case=tune_junk())
def test_fuzzed_tune_command_lines_start_or_fail_cleanly(case, no_trials):
    argv, allowed = case
    with workspace() as cwd:
        before = tune_workspace(cwd)
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, before, allowed, outcome)


# ---- plot and compare ----------------------------------------------------------------------------

PLOT_RANGES = {"--smooth": (ints, whole(1, 10**9))}
COMPARE_RANGES = {"--bootstrap-reps": (ints, whole(100, 1_000_000)), "--bootstrap-seed": (ints, SEED)}


@pytest.fixture
def no_drawing(monkeypatch):
    """A plot or a comparison that got past every check stops before it draws or bootstraps (matplotlib and the
    bootstrap cost seconds, and a huge --bootstrap-reps would run on)."""
    import fleetrl.tools.plot as plot
    import fleetrl.tools.stats as stats

    def stop(*args, **kwargs):
        raise Started("drawing or bootstrapping")

    monkeypatch.setattr(plot, "draw", stop)
    monkeypatch.setattr(stats, "interval_rows", stop)


def lay_out_runs(trained_run: Path, cwd: Path) -> set[str]:
    """Two benchmark-style configurations of one CartPole run each (a/CartPole-v1__1, b/CartPole-v1__1), an empty
    folder and a file."""
    for config_dir in ("a", "b"):
        shutil.copytree(trained_run, cwd / config_dir / "CartPole-v1__1")
    (cwd / "empty").mkdir()
    (cwd / "notes.txt").write_text("not a run\n")
    return listing(cwd)


@fuzz(ci=6, full=40)
@given(numbers=numeric_flags(PLOT_RANGES))
@example(numbers=(["--smooth", str(2**63)], ["--smooth"]))  # was an OverflowError traceback (found by the full profile)
def test_plot_refuses_every_number_out_of_its_range(numbers, trained_run, no_drawing):
    flags, bad = numbers
    with workspace() as cwd:
        before = lay_out_runs(trained_run, cwd)
        outcome = call(["plot", "a", "b", "-o", "curves.png", *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, ())
        check_writes(cwd, before, {"curves.png"}, outcome)


PATHS = ["a", "b", "a/CartPole-v1__1", "empty", "notes.txt", "missing", "", "."]


@st.composite
def plot_junk(draw) -> tuple[list[str], str]:
    argv = ["plot", *draw(st.lists(st.sampled_from(PATHS), max_size=3))]
    output = draw(st.sampled_from(["curves.png", "curves.png", "figs/c.svg", "c.jpg", "", "a", "c.PNG"]))
    argv += ["-o", output, *draw(numeric_flags(PLOT_RANGES, junk=True))[0]]
    argv += ["--metric", draw(st.sampled_from(["charts/episodic_return", "charts/SPS", "", "no/such"]))]
    argv += draw(st.sampled_from([[], ["--x", "time"], ["--x", "nope"], ["--svg"], ["--title", ""], UNKNOWN_FLAGS[:1]]))
    return argv, output


@fuzz(ci=10, full=80)
@given(case=plot_junk())
def test_fuzzed_plot_command_lines_start_or_fail_cleanly(case, trained_run, no_drawing):
    argv, output = case
    with workspace() as cwd:
        before = lay_out_runs(trained_run, cwd)
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, before, {top(output)} if output else set(), outcome)


@fuzz(ci=6, full=40)
@given(numbers=numeric_flags(COMPARE_RANGES))
def test_compare_refuses_every_number_out_of_its_range(numbers, trained_run, no_drawing):
    require_module("rliable", "stats")
    flags, bad = numbers
    with workspace() as cwd:
        before = lay_out_runs(trained_run, cwd)
        outcome = call(["compare", "a", "b", "--out", "cmp", *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, ())
        check_writes(cwd, before, {"cmp"}, outcome)


@st.composite
def compare_junk(draw) -> tuple[list[str], str]:
    argv = ["compare", *draw(st.lists(st.sampled_from(PATHS), max_size=3))]
    out = draw(st.sampled_from(["cmp", "cmp", "deep/cmp", "", "notes.txt"]))
    argv += ["--out", out, *draw(numeric_flags(COMPARE_RANGES, junk=True))[0]]
    options = {"--labels": ["x", "", "x x"], "--normalize": ["auto", "human", "minmax", "none", "nope"],
               "--score-bounds": ["CartPole-v1=0,500", "CartPole-v1=5,5", "x", ""]}
    for extra in draw(st.lists(st.sampled_from([*options, *UNKNOWN_FLAGS]), max_size=2, unique=True)):
        argv += [extra, draw(st.sampled_from(options[extra]))] if extra in options else [extra]
    return argv, out


@fuzz(ci=10, full=80)
@given(case=compare_junk())
def test_fuzzed_compare_command_lines_start_or_fail_cleanly(case, trained_run, no_drawing):
    require_module("rliable", "stats")
    argv, out = case
    with workspace() as cwd:
        before = lay_out_runs(trained_run, cwd)
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, before, {top(out)} if out else set(), outcome)


# ---- preflight ------------------------------------------------------------------------------------

PREFLIGHT_RANGES = {"--seconds": (floats, real(0, open_low=True))}


@pytest.fixture
def brief_measurements(monkeypatch):
    """Preflight's throughput check steps each backend for at most 10 ms (a huge --seconds would run on)."""
    import fleetrl.tools.bench_env as bench_env

    real = bench_env.measure

    def measure(env_id, backend, num_envs, seconds, *args, **kwargs):
        return real(env_id, backend, num_envs, min(seconds, 0.01), *args, **kwargs)

    monkeypatch.setattr(bench_env, "measure", measure)


@fuzz(ci=5, full=40)
@given(numbers=numeric_flags(PREFLIGHT_RANGES), env_id=st.sampled_from(["CartPole-v1", "CartPole-v1", "", "NoSuchEnv-v0", "Pendulum-v1"]),
       json_flag=st.sampled_from([[], ["--json"], ["--no-json"], UNKNOWN_FLAGS[:1]]))
@example(numbers=(["--seconds", "0.5"], []), env_id="CartPole-v1", json_flag=["--json"])
def test_fuzzed_preflight_command_lines_refuse_bad_numbers_and_write_nothing(numbers, env_id, json_flag, brief_measurements):
    flags, bad = numbers
    with workspace() as cwd:
        outcome = call(["preflight", "--env-id", env_id, *flags, *json_flag])
        check_clean(outcome)
        check_writes(cwd, set(), set(), outcome)
    if json_flag == UNKNOWN_FLAGS[:1]:
        assert not outcome.started, outcome
    elif bad:
        check_ranges(outcome, bad, ())
    elif env_id == "CartPole-v1":
        assert outcome.started, f"preflight failed on this machine with valid flags\n{outcome}"
    if outcome.started and "--json" in json_flag:
        assert json.loads(outcome.out)["throughput"]["env_id"] == env_id


# ---- end to end -----------------------------------------------------------------------------------

# one refusal of each kind per command, each a process start (about 2.5 s where it imports torch): the other values and
# refusals are the in-process tests' above and tests/test_cli.py's (TRAIN_REFUSALS, EVAL_REFUSALS, TOOL_REFUSALS)
REFUSED = [
    (["train", "ppo", "--gamma", "1.5"], "--gamma"),  # fleetrl's own range check
    (["train", "ppo", "--bogus-flag", "1"], "Unrecognized"),  # tyro's usage error
    (["eval", "notes.txt"], "not a fleetrl checkpoint"),
    (["bench-env", "--seconds", "inf"], "--seconds"),
    (["benchmark", "--env-ids", "CartPole-v1", "--num-seeds", "0", "--", "true"], "--num-seeds"),
]


@pytest.mark.slow
def test_real_processes_fail_cleanly_or_run_one_iteration_and_write_only_their_run_folder(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("not a checkpoint\n")
    (cwd / "empty.pt").write_bytes(b"")
    before = listing(cwd)
    for argv, needle in REFUSED:
        proc = run_fleetrl(*argv, cwd=cwd, timeout=120)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and needle in proc.stderr, (argv, proc.stderr)
        assert proc.stderr.startswith("fleetrl: error: ") or "For full helptext" in proc.stderr, (argv, proc.stderr)
    assert listing(cwd) == before, "a refused command wrote files"
    # a valid one starts, runs its one iteration (--total-timesteps = one batch) and writes only its run folder
    proc = run_fleetrl("train", "ppo", "--env-backend", "sync", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32",
                       "--run-dir", "run", cwd=cwd, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert {top(p) for p in listing(cwd) - before} == {"run"} and list((cwd / "run" / "checkpoints").glob("ckpt_*.pt"))
    # its eval in this process (eval's real process is test_ppo_runs.py's): a relative run folder, in the same cwd
    evaluated = run_fleetrl_here("eval", "run", "--episodes", "2", "--json", cwd=cwd)
    assert evaluated.returncode == 0 and '"episodes": 2' in evaluated.stdout, evaluated.stdout + evaluated.stderr
    assert {top(p) for p in listing(cwd) - before} == {"run"}


if os.environ.get("FLEETRL_FUZZ_SHOW"):  # what the fuzzer reaches: FLEETRL_FUZZ_SHOW=1 pytest -s tests/test_cli_fuzz.py
    _call = call

    def call(argv: list[str]) -> Outcome:  # noqa: F811
        outcome = _call(argv)
        print(f"\n[{outcome.code}] {' '.join(argv)[:400]}\n    {(outcome.err.strip().splitlines() or [''])[0][:110]}")
        return outcome
