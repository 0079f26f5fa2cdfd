"""The vector interface every backend produces, and the in-process synchronous backend.

The interface (the one contract between environments and algorithms)
--------------------------------------------------------------------
A vector env steps ``num_envs`` copies of one environment:

    obs, info = envs.reset(seed=s)            # env i is seeded with s + i
    obs, reward, terminated, truncated, info = envs.step(actions)

* ``obs`` is an array ``(num_envs, *single_observation_space.shape)``; ``reward`` is float,
  ``terminated`` and ``truncated`` are bool arrays of length ``num_envs``. Terminated and truncated
  are kept apart: truncation is a time limit, and the learner bootstraps through it.
* **Same-step autoreset** (gymnasium 1.x ``AutoresetMode.SAME_STEP``): when env ``i`` finishes,
  ``obs[i]`` is already the first observation of its next episode, and
  ``info["final_obs"][i]`` holds the last observation of the finished one (valid where the mask
  ``info["_final_obs"]`` is true). ``reward[i]`` is the reward of the finishing transition.
* **Episode statistics**: when an episode really ends (for Atari: game over, not a lost life),
  ``info["episode"]["r"][i]`` is its undiscounted return (for Atari the unclipped game score) and
  ``info["episode"]["l"][i]`` its length in agent steps, with the mask ``info["_episode"]``.
* These info keys are present only on steps where at least one env finished.

Stepping groups of envs separately (EnvPool's send/recv model; every backend but ``gym-sync``):

    envs.send(actions, env_ids)               # start stepping these envs (all if None)
    obs, reward, terminated, truncated, info, env_ids = envs.recv()

* ``recv()`` returns the first ``async_batch`` envs that are ready on backends that step in the
  background with ``async_batch`` below ``num_envs``, else the group sent first; ``recv(env_ids)``
  waits for exactly that group. Arrays are indexed by position in the returned ``env_ids``, and the
  same-step autoreset and info keys hold per returned env.
* ``envs.split(2)`` names groups of env ids that can be sent and received apart (whole worker groups
  or sub-pools); ``envs.steps_in_background`` says whether envs step while the caller computes.

docs/backends.md holds the same spec with the backend-by-backend details.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.envs.wrappers import game_over, set_env_index
from fleetrl import config
from fleetrl.errors import FleetError

GYM_ASYNC_BUILD_TIMEOUT_S = 60.0  # gymnasium's AsyncVectorEnv waits for its workers' builds without a deadline: this one


class SyncVectorEnv:
    """fleetrl's in-process backend: steps the envs in turn, with same-step autoreset.

    It does what gymnasium's ``SyncVectorEnv`` in SAME_STEP mode does (the tests check they agree
    step for step) at a third of its per-step overhead, which matters for cheap envs like CartPole.
    Its send/recv steps nothing in the background (``recv`` steps the envs): it lets the sampler's
    group-by-group loop run, and be tested, on this backend too.
    """

    steps_in_background = False

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        self.envs = [fn() for fn in env_fns]
        for i, env in enumerate(self.envs):
            set_env_index(env, i)  # named in the env's error messages
        self.num_envs = len(self.envs)
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        if self.single_observation_space.shape is None:  # Dict, Tuple, ...
            self.close()
            raise FleetError(f"SyncVectorEnv stores observations in one array, and the env gives {self.single_observation_space}; "
                             f"build the envs with fleetrl.envs.EnvFactory, which flattens Dict and Tuple observations.")
        self._obs_shape = (self.num_envs, *self.single_observation_space.shape)
        rows = getattr(self.envs[0].unwrapped, "agent_rows", None)  # a multi-agent game (fleetrl/envs/multiagent.py): flags per agent
        self._flags = () if rows is None else (rows,)
        self._obs_dtype = self.single_observation_space.dtype
        self._sent: deque[tuple[np.ndarray, np.ndarray]] = deque()  # (env ids, actions) not yet received
        # make_vec (fleetrl/envs/gym_vector.py) hands gymnasium's users every env's own infos: with this set, the
        # info dict carries "env_infos", {position: (step info, reset info)} for the envs whose infos are not empty
        # (step info None after a reset, reset info None unless the env finished and was reset). Off in training.
        self.keep_env_infos = False

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self._sent.clear()
        obs = np.empty(self._obs_shape, self._obs_dtype)
        env_infos = {}
        for i, env in enumerate(self.envs):
            obs[i], reset_info = env.reset(seed=None if seed is None else seed + i)
            if self.keep_env_infos and reset_info:
                env_infos[i] = (None, reset_info)
        return obs, ({"env_infos": env_infos} if env_infos else {})

    def step(self, actions: np.ndarray):
        return self._step(range(self.num_envs), actions)[:5]

    def send(self, actions: np.ndarray, env_ids: np.ndarray | Sequence[int] | None = None) -> None:
        """Queue a step of ``env_ids`` (all if None); the next ``recv`` takes it."""
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64).reshape(-1)
        self._sent.append((ids, np.asarray(actions)))

    def recv(self, env_ids: np.ndarray | Sequence[int] | None = None):
        """Step the envs of the oldest ``send`` (or of the one for ``env_ids``): ``obs, ..., info, env_ids``."""
        if not self._sent:
            raise FleetError("recv() has nothing to step: send() actions first.")
        index = 0 if env_ids is None else _find_sent(self._sent, env_ids)
        ids, actions = self._sent[index]
        del self._sent[index]
        return self._step(ids, actions)

    def split(self, count: int) -> list[np.ndarray]:
        """``count`` groups of env ids to send and receive apart (any split: envs step one by one)."""
        return [ids for ids in np.array_split(np.arange(self.num_envs), count) if len(ids)]

    def _step(self, ids: Sequence[int], actions: np.ndarray):
        n = len(ids)
        obs = np.empty((n, *self._obs_shape[1:]), self._obs_dtype)
        reward = np.empty((n, *self._flags), np.float64)
        terminated = np.empty((n, *self._flags), bool)
        truncated = np.empty((n, *self._flags), bool)
        info: dict[str, Any] = {}
        for k, i in enumerate(ids):
            env = self.envs[i]
            ob, reward[k], terminated[k], truncated[k], env_info = env.step(actions[k])
            if (terminated[k] or truncated[k]) if not self._flags else game_over(terminated[k], truncated[k]):
                if "final_obs" not in info:
                    info.update(final_obs=np.zeros_like(obs), _final_obs=np.zeros(n, bool))
                info["final_obs"][k], info["_final_obs"][k] = ob, True
                if "episode" in env_info:
                    if "episode" not in info:
                        info["episode"] = {"r": np.zeros(n, np.float64), "l": np.zeros(n, np.int64)}
                        info["_episode"] = np.zeros(n, bool)
                    info["episode"]["r"][k] = env_info["episode"]["r"]
                    info["episode"]["l"][k] = env_info["episode"]["l"]
                    info["_episode"][k] = True
                ob, reset_info = env.reset()
                if self.keep_env_infos:
                    info.setdefault("env_infos", {})[k] = (env_info, reset_info)
            elif self.keep_env_infos and env_info:
                info.setdefault("env_infos", {})[k] = (env_info, None)
            obs[k] = ob
        return obs, reward, terminated, truncated, info, np.asarray(ids)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class GymSyncVectorEnv:
    """gymnasium's ``SyncVectorEnv`` in same-step autoreset mode, with its infos put in fleetrl's form.

    Each sub-env must carry :class:`fleetrl.envs.wrappers.EpisodeStats`, which reports
    ``info["episode"] = {"r": ..., "l": ...}`` when the episode really ends.
    """

    steps_in_background = False
    _gym_vector: Any = gym.vector.SyncVectorEnv
    _name = "gym-sync"

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        self._envs = self._gym_vector(list(env_fns), autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.num_envs = self._envs.num_envs
        self.single_observation_space = self._envs.single_observation_space
        self.single_action_space = self._envs.single_action_space
        self.envs = getattr(self._envs, "envs", [])  # the sub-envs in this process, for video capture and tests
        for i, env in enumerate(self.envs):
            set_env_index(env, i)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        obs, _ = self._envs.reset(seed=seed)
        return obs, {}

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, gym_info = self._envs.step(actions)
        info: dict[str, Any] = {}
        if "_final_obs" in gym_info:
            done = gym_info["_final_obs"]
            final_obs = np.zeros_like(obs)
            for i in np.flatnonzero(done):
                final_obs[i] = gym_info["final_obs"][i]
            info["final_obs"], info["_final_obs"] = final_obs, done
            finished = gym_info["final_info"]
            if "_episode" in finished:
                info["episode"] = {"r": finished["episode"]["r"], "l": finished["episode"]["l"]}
                info["_episode"] = finished["_episode"]
        return obs, reward, terminated, truncated, info

    def send(self, actions: np.ndarray, env_ids: np.ndarray | Sequence[int] | None = None) -> None:
        """gymnasium steps every env together: ``env_ids`` must be all of them (or None)."""
        if env_ids is not None and not np.array_equal(np.sort(np.asarray(env_ids)), np.arange(self.num_envs)):
            raise FleetError(f"The {self._name} backend steps every env together; send() takes all env ids. "
                             "Use --env-backend sync or async to step groups of envs apart.")
        self._sent = np.asarray(actions)

    def recv(self, env_ids: np.ndarray | Sequence[int] | None = None):
        return (*self.step(self._sent), np.arange(self.num_envs))

    def split(self, count: int) -> list[np.ndarray]:
        return [np.arange(self.num_envs)]

    def close(self) -> None:
        self._envs.close()


def _gym_async_vector(env_fns: list[Callable[[], gym.Env]], **kwargs: Any) -> gym.vector.AsyncVectorEnv:
    """gymnasium's AsyncVectorEnv with its processes started as every child of the trainer is (fleetrl/processes.py):
    by the forkserver, ignoring SIGTERM and Ctrl-C from birth. gymnasium's default, a fork, would copy the trainer,
    its running threads (a fork of a multi-threaded process can deadlock the child) and its signal handlers. Each env
    function first makes its worker a child as fleetrl's own are (:class:`fleetrl.processes.CallInChild`). Its build
    (one env here for the spaces, then each worker's) gets GYM_ASYNC_BUILD_TIMEOUT_S, as an async worker's build gets
    at least 30 s: an env that hangs there ends it in one paragraph, its workers killed (they ignore SIGTERM, so
    multiprocessing's exit would wait for them for good)."""
    import multiprocessing

    from fleetrl.envs.bounded import ProbeHung, run_bounded
    from fleetrl.processes import CallInChild, context

    before = set(multiprocessing.active_children())
    try:
        return run_bounded(lambda watch: watch.call("construction", gym.vector.AsyncVectorEnv, [CallInChild(fn) for fn in env_fns],
                                                    context=context().get_start_method(), **kwargs),
                           GYM_ASYNC_BUILD_TIMEOUT_S, name="fleetrl-gym-async-build")
    except ProbeHung as hung:
        started = set(multiprocessing.active_children()) - before
        for proc in started:
            proc.kill()
        for proc in started:
            proc.join(5.0)  # reaped; bounded, as a process stuck in the kernel can outlive SIGKILL a while
        raise FleetError(f"gymnasium's AsyncVectorEnv (--env-backend gym-async) did not finish building its {len(env_fns)} envs within "
                         f"{hung.timeout:g} s: an env's constructor hangs (waiting for a server, a lock, a prompt?). Its workers were "
                         f"killed. Fix what the env waits for, or use --env-backend async, whose workers get --env-timeout "
                         f"(at least 30 s) to build.") from None


class GymAsyncVectorEnv(GymSyncVectorEnv):
    """gymnasium's ``AsyncVectorEnv`` (a process per env, observations in shared memory) in same-step autoreset mode:
    the baseline a plain CleanRL loop uses for envs that wait, compared by ``fleetrl bench-env``. Its processes come
    from fleetrl's forkserver, as the async backend's workers do."""

    _gym_vector = staticmethod(_gym_async_vector)
    _name = "gym-async"


def _find_sent(sent: deque, env_ids: np.ndarray | Sequence[int]) -> int:
    """The position of the queued send for exactly ``env_ids``."""
    wanted = np.asarray(env_ids).reshape(-1)
    for index, (ids, _) in enumerate(sent):
        if np.array_equal(ids, wanted):
            return index
    raise FleetError(f"recv({wanted.tolist()}) names envs that were not sent together; pass the env_ids given to send().")


def episode_stats(info: dict[str, Any], *more: str) -> list[tuple]:
    """The (return, length) of every episode that finished on this step, and the fields ``more`` names (a PettingZoo
    game's rows: "agent", the agent's index in its game)."""
    if "_episode" not in info:
        return []
    mask = info["_episode"]
    return list(zip(*(info["episode"][key][mask].tolist() for key in ("r", "l", *more))))


FIRST_READY_BACKENDS = ("async", "envpool", "ale", "auto")  # the backends whose recv() can return the first envs ready


def check_async_batch(num_envs: int, async_batch: int | None, backend: str, workers: int | None = None) -> None:
    """The one rule of ``--async-batch`` K, first-ready batches of K of a process's ``num_envs`` envs: K divides the
    envs, and the backend returns batches of that size (async: whole worker groups, so with ``workers`` given K is a
    multiple of the envs each steps; ale: its two fixed halves; EnvPool: at most half the envs, since an env that ends
    an episode takes its reset step before it is returned). ``auto`` picks a backend that can."""
    k, n = async_batch, num_envs
    if k is None or k == n:
        return
    divisors = config.divisors(n, most=4096)
    if not 1 <= k <= n or n % k:
        raise FleetError(f"--async-batch {k} must divide --num-envs {n} (this process's envs): a rollout holds --num-envs x "
                         f"--num-steps transitions, received K at a time. Choose one of {divisors[:12]}, or leave it out.")
    if backend not in FIRST_READY_BACKENDS:
        raise FleetError(f"--async-batch {k} needs a backend that returns the first envs ready, and --env-backend {backend} steps "
                         f"all {n} together. Use --env-backend async or envpool (or auto), or leave --async-batch out.")
    if backend == "ale" and 2 * k != n:
        raise FleetError(f"The ale backend returns envs in two fixed halves at most, so --async-batch must be {n // 2} with "
                         f"--num-envs {n}, got {k}. For first-ready batches of other sizes use --env-backend envpool or async.")
    if backend == "envpool" and k > n // 2:
        raise FleetError(f"EnvPool's first-ready batches are at most half the envs (an env that ends an episode takes one more "
                         f"step, its reset, before it is returned), so --async-batch {k} of --num-envs {n} cannot run. Choose one "
                         f"of {[d for d in divisors if d <= n // 2]}, or use --env-backend async.")
    if backend == "async" and workers is not None and (n % workers or k % (n // workers)):
        per_worker = f"{n / workers:g}"
        raise FleetError(f"--async-batch {k} must be a multiple of the envs each of the {workers} env workers steps ({per_worker}): a "
                         f"worker's envs become ready together. Leave --env-workers out (the plan picks a count that fits), or "
                         f"choose --env-workers among {[w for w in divisors if k % (n // w) == 0][:12]}.")
