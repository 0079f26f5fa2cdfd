"""Small real gymnasium envs used by the tests, registered on import (`fleetrl_test_envs:NanReward-v0`)."""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np

# a file whose name is in this variable, where it exists when a slow env is made, makes it step without sleeping: a test
# that slowed a run to land a signal mid-run lets the run's last start (which no signal has to catch) go at full speed
NO_DELAY_FILE_ENV = "FLEETRL_TEST_NO_DELAY_FILE"


def _delay(delay: float) -> float:
    path = os.environ.get(NO_DELAY_FILE_ENV)
    return 0.0 if path and os.path.exists(path) else delay


class NanRewardEnv(gym.Env):
    """CartPole-like observations; after `nan_after` steps in total it returns a NaN reward."""

    def __init__(self, nan_after: int = 1500):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.nan_after = nan_after
        self.total_steps = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        self.total_steps += 1
        self.t += 1
        reward = float("nan") if self.total_steps > self.nan_after else 1.0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), reward, self.t >= 20, False, {}


gym.register("NanReward-v0", entry_point=NanRewardEnv)


class CountingEnv(gym.Env):
    """obs = [step in episode, episode start value]; reward = step; terminates when the action is 1
    after step 3, else truncates (a time limit) at step 7. Lets tests check every field exactly."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.start = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.start = float(self.np_random.integers(0, 1000))
        return np.array([0, self.start], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = bool(action == 1 and self.t > 3)
        truncated = not terminated and self.t >= 7
        return np.array([self.t, self.start], np.float32), float(self.t), terminated, truncated, {}


gym.register("Counting-v0", entry_point=CountingEnv)


class BusyEnv(gym.Env):
    """A pure-Python env whose step is a ~300 us busy loop (not a sleep): expensive enough for workers."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        import time

        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 50, {}


gym.register("Busy-v0", entry_point=BusyEnv)


class HugeRewardEnv(NanRewardEnv):
    """NanReward's twin whose reward after `nan_after` steps is finite but huge (1e38): the env passes fleetrl's
    NaN/inf check, and the loss overflows to inf, a planted non-finite loss."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, 1e38 if self.total_steps > self.nan_after else reward, terminated, truncated, info


gym.register("HugeReward-v0", entry_point=HugeRewardEnv)


# --- odd envs (tests/test_odd_envs.py): each id makes one thing odd ----------------------------------------------

ODD_OBS_SPACES = {
    "float32": lambda: gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
    "uint8": lambda: gym.spaces.Box(0, 255, (8,), np.uint8),  # a vector of bytes, not an image
    "float64": lambda: gym.spaces.Box(-1.0, 1.0, (4,), np.float64),
    "int64": lambda: gym.spaces.Box(-10, 10, (4,), np.int64),
    "dict": lambda: gym.spaces.Dict({"position": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "mode": gym.spaces.Discrete(3)}),
    "tuple": lambda: gym.spaces.Tuple((gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(4))),
}
ODD_ACTION_SPACES = {
    "discrete": lambda: gym.spaces.Discrete(2),
    "multidiscrete": lambda: gym.spaces.MultiDiscrete([3, 2]),
    "multibinary": lambda: gym.spaces.MultiBinary(3),
}


class OddEnv(gym.Env):
    """Random observations from its space, reward 1 a step, 20-step episodes (truncated), made odd by its kwargs:
    the observation space (``obs``, a key of ODD_OBS_SPACES), the action space (``action``), a NaN in the
    observation or an inf reward at step ``nan_obs_at`` / ``inf_reward_at`` of every episode, or an observation
    of the wrong shape at reset (``reset_shape``) or at step ``bad_shape_at``."""

    def __init__(self, obs="float32", action="discrete", nan_obs_at=None, inf_reward_at=None, reset_shape=None,
                 bad_shape_at=None):
        self.observation_space = ODD_OBS_SPACES[obs]()
        self.action_space = ODD_ACTION_SPACES[action]()
        self.nan_obs_at, self.inf_reward_at, self.bad_shape_at = nan_obs_at, inf_reward_at, bad_shape_at
        self.reset_shape = reset_shape
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        if self.reset_shape is not None:
            return np.zeros(self.reset_shape, self.observation_space.dtype), {}
        return self.observation_space.sample(), {}

    def step(self, action):
        assert action in self.action_space, action
        self.t += 1
        obs, reward = self.observation_space.sample(), 1.0
        if self.t == self.nan_obs_at:
            obs[1] = np.nan
        if self.t == self.inf_reward_at:
            reward = float("inf")
        if self.t == self.bad_shape_at:
            obs = np.zeros(self.observation_space.shape[0] + 1, self.observation_space.dtype)
        return obs, reward, False, self.t >= 20, {}


for _id, _kwargs in {
    "Uint8Obs-v0": dict(obs="uint8"),
    "Float64Obs-v0": dict(obs="float64"),
    "IntObs-v0": dict(obs="int64"),
    "DictObs-v0": dict(obs="dict"),
    "TupleObs-v0": dict(obs="tuple"),
    "NanObs-v0": dict(nan_obs_at=5),
    "InfReward-v0": dict(inf_reward_at=7),
    "WrongResetShape-v0": dict(reset_shape=(3,)),
    "WrongStepShape-v0": dict(bad_shape_at=4),
    "MultiDiscreteActions-v0": dict(action="multidiscrete"),
    "MultiBinaryActions-v0": dict(action="multibinary"),
}.items():
    gym.register(_id, entry_point=OddEnv, kwargs=_kwargs)


class StatelessEnv(gym.Env):
    """The same observation every step, reward 1 for action 1, and no episode end: a run that restarts its
    episodes on resume sees exactly what an uninterrupted run sees, so an exact resume gives identical weights.
    ``delay``: each step also sleeps this long (after the env's first ``fast_steps``, which a test that waits for a run's
    first iteration need not wait out), so a tiny run lasts a known wall time however fast the host is."""

    def __init__(self, delay: float = 0.0, fast_steps: int = 0):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.obs = np.array([0.1, -0.2, 0.3, 0.5], np.float32)
        self.delay = _delay(delay)
        self.fast_steps, self.steps = fast_steps, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.obs.copy(), {}

    def step(self, action):
        self.steps += 1
        if self.delay and self.steps > self.fast_steps:
            time.sleep(self.delay)
        return self.obs.copy(), float(action == 1), False, False, {}


gym.register("Stateless-v0", entry_point=StatelessEnv)


class StatelessBoxEnv(StatelessEnv):
    """:class:`StatelessEnv` with continuous actions in [-1, 1]^2, rewarded for being near (0.5, -0.5): the exact
    resume of DDPG and TD3."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def step(self, action):
        return self.obs.copy(), -float(np.square(np.asarray(action) - (0.5, -0.5)).sum()), False, False, {}


gym.register("StatelessBox-v0", entry_point=StatelessBoxEnv)
gym.register("SlowStateless-v0", entry_point=StatelessEnv, kwargs={"delay": 0.005})
# each env of a (re)started run steps its first 128 steps (an iteration at --num-steps 128) at full speed, then sleeps 5 ms a step
gym.register("SlowStatelessAfter128-v0", entry_point=StatelessEnv, kwargs={"delay": 0.005, "fast_steps": 128})


# --- env workers that fail (tests/test_worker_restart.py) ----------------------------------------------------------


class FlakyEnv(gym.Env):
    """Obs ``[t, noise, pid]``: the step in the episode, a draw from the env's RNG at reset, and the process
    that steps it (so a test sees a restarted worker). Reward 1 a step; truncated after ``length`` steps.

    On its ``fail_on_step``-th step (counted over this env object's life, so a rebuilt env counts again) it
    fails as ``how`` says: "raise" (a RuntimeError), "fleet" (a FleetError, which the vector env does not
    restart), "hang" (sleeps far past any test), "crash" (SIGSEGV, as a native crash). With ``once_file``
    only the first env to get there fails (it creates that file first), so a restarted env runs clean.
    ``step_s``: a sleep per step, to kill the worker while it steps.
    """

    def __init__(self, fail_on_step=None, how="raise", once_file=None, length=1000, step_s=0.0):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.fail_on_step, self.how, self.once_file = fail_on_step, how, once_file
        self.length, self.step_s = length, step_s
        self.t = self.total_steps = 0
        self.noise = 0.0

    def _obs(self):
        import os

        return np.array([self.t, self.noise, os.getpid()], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.noise = float(self.np_random.integers(0, 1_000_000))
        return self._obs(), {}

    def step(self, action):
        import os
        import signal
        import time

        if self.step_s:
            time.sleep(self.step_s)
        self.t += 1
        self.total_steps += 1
        if self.total_steps == self.fail_on_step and self._claim_failure():
            if self.how == "raise":
                raise RuntimeError(f"FlakyEnv was told to fail on step {self.fail_on_step}")
            if self.how == "fleet":
                from fleetrl.errors import FleetError

                raise FleetError(f"FlakyEnv found its own observation wrong on step {self.fail_on_step}")
            if self.how == "hang":
                time.sleep(1000)
            if self.how == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
        return self._obs(), 1.0, False, self.t >= self.length, {}

    def _claim_failure(self):
        if self.once_file is None:
            return True
        try:
            open(self.once_file, "x").close()
            return True
        except FileExistsError:
            return False


gym.register("Flaky-v0", entry_point=FlakyEnv)


# every env of the vector fails on each 300th step of its life: a PPO run restarts its workers a few times
gym.register("FlakyTrain-v0", entry_point=FlakyEnv, kwargs={"fail_on_step": 300, "how": "raise", "length": 50})


# --- evaluation (tests/test_evaluate.py) -------------------------------------------------------------------------------


class FixedStartEnv(gym.Env):
    """Every episode is the same: one start, deterministic steps, 20 of them; reward 1 for action 1. A fixed policy
    scores the same each episode, a sampling one varies. Renders a small frame per step for --capture-video."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    LENGTH = 20

    def __init__(self, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode = render_mode
        self.t = 0

    def _obs(self):
        return np.array([self.t / self.LENGTH, 0.5], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), False, self.t >= self.LENGTH, {}

    def render(self):
        return np.full((64, 64, 3), 10 * self.t, np.uint8)


gym.register("FixedStart-v0", entry_point=FixedStartEnv)


class TorchProbeEnv(StatelessEnv):
    """Stateless-v0 that appends, at each reset and at close, the torch threads of the thread running it and the CUDA
    memory its process has allocated (0 without CUDA) to $FLEETRL_TORCH_PROBE: tests/test_flags.py (--torch-threads),
    tests/test_gpu.py (--cuda)."""

    def _probe(self, when: str) -> None:
        import os

        import torch

        cuda_bytes = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        with open(os.environ["FLEETRL_TORCH_PROBE"], "a") as f:
            f.write(f"{when} {torch.get_num_threads()} {cuda_bytes}\n")

    def reset(self, *, seed=None, options=None):
        self._probe("reset")  # during a rollout: the acting threads (sampler.py)
        return super().reset(seed=seed, options=options)

    def close(self):
        self._probe("close")  # at the end, on the trainer's thread: the learner's threads
        super().close()

    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        self.t = getattr(self, "t", 0) + 1
        return obs, reward, False, self.t % 50 == 0, info  # episodes of 50 steps: resets during training too


gym.register("TorchProbe-v0", entry_point=TorchProbeEnv)


class RecordingDriftEnv(gym.Env):
    """A continuous env that appends every observation and reward it returns to a file of its own under
    $FLEETRL_RECORD_DIR (tests/test_distributed.py recomputes the normalisation statistics from them): lines
    ``reset o...`` and ``step done r o...``. Episodes of 40 steps; observations far from mean 0, std 1."""

    LENGTH = 40

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t, self.s, self._file = 0, np.zeros(3), None

    def _record(self, line: str) -> None:
        import os

        if self._file is None:
            self._file = os.path.join(os.environ["FLEETRL_RECORD_DIR"], f"{os.getpid()}-{id(self)}.txt")
        with open(self._file, "a") as f:
            f.write(line + "\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.s = 0, self.np_random.normal(5.0, 3.0, 3)
        obs = self.s.astype(np.float32)
        self._record("reset " + " ".join(repr(float(x)) for x in obs))
        return obs, {}

    def step(self, action):
        self.t += 1
        self.s = 0.9 * self.s + np.array([float(np.asarray(action).ravel()[0]), np.sin(self.t), 2.0])
        obs, reward, done = self.s.astype(np.float32), float(self.s[0] - 0.1 * self.s[2]), self.t >= self.LENGTH
        self._record(f"step {int(done)} {reward!r} " + " ".join(repr(float(x)) for x in obs))
        return obs, reward, False, done, {}


gym.register("RecordingDrift-v0", entry_point=RecordingDriftEnv)


class SlowCartPoleEnv(gym.Wrapper):
    """CartPole-v1 whose every step also sleeps 1 ms: a tiny run lasts seconds however fast the machine is, without
    taking a core, so a test can catch it mid-run (the tuner's pruning)."""

    def __init__(self, delay: float = 0.001):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = _delay(delay)

    def step(self, action):
        import time

        time.sleep(self.delay)
        return self.env.step(action)


gym.register("SlowCartPole-v1", entry_point=SlowCartPoleEnv)


# --- envs that wait (tests/test_wait_envs.py) --------------------------------------------------------------------------


def _in_env_worker() -> bool:
    import multiprocessing

    return multiprocessing.current_process().name.startswith("fleetrl-env-worker")


class BarrierEnv(gym.Env):
    """An env that waits on others: in fleetrl's env workers its ``t``-th step cannot finish until ``at_once`` copies
    (of any worker process) have begun their ``t``-th step, or it raises after ``timeout`` s. Envs stepped one after
    another in a worker never get through. The copies meet in a folder (``$FLEETRL_TEST_BARRIER_DIR``): each step
    leaves a file there. Outside the workers (fleetrl's probes in the trainer) a step just sleeps 2 ms."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, at_once: int = 8, timeout: float = 20.0, length: int = 40):
        import os
        import uuid

        self.at_once, self.timeout, self.length = at_once, timeout, length
        self.folder = os.environ.get("FLEETRL_TEST_BARRIER_DIR")
        self.name, self.steps, self.t = uuid.uuid4().hex, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        import os
        import time

        self.steps += 1
        self.t += 1
        if self.folder and _in_env_worker():
            open(os.path.join(self.folder, f"{self.steps}-{self.name}"), "w").close()
            deadline = time.monotonic() + self.timeout
            while sum(1 for f in os.listdir(self.folder) if f.startswith(f"{self.steps}-")) < self.at_once:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"BarrierEnv: fewer than {self.at_once} envs stepped at once (step {self.steps})")
                time.sleep(0.001)
        else:
            time.sleep(0.002)
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return obs, float(int(action) == int(obs[0] > 0)), False, self.t >= self.length, {}


gym.register("Barrier-v0", entry_point=BarrierEnv)


_GLOBAL = {"counter": 0}  # one per process: state that every copy of GlobalStateEnv shares, as a C library's globals
_INSIDE = {"now": 0, "most": 1}  # most: never below 1, so a reset reports what a lone step would


class GlobalStateEnv(gym.Env):
    """An env that is not thread-safe: its state is a module global, as in a C library with globals, so copies stepped
    from two threads at once advance each other's counter. Obs ``[counter, most]``: ``most`` is the largest number of
    copies ever inside ``step`` at once in this process (1 where copies never step beside each other)."""

    observation_space = gym.spaces.Box(0, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)
    metadata: dict = {"render_modes": []}

    def __init__(self, step_s: float = 0.002, declare: bool | None = None):
        import threading

        self.step_s, self.t = step_s, 0
        _INSIDE.setdefault("lock", threading.Lock())
        if declare is not None:
            self.metadata = {"render_modes": [], "thread_safe": declare}

    def _obs(self, counter):
        return np.array([counter, _INSIDE["most"]], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        _GLOBAL["counter"] = seed or 0
        return self._obs(_GLOBAL["counter"]), {}

    def step(self, action):
        import time

        with _INSIDE["lock"]:
            _INSIDE["now"] += 1
            _INSIDE["most"] = max(_INSIDE["most"], _INSIDE["now"])
        _GLOBAL["counter"] += 1  # every copy in this process moves it
        counter = _GLOBAL["counter"]
        time.sleep(self.step_s)  # waits, so a plan that only looked at speed would step copies in threads
        with _INSIDE["lock"]:
            _INSIDE["now"] -= 1
        self.t += 1
        return self._obs(counter), 0.0, False, self.t >= 50, {}


gym.register("GlobalState-v0", entry_point=GlobalStateEnv)  # found out by the thread-safety check
gym.register("DeclaredThreadUnsafe-v0", entry_point=GlobalStateEnv, kwargs={"declare": False})


class UnreproducibleEnv(gym.Env):
    """An env that waits (a 2 ms sleep a step) and is not reproducible for a seed: its observations come from fresh OS
    entropy, as a simulator seeded from the clock. Thread safety cannot be checked by comparing copies."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return np.random.default_rng().uniform(-1, 1, 2).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        import time

        time.sleep(0.002)
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 50, {}


gym.register("Unreproducible-v0", entry_point=UnreproducibleEnv)


class HangingEnv(gym.Env):
    """Steps normally (a 1 ms sleep a step) until the ``hang_at``-th step of this copy's life, which never returns (it
    sleeps for good): an env that hangs, for the bounds of the start-up probes (fleetrl/envs/probe.py)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, hang_at: int = 1):
        self.hang_at, self.steps = hang_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        import time

        self.steps += 1
        time.sleep(1e6 if self.steps >= self.hang_at else 0.001)
        return np.zeros(2, np.float32), 1.0, False, False, {}


gym.register("HangsAtOnce-v0", entry_point=HangingEnv, kwargs={"hang_at": 1})
gym.register("HangsLater-v0", entry_point=HangingEnv, kwargs={"hang_at": 6})


class ProcessProbeEnv(gym.Env):
    """Obs ``[pid, parent pid, SIGTERM ignored]`` of the process that steps it: tells how a backend started its workers
    (forked from the trainer, with its signal handlers, or by fleetrl's forkserver, ignoring SIGTERM from birth)."""

    observation_space = gym.spaces.Box(0, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        import os
        import signal

        return np.array([os.getpid(), os.getppid(), float(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)], np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


gym.register("ProcessProbe-v0", entry_point=ProcessProbeEnv)
