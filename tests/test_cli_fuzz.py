"""Fuzzed command lines: random and boundary values (0, negatives, NaN, inf, huge numbers, empty strings,
unknown flags, paths that do not exist) thrown at `fleetrl train ppo`, `eval`, `bench-env` and `benchmark`.

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

The calls run in-process (``fleetrl.cli.main``), so hundreds fit in seconds. A call that starts is stopped
early by sentinels patched into the engine: after its first iteration, or before building more envs or a
bigger batch than a test should (a valid configuration, so starting is all there is to prove). A handful of
real subprocess calls (marked slow) check the same end to end.
"""

from __future__ import annotations

import contextlib
import io
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetrl import cli

from conftest import run_fleetrl

# function-scoped fixtures only install the sentinels, the same for every example
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MAX_ENVS = 8  # a started call with more envs than this stops before building them
MAX_BATCH = 2048  # ... or before allocating a larger rollout
MAX_MINIBATCHES = 256  # ... or after this many minibatch updates (a huge --update-epochs)
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
TRAIN_RANGES = {
    "--seed": (ints, SEED),
    "--total-timesteps": (ints, whole(1)),
    "--learning-rate": (floats, real(0, COEF_MAX, open_low=True)),
    "--num-envs": (ints, whole(1)),
    "--num-steps": (ints, whole(1)),
    "--gamma": (floats, real(0, 1)),
    "--gae-lambda": (floats, real(0, 1)),
    "--num-minibatches": (ints, whole(1)),
    "--update-epochs": (ints, whole(1)),
    "--clip-coef": (floats, real(0, COEF_MAX, open_low=True)),
    "--ent-coef": (floats, real(0, COEF_MAX)),
    "--vf-coef": (floats, real(0, COEF_MAX)),
    "--max-grad-norm": (floats, real(0, COEF_MAX, open_low=True)),
    "--target-kl": (floats, real(0, COEF_MAX, open_low=True)),
    "--async-batch": (ints, whole(1)),
    "--policy-lag": (ints, whole(0, 1)),
    "--sticky-actions": (floats, real(0, 1)),
    "--checkpoint-every": (ints, whole(1)),
    "--keep-checkpoints": (ints, whole(1)),
    "--torch-threads": (ints, whole(1, 1024)),
    "--dist-timeout": (floats, real(0, 1e9, open_low=True)),
    "--max-env-restarts": (ints, whole(0)),
    "--env-timeout": (floats, real(0, 1e9)),
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
TRAIN_ACROSS = ("does not split", "do not split", "leaves 1 sample per minibatch", "--async-batch", "less than one batch",
                "The loss became non-finite")


@pytest.fixture
def engine_sentinels(monkeypatch):
    """Stop a started training run after its first iteration, or before it builds more than a test should."""
    import fleetrl.algos.ppo as ppo
    import fleetrl.monitor.trainlog as trainlog
    import fleetrl.run as run

    real_make, real_sampler, real_loss = run.make_vector_env, ppo.Sampler, ppo.ppo_loss
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

    def ppo_loss(*args, **kwargs):
        calls["loss"] += 1
        if calls["loss"] > MAX_MINIBATCHES:
            raise Started("many minibatch updates")
        return real_loss(*args, **kwargs)

    class Progress(trainlog.Progress):
        def update(self, step, *args, **kwargs):
            if step < self.total:
                raise Started("after the first iteration")
            super().update(step, *args, **kwargs)

    monkeypatch.setattr(run, "make_vector_env", make_vector_env)  # the session builds the envs
    monkeypatch.setattr(ppo, "Sampler", sampler)
    monkeypatch.setattr(ppo, "ppo_loss", ppo_loss)
    monkeypatch.setattr(trainlog, "Progress", Progress)


@st.composite
def train_sizes(draw) -> list[str]:
    """A small valid batch, and --total-timesteps of one batch: a run that starts is one iteration."""
    num_envs, num_steps = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([2, 8, 16]))
    return ["--num-envs", str(num_envs), "--num-steps", str(num_steps), "--num-minibatches", "1", "--update-epochs",
            draw(st.sampled_from(["1", "2"])), "--total-timesteps", str(num_envs * num_steps)]


@settings(FUZZ, max_examples=150)
@given(sizes=train_sizes(), numbers=numeric_flags(TRAIN_RANGES))
def test_train_refuses_every_number_out_of_its_range_and_starts_with_the_others(sizes, numbers, engine_sentinels):
    flags, bad = numbers
    with workspace() as cwd:
        outcome = call(["train", "ppo", "--env-backend", "sync", "--no-progress", "--run-dir", "run", *sizes, *flags])
        check_clean(outcome)
        check_ranges(outcome, bad, TRAIN_ACROSS)
        check_writes(cwd, set(), {"run"}, outcome)
        if bad:
            assert not (cwd / "run").exists(), "a refused run created its folder"


@st.composite
def train_junk(draw) -> tuple[list[str], str | None]:
    run_dir = draw(st.sampled_from(["run", "run", "nested/deeper/run", "", ".", None]))
    argv = ["train", "ppo", *(["--run-dir", run_dir] if run_dir is not None else [])]
    argv += ["--env-backend", draw(st.sampled_from(["sync"] * 6 + ["auto", "async", "", "nope"]))]
    argv += ["--env-id", draw(st.sampled_from(["CartPole-v1"] * 6 + ["Pendulum-v1", "", "NoSuchEnv-v0", "no_such_module:Env-v0"]))]
    argv += draw(train_sizes()) + draw(numeric_flags(TRAIN_RANGES, junk=True))[0]
    options = {"--resume": ["auto", "missing.pt", "", "run"], "--precision": ["fp32", "bf16", "", "fp16"],
               "--actor-device": ["cpu", "learner", "gpu", ""], "--exp-name": ["", "a/b", "x"]}
    for extra in draw(st.lists(st.sampled_from(["--no-progress", "--no-cuda", "--no-norm-adv", *options, *UNKNOWN_FLAGS]),
                               max_size=3, unique=True)):
        argv += [extra, draw(st.sampled_from(options[extra]))] if extra in options else [extra]
    return argv, run_dir


@settings(FUZZ, max_examples=120)
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


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A real run folder with one checkpoint (a tiny CartPole run)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    outcome = call(["train", "ppo", "--env-backend", "sync", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32",
                    "--no-progress", "--run-dir", str(run_dir)])
    assert outcome.code == 0, outcome
    return run_dir


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


@settings(FUZZ, max_examples=40)
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


@settings(FUZZ, max_examples=60)
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


@settings(FUZZ, max_examples=50)
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


@settings(FUZZ, max_examples=60)
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


@settings(FUZZ, max_examples=40)
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


@settings(FUZZ, max_examples=50)
@given(case=benchmark_junk())
def test_fuzzed_benchmark_command_lines_start_or_fail_cleanly(case, small_grids):
    argv, out = case
    with workspace() as cwd:
        (cwd / "afile").write_text("a file where --out wants a folder\n")
        outcome = call(argv)
        check_clean(outcome)
        check_writes(cwd, {"afile"}, {top(out)} if out else {"runs"}, outcome)


# ---- end to end -----------------------------------------------------------------------------------

REFUSED = [
    (["train", "ppo", "--learning-rate", "nan"], "--learning-rate"),
    (["train", "ppo", "--gamma", "1.5"], "--gamma"),
    (["train", "ppo", "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "64"], "--num-minibatches"),
    (["train", "ppo", "--bogus-flag", "1"], "Unrecognized"),
    (["eval", "notes.txt"], "not a fleetrl checkpoint"),
    (["eval", "empty.pt"], "empty"),
    (["eval", "."], "No checkpoint"),
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
    evaluated = run_fleetrl("eval", "run", "--episodes", "2", "--json", cwd=cwd, timeout=120)
    assert evaluated.returncode == 0 and '"episodes": 2' in evaluated.stdout, evaluated.stdout + evaluated.stderr
    assert {top(p) for p in listing(cwd) - before} == {"run"}


if os.environ.get("FLEETRL_FUZZ_SHOW"):  # what the fuzzer reaches: FLEETRL_FUZZ_SHOW=1 pytest -s tests/test_cli_fuzz.py
    _call = call

    def call(argv: list[str]) -> Outcome:  # noqa: F811
        outcome = _call(argv)
        print(f"\n[{outcome.code}] {' '.join(argv)[:400]}\n    {(outcome.err.strip().splitlines() or [''])[0][:110]}")
        return outcome
