"""`--env-backend auto`: pick the fastest backend for this env family, machine and installed extras.

The decision tree (numbers measured on a 2-core machine, docs/backends.md and docs/benchmarks.md):

1. Procgen ids exist only in EnvPool -> ``envpool``.
2. Atari: a C++ vector steps about 2x faster than Python wrappers (Breakout x8: sync 1.6k, ale
   2.8-3.1k steps/s). Which of ``ale`` and ``envpool`` is faster depends on the host (EnvPool 1,307
   against ale 988 steps/s on one, ale ahead on another), so when both are installed they are
   measured at start (:func:`probe_backends`, ``PROBE_BUDGET_S`` in all, construction included) and
   the faster is kept; with only one installed it is taken without a probe.
3. Everything else (classic control, MuJoCo, custom envs): measure one env's step
   (:func:`fleetrl.envs.probe.measure_step`, at most a second). Multi-process stepping pays only when a step costs
   more than a wake-up round trip plus the copy: gymnasium's AsyncVectorEnv ran CartPole at 15k steps/s against 109k
   in-process, and EnvPool ran HalfCheetah at 12k against 18k for sync. So: ``async`` when a step takes at least
   ``ASYNC_MIN_STEP_US`` and there are at least 2 cores and 2 envs (or 1 core and an env that waits, whose waits
   overlap in threads), else ``sync``. The measured step then sizes the async backend's workers and stepping threads
   (:mod:`fleetrl.envs.stepping`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from fleetrl.cores import available_cores
from fleetrl.envs.probe import RandomStepper, StepCost, measure_step
from fleetrl.envs.stepping import WAITS_BELOW
from fleetrl.envs.registry import EnvFamily

ASYNC_MIN_STEP_US = 100.0  # below this, one in-process loop beats waking worker processes

ATARI_CANDIDATES = ("ale", "envpool")  # in order of preference when the probe cannot tell them apart
PROBE_BUDGET_S = 2.0  # the whole backend probe, construction included
# Construction grows with the env count (Breakout here: about 0.3 s per env for ale, 0.15 s for
# EnvPool, twice that while other jobs load the host), so 8 full-size envs of each would spend the
# budget on building alone: the probe times the fewest envs that run the mode, 1 for plain step and
# 2 (two halves) for split, and the chosen backend is then built at full size.
PROBE_ENVS_STEP, PROBE_ENVS_SPLIT = 1, 2
PROBE_ROUNDS = 3  # slices per backend, alternating, so a burst of load on a shared host hits both
PROBE_MIN_BUILD_SHARE = 0.25  # do not start building a candidate with less than this share of the budget left
PROBE_CLOSE_S = 0.15  # kept back per probed backend for closing it
PROBE_TIE = 0.05  # rates within 5% are a tie (timings swing more than that): keep the preferred backend


MODE_NAMES = {"step": "plain step", "split": "two halves by send/recv"}


@dataclass
class ProbeResult:
    """What :func:`probe_backends` measured: env steps/s per backend (summed over ``num_envs`` envs)."""

    rates: dict[str, float] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)  # "step", or "split" (two halves by send/recv)
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why it was not measured
    num_envs: int = 0
    seconds: float = 0.0  # wall time of the whole probe, construction and closing included

    def fastest(self, preference: Sequence[str] = ()) -> str | None:
        """The fastest backend; one in ``preference`` order wins a tie within ``PROBE_TIE``."""
        if not self.rates:
            return None
        best = max(self.rates, key=self.rates.get)
        for name in preference:
            if name in self.rates and self.rates[name] >= self.rates[best] * (1 - PROBE_TIE):
                return name
        return best

    def describe(self) -> str:
        """e.g. ``envpool 1,307 steps/s, ale 988 steps/s (1 env each, plain step, probed in 1.9 s)``."""
        modes = set(self.modes.values())
        ranked = sorted(self.rates.items(), key=lambda kv: -kv[1])
        rates = ", ".join(f"{b} {r:,.0f} steps/s" + ("" if len(modes) == 1 else f" ({MODE_NAMES[self.modes[b]]})")
                          for b, r in ranked) or "nothing measured"
        how = [f"{self.num_envs} env{'s' if self.num_envs != 1 else ''} each"]
        if len(modes) == 1:
            how.append(MODE_NAMES[modes.pop()])
        how.append(f"probed in {self.seconds:.1f} s")
        skipped = "".join(f"; {b} skipped: {why}" for b, why in self.skipped.items())
        return f"{rates} ({', '.join(how)}){skipped}"


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    reason: str
    probe: ProbeResult | None = None  # the measurements, when the choice was measured
    cost: StepCost | None = None  # one env's step, when it was measured (the async backend's stepping plan uses it)


def probe_backends(
    env_id: str,
    family: EnvFamily,
    candidates: Sequence[str],
    split: bool = False,
    num_envs: int | None = None,
    budget_s: float = PROBE_BUDGET_S,
    build: Callable[[str, int], Any] | None = None,
) -> ProbeResult:
    """Time each candidate backend with random actions, within ``budget_s`` seconds in all (construction included).

    ``split``: time the zero-lag sampler's mode on backends that have it: the two groups of
    ``envs.split(2)`` sent in turn, each received by its ids (``recv(ids)``) before it is sent
    again; plain ``step`` on the others. ``build(backend, n)`` makes the vector env (default:
    :func:`fleetrl.envs.make_vector_env`) of ``num_envs`` envs (default: the fewest that run the
    mode). A candidate that fails to build or step is skipped with the reason; so is one that the
    budget leaves no time to build.
    """
    if build is None:
        from fleetrl.envs import make_vector_env

        def build(backend: str, n: int):
            return make_vector_env(env_id, n, backend, family=family)

    if num_envs is None:
        num_envs = PROBE_ENVS_SPLIT if split else PROBE_ENVS_STEP
    start = time.perf_counter()
    deadline = start + budget_s
    result = ProbeResult(num_envs=num_envs)
    steppers: dict[str, RandomStepper] = {}
    slowest_build = 0.0
    try:
        for backend in candidates:
            # with less time left than the slowest build so far, this build would likely overrun the budget
            if deadline - time.perf_counter() < max(budget_s * PROBE_MIN_BUILD_SHARE, slowest_build):
                result.skipped[backend] = f"the {budget_s:g} s budget was spent building the others"
                continue
            envs = None
            t_build = time.perf_counter()
            try:
                envs = build(backend, num_envs)
                # as the zero-lag sampler does: split before the reset (a native backend builds a pool per group)
                groups = envs.split(2) if split and all(hasattr(envs, m) for m in ("split", "send", "recv")) else None
                halves = groups is not None and len(groups) >= 2
                envs.reset(seed=0)
                stepper = RandomStepper(envs, np.random.default_rng(0), groups if halves else None)
                stepper.run(0.0, min_batches=2)  # warm-up: the first steps start the C++ threads
            except Exception as exc:  # noqa: BLE001 - any failure means "not this backend", said in the reason
                result.skipped[backend] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
                if envs is not None:
                    _close_quietly(envs)
                continue
            slowest_build = max(slowest_build, time.perf_counter() - t_build)
            steppers[backend] = stepper
            result.modes[backend] = "split" if halves else "step"
        # what is left, shared by alternating slices; keep some for closing the envs (0.1-0.2 s each here)
        left = deadline - time.perf_counter() - PROBE_CLOSE_S * len(steppers)
        slice_s = max(left, 0.0) / (PROBE_ROUNDS * max(len(steppers), 1))
        slices: dict[str, list[float]] = {b: [] for b in steppers}
        for _ in range(PROBE_ROUNDS):
            for backend, stepper in list(steppers.items()):
                try:
                    t0 = time.perf_counter()
                    steps = stepper.run(slice_s)
                    slices[backend].append(steps / (time.perf_counter() - t0))
                except Exception as exc:  # noqa: BLE001
                    result.skipped[backend] = f"failed while stepping: {type(exc).__name__}: {exc}"
                    result.modes.pop(backend, None)
                    slices.pop(backend)
                    _close_quietly(steppers.pop(backend).envs)
        result.rates = {b: statistics.median(r) for b, r in slices.items()}
    finally:
        for stepper in steppers.values():
            _close_quietly(stepper.envs)
        result.seconds = time.perf_counter() - start
    return result


def _close_quietly(envs: Any) -> None:
    try:
        envs.close()
    except Exception:  # noqa: BLE001 - a probe env that fails to close must not stop the choice
        pass


def choose_backend(
    env_id: str,
    family: EnvFamily,
    num_envs: int,
    cores: int | None = None,
    need_frames: bool = False,
    split: bool = False,
) -> BackendChoice:
    """``need_frames``: video capture renders Python envs, so the C++ backends are left out.
    ``split``: the trainer will step two halves of the envs alternately (send/recv), so Atari
    backends are probed that way."""
    from fleetrl.envs.native import native_backend_support

    cores = cores or available_cores()
    # only Atari chooses between C++ backends; probing EnvPool imports all of it (~1 s), so other families skip it
    native = native_backend_support(env_id, family.name) if family.name == "atari" and not need_frames else {}
    if family.name == "procgen":
        return BackendChoice("envpool", "Procgen envs exist only in EnvPool")
    skipped = ""
    if family.name == "atari":
        installed = [b for b in ATARI_CANDIDATES if native.get(b)]
        if len(installed) == 1:
            other = next(b for b in ATARI_CANDIDATES if b != installed[0])
            return BackendChoice(installed[0], f"Atari: a C++ vector, about 2x the Python wrappers; {other} cannot run it here "
                                               f"(not installed, or no such game), so there is nothing to measure")
        if installed:
            probe = probe_backends(env_id, family, installed, split=split and num_envs >= 2)
            best = probe.fastest(preference=installed)
            if best is not None:
                return BackendChoice(best, f"Atari, measured at start: {probe.describe()}", probe)
            skipped = f"; no C++ backend could run it ({probe.describe()})"
    cost = measure_step(env_id, family)
    if cost.wall_us >= ASYNC_MIN_STEP_US and cores >= 2 and num_envs >= 2:
        return BackendChoice("async", f"{cost.describe()} (>= {ASYNC_MIN_STEP_US:.0f} us): worker processes pay off{skipped}", cost=cost)
    if cost.wall_us >= ASYNC_MIN_STEP_US and cost.cpu_share < WAITS_BELOW and num_envs >= 2:
        # one core, but an env that waits: its waits still overlap in worker threads
        return BackendChoice("async", f"{cost.describe()} (>= {ASYNC_MIN_STEP_US:.0f} us) and it waits: stepping threads overlap "
                                      f"the waits{skipped}", cost=cost)
    why = (f"{cost.describe()}, less than a worker wake-up pays for" if cost.wall_us < ASYNC_MIN_STEP_US
           else f"{cores} core(s) / {num_envs} env(s)")
    return BackendChoice("sync", f"{why}: stepping in-process is fastest{skipped}", cost=cost)
