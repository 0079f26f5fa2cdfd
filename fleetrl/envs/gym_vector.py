"""``make_vec``: fleetrl's vector backends as a real ``gymnasium.vector.VectorEnv``, for any script (CleanRL's included).

It is a thin adapter: the backends step the envs, with fleetrl's same-step autoreset, and this module puts their
results in gymnasium 1.x's form, exactly as ``gymnasium.vector.SyncVectorEnv(..., autoreset_mode=MODE)`` gives them for
the same env functions and seeds (tests/test_make_vec.py checks it step for step). MODE is gymnasium's default,
NEXT_STEP, unless the caller asks for SAME_STEP:

* NEXT_STEP: the step that ends an episode returns its last observation, reward and flags with the envs' own step
  infos; the next step is the reset step (the first observation, reward 0, both flags false, the action ignored, the
  reset infos). For Python envs an outer wrapper (:class:`NextStepReset`) keeps the backend's same-step reset for that
  step; ``envpool`` (every family: Atari, Procgen, MuJoCo, classic) runs in EnvPool's own next-step autoreset, whose
  reset step is exactly that; ``ale`` (Atari) takes a NOOP there as the end of its reset.
* SAME_STEP: ``info["final_obs"]`` is an object array holding each finished env's last observation (None elsewhere),
  with the mask ``info["_final_obs"]``; ``info["final_info"]`` holds the finished envs' last infos, batched, with
  ``info["_final_info"]``. Every other key is the envs' own step infos (or, for an env that was reset, its reset
  infos), batched by gymnasium's own ``VectorEnv._add_info``, each with its ``_key`` mask.
* Episode statistics: an env built from an id carries fleetrl's ``EpisodeStats``, so a finished episode's return and
  length are in the finished env's last info (NEXT_STEP: ``info["episode"]``; SAME_STEP:
  ``info["final_info"]["episode"]``), where CleanRL's per-env ``RecordEpisodeStatistics`` puts them.
  ``gymnasium.wrappers.vector.RecordEpisodeStatistics(make_vec(...))`` adds ``info["episode"]`` / ``info["_episode"]``.
* The C++ backends (``ale``, ``envpool``) and PettingZoo games have no per-env Python infos: their last infos hold the
  episode statistics only, and their other infos are empty but for a PettingZoo game's ``info["live"]``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.cores import available_cores
from fleetrl.envs.wrappers import game_over
from fleetrl.errors import FleetError

MAKE_VEC_BACKENDS = ("auto", "sync", "async", "ale", "envpool")  # gym-sync and gym-async are gymnasium's own classes
ID_ONLY_BACKENDS = ("ale", "envpool")  # their C++ envs are built from an id, never from a Python function
ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
FUNCTIONS_NAME = "env functions"  # how the probes and the printed reason name a list of env functions
AUTORESET_MODES = (gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP)
# The action ale-py's Atari env takes on a NEXT_STEP reset step, in place of the caller's: NOOP begins every minimal
# action set of ALE, so the step only prolongs the noop start its reset already made (EnvPool needs none: its own
# next-step autoreset ignores the action there)
NATIVE_HOLD_ACTION = 0


class NextStepReset(gym.Wrapper):
    """One Python env, stepped by a backend that resets it in the step that ends its episode, as gymnasium's NEXT_STEP
    steps it: the backend's reset right after the last step runs, and what it returned is kept; the next ``step`` hands
    that back (reward 0, no flags, the reset infos) without stepping the env, so the action given there is ignored.

    The env is reset one call earlier than gymnasium's NEXT_STEP resets it, with no seed either way, so its RNG gives
    the same first observation. A PettingZoo game (``agent_rows``) gets a reward and flags per agent."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._rows = getattr(env.unwrapped, "agent_rows", None)
        self._ended = False  # the last call was a step that ended the episode: the next reset is the backend's autoreset
        self._reset_result: tuple[Any, dict] | None = None  # what that autoreset returned, for the next step

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        # a reset that follows no ended step is the caller's own (reset() of the vector): the next step steps
        self._reset_result = (obs, info) if self._ended else None
        self._ended = False
        return obs, info

    def step(self, action: Any):
        if self._reset_result is not None:
            (obs, info), self._reset_result = self._reset_result, None
            if self._rows is None:
                return obs, 0.0, False, False, info
            return obs, np.zeros(self._rows), np.zeros(self._rows, bool), np.zeros(self._rows, bool), info
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._ended = game_over(terminated, truncated)  # as the backends decide to reset it (a game: every agent's row)
        return obs, reward, terminated, truncated, info


class NextStepEnvFn:
    """An env function whose env is wrapped in :class:`NextStepReset` (picklable, for the async backend's workers)."""

    def __init__(self, env_fn: Callable[[], gym.Env]):
        self.env_fn = env_fn
        self.env_id = getattr(env_fn, "env_id", None)  # the async backend names its workers' envs by it

    def __call__(self) -> gym.Env:
        return NextStepReset(self.env_fn())

    def __repr__(self) -> str:
        return f"NextStepEnvFn({self.env_fn!r})"


class FleetVectorEnv(gym.vector.VectorEnv):
    """One of fleetrl's vector backends behind gymnasium's ``VectorEnv`` interface, in ``autoreset_mode`` (NEXT_STEP or
    SAME_STEP; the backends reset in the same step, and NEXT_STEP is made from it here, but for an EnvPool backend in
    its own next-step mode (``next_step``, set by make_vec): see the module's docstring).

    ``backend``: the backend's name; ``backend_reason``: why it was chosen (``auto``'s printed reason). The fleetrl
    backend itself is ``fleet_envs`` (same-step, with its ``send``/``recv`` for scripts that want them). In NEXT_STEP
    mode, Python envs must have been built by :class:`NextStepEnvFn` (make_vec does it)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, fleet_envs: Any, backend: str, backend_reason: str,
                 autoreset_mode: gym.vector.AutoresetMode = gym.vector.AutoresetMode.SAME_STEP):
        self.fleet_envs = fleet_envs
        self.autoreset_mode = autoreset_mode
        self.metadata = {**type(self).metadata, "autoreset_mode": autoreset_mode}
        self._next_step = autoreset_mode == gym.vector.AutoresetMode.NEXT_STEP
        self.backend, self.backend_reason = backend, backend_reason
        self.num_envs = fleet_envs.num_envs
        self.single_observation_space = fleet_envs.single_observation_space
        self.single_action_space = fleet_envs.single_action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        # sync and async hand over every env's own infos when asked; ale and envpool have none to give, and a PettingZoo
        # game's rows (fleetrl/envs/multiagent.py) give each agent's episode statistics, as the C++ backends do
        self._env_infos = hasattr(fleet_envs, "keep_env_infos") and not hasattr(fleet_envs, "agent_rows")
        if self._env_infos:
            fleet_envs.keep_env_infos = True
        # gymnasium keeps a Discrete env's observation as the scalar it returned, any other as an array (a 0-d one too)
        self._scalar_obs = isinstance(self.single_observation_space, gym.spaces.Discrete)
        self._agent_rows = getattr(fleet_envs, "agent_rows", None)  # a PettingZoo game's agents, one row each
        self._native = not self._env_infos and self._agent_rows is None  # a C++ backend: no Python env to hold a row
        # EnvPool in its own next-step autoreset (make_vec sets it): its reset steps come as they are, with no NOOP
        self._backend_next_step = bool(getattr(fleet_envs, "next_step", False))
        # NEXT_STEP: the rows whose next step is the reset step, and per row the reset steps that the backend counted into
        # the episode statistics (a C++ env's NOOP, a PettingZoo game's held step), taken off the length it reports
        self._reset_next = np.zeros(self.num_envs, bool)
        self._uncounted = np.zeros(self.num_envs, np.int64)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every env; with ``seed`` an int, env ``i`` is seeded ``seed + i`` (as gymnasium's vector envs do)."""
        if options:
            raise FleetError(f"make_vec's envs take no reset options (got {options}): fleetrl's backends reset every env the same "
                             f"way. Pass what varies through the env functions' arguments instead.")
        seed = self._seed_base(seed)
        super().reset(seed=seed)  # seeds the vector's own np_random, as gymnasium's vector envs do
        obs, fleet_info = self.fleet_envs.reset(seed=seed)
        self._reset_next[:], self._uncounted[:] = False, 0
        infos: dict[str, Any] = {}
        for i, (_, reset_info) in sorted(fleet_info.get("env_infos", {}).items()):
            infos = self._add_info(infos, reset_info, i)
        return obs, infos

    def step(self, actions: Any):
        actions = np.asarray(actions)
        if not self._next_step:
            obs, reward, terminated, truncated, fleet_info = self.fleet_envs.step(actions)
            return obs, reward, terminated, truncated, self._gym_infos(fleet_info)
        # this step is their reset step, which make_vec makes (NextStepReset, ale's NOOP) unless the backend does
        resetting = np.zeros(self.num_envs, bool) if self._backend_next_step else self._reset_next.copy()
        if self._native and resetting.any():
            actions = actions.copy()
            actions[resetting] = NATIVE_HOLD_ACTION
        obs, reward, terminated, truncated, fleet_info = self.fleet_envs.step(actions)
        if self._env_infos:
            return self._next_step_env_infos(obs, reward, terminated, truncated, fleet_info)
        return self._next_step_stats_only(obs, reward, terminated, truncated, fleet_info, resetting)

    def close_extras(self, **kwargs: Any) -> None:
        self.fleet_envs.close()

    def _next_step_env_infos(self, obs, reward, terminated, truncated, fleet_info: dict[str, Any]):
        """NEXT_STEP over Python envs wrapped in NextStepReset: a finished env shows its last observation and its step
        infos; its reset step (the wrapper's) comes as an ordinary step of the next call."""
        finished = fleet_info.get("_final_obs")
        if finished is not None:
            for i in np.flatnonzero(finished):
                obs[i] = fleet_info["final_obs"][i]
        infos: dict[str, Any] = {}
        for i, (step_info, _) in sorted(fleet_info.get("env_infos", {}).items()):  # the reset infos come next step
            infos = self._add_info(infos, step_info or {}, i)
        return obs, reward, terminated, truncated, infos

    def _next_step_stats_only(self, obs, reward, terminated, truncated, fleet_info: dict[str, Any], resetting: np.ndarray):
        """NEXT_STEP over a C++ backend (``resetting`` rows took a NOOP as their reset step on ale; EnvPool's next-step
        mode returns its own reset steps and last observations, and counts no reset step) or a PettingZoo game's rows
        (held by NextStepReset per game): last observations at an end, statistics as the finished rows' step infos."""
        ended_raw = terminated | truncated
        if self._native and resetting.any():  # the NOOP is part of the reset: no reward, no end shown to the caller
            reward = np.where(resetting, 0.0, reward).astype(reward.dtype, copy=False)
            terminated, truncated = terminated & ~resetting, truncated & ~resetting
        self._uncounted += resetting  # the backend counted the reset step into the episode it began
        ended = terminated | truncated
        final = fleet_info.get("_final_obs", np.zeros(self.num_envs, bool)) & ended
        if self._agent_rows is None:
            # a C++ env whose NOOP itself ended an episode (the frame cap) resets again on the next step, unseen
            self._reset_next = ended | (resetting & ended_raw)
            for i in np.flatnonzero(final):
                obs[i] = fleet_info["final_obs"][i]
            live = None
        else:
            live = fleet_info.get("live", np.ones(self.num_envs, bool))
            a = self._agent_rows
            # a game is over when an agent's row ends and is live again at once (its game began anew); an agent that
            # leaves a game that goes on is not live after its end
            over = np.repeat((ended & live).reshape(-1, a).any(axis=1), a)
            for i in np.flatnonzero(over & final):
                obs[i] = fleet_info["final_obs"][i]
            obs[over & ~final] = 0  # rows of agents that had left: zeros, as the game shows them (multiagent.GameEnv)
            live = live & ~over  # no agent acts on the reset step: its action is ignored
            self._reset_next = over
        infos: dict[str, Any] = {}
        has_stats = fleet_info.get("_episode", np.zeros(self.num_envs, bool)) & ended
        for i in range(self.num_envs):
            if has_stats[i]:
                stats = {"r": float(fleet_info["episode"]["r"][i]), "l": int(fleet_info["episode"]["l"][i]) - int(self._uncounted[i])}
                infos = self._add_info(infos, {"episode": stats}, i)
            if has_stats[i] or (self._native and resetting[i] and ended_raw[i]):
                self._uncounted[i] = 0
        if live is not None and not live.all():
            infos["live"], infos["_live"] = live, np.ones(self.num_envs, bool)
        return obs, reward, terminated, truncated, infos

    def _gym_infos(self, fleet_info: dict[str, Any]) -> dict[str, Any]:
        """fleetrl's step info in gymnasium's SAME_STEP form: envs added in index order, as SyncVectorEnv adds them (the
        first env to give a key sets its array's dtype). A PettingZoo game's ``live`` rows pass through, with a mask."""
        env_infos = fleet_info.get("env_infos", {})
        finished = fleet_info.get("_final_obs")
        finished_ids = np.flatnonzero(finished).tolist() if finished is not None else []
        infos: dict[str, Any] = {}
        if "live" in fleet_info:
            infos["live"], infos["_live"] = fleet_info["live"], np.ones(self.num_envs, bool)
        if not env_infos and not finished_ids:
            return infos
        for i in sorted(set(env_infos) | set(finished_ids)):
            step_info, reset_info = env_infos.get(i, (None, None))
            if finished is not None and finished[i]:
                final_obs = fleet_info["final_obs"][i] if self._scalar_obs else fleet_info["final_obs"][i, ...]
                last_info = step_info if self._env_infos else self._stats_only(fleet_info, i)
                infos = self._add_info(infos, {"final_obs": final_obs, "final_info": last_info or {}}, i)
                infos = self._add_info(infos, reset_info or {}, i)
            else:
                infos = self._add_info(infos, step_info or {}, i)
        return infos

    @staticmethod
    def _stats_only(fleet_info: dict[str, Any], i: int) -> dict[str, Any]:
        """A C++ backend's last info of env ``i``: its episode statistics, as fleetrl's EpisodeStats reports them."""
        if "_episode" not in fleet_info or not fleet_info["_episode"][i]:
            return {}
        return {"episode": {"r": float(fleet_info["episode"]["r"][i]), "l": int(fleet_info["episode"]["l"][i])}}

    def _seed_base(self, seed: int | list[int | None] | None) -> int | None:
        """fleetrl's backends seed env ``i`` with ``base + i``; a list of seeds is taken when it says the same."""
        if seed is None or isinstance(seed, (int, np.integer)):
            return None if seed is None else int(seed)
        seeds = list(seed)
        if len(seeds) == self.num_envs and seeds[0] is not None and seeds == list(range(seeds[0], seeds[0] + self.num_envs)):
            return int(seeds[0])
        raise FleetError(f"make_vec's envs are seeded from one int (env i gets seed + i), and reset got the seeds {seeds}. "
                         f"Pass reset(seed=s) for seeds s, s+1, ..., or seed each env inside its env function.")

    def __repr__(self) -> str:
        return f"FleetVectorEnv(backend={self.backend!r}, num_envs={self.num_envs}, autoreset_mode={self.autoreset_mode.name})"


def make_vec(
    env_id_or_env_fns: str | Sequence[Callable[[], gym.Env]],
    num_envs: int | None = None,
    backend: str = "auto",
    *,
    training: bool = True,
    verbose: bool = True,
    env_workers: int | None = None,
    env_threads: int | None = None,
    env_timeout: float | None = 60.0,
    autoreset_mode: str | gym.vector.AutoresetMode = gym.vector.AutoresetMode.NEXT_STEP,
) -> FleetVectorEnv:
    """``num_envs`` envs on one of fleetrl's backends, as a ``gymnasium.vector.VectorEnv``.

    ``env_id_or_env_fns``: an env id, built as ``fleetrl train`` builds it (Atari ids with fleetrl's Atari
    preprocessing: 84x84 gray frames stacked 4, frame skip 4, noop starts, and in ``training`` episodic life and reward
    clipping; ``module:Env-v0`` imports the module), or a list of functions that each return an env, as gymnasium's
    ``SyncVectorEnv`` takes (``num_envs`` may then be left out). ``backend``: ``auto`` (chosen as ``fleetrl train``
    chooses it, the reason printed with ``verbose``), ``sync``, ``async`` (worker processes over shared memory, with
    stepping threads for envs that wait), ``ale`` or ``envpool`` (env ids only). ``env_workers``, ``env_threads``: the
    async backend's worker processes and threads per worker (planned from a measured step when left out).
    ``env_timeout``: seconds an async worker may take for one step before it counts as hung. ``autoreset_mode``: NEXT_STEP
    (gymnasium's default: the step after an episode ends is its reset step, reward 0, no flags, the action ignored) or
    SAME_STEP (the last observation in ``info["final_obs"]``), taken as gymnasium's vector envs take it, so that a
    ``SyncVectorEnv`` call becomes a make_vec call. ``envpool`` runs NEXT_STEP in EnvPool's own next-step autoreset
    (every family: Atari, Procgen, MuJoCo, classic); ``ale`` takes a NOOP as the reset step. A PettingZoo id gives
    ``info["live"]`` (with ``info["_live"]``) on steps where some row holds no live agent: that row's agent has left
    its game, and its action is ignored until the game starts again.

    An env that raises makes ``step``/``reset`` raise in the caller (the async backend restarts nothing here);
    ``close()`` stops every worker process.
    """
    if backend not in MAKE_VEC_BACKENDS:
        raise FleetError(f"make_vec has no backend {backend!r}; choose one of: {', '.join(MAKE_VEC_BACKENDS)}. (For gymnasium's "
                         f"own vector envs, build gymnasium.vector.SyncVectorEnv or AsyncVectorEnv directly.)")
    mode = _autoreset_mode(autoreset_mode)
    if isinstance(env_id_or_env_fns, str):
        return _from_env_id(env_id_or_env_fns, num_envs, backend, training, verbose, env_workers, env_threads, env_timeout, mode)
    return _from_env_fns(list(env_id_or_env_fns), num_envs, backend, verbose, env_workers, env_threads, env_timeout, mode)


def _autoreset_mode(autoreset_mode: str | gym.vector.AutoresetMode) -> gym.vector.AutoresetMode:
    """gymnasium's AutoresetMode from the enum or its value ("next_step"), as SyncVectorEnv takes it; DISABLED refused."""
    try:
        mode = gym.vector.AutoresetMode(autoreset_mode)
    except ValueError:
        mode = None
    if mode not in AUTORESET_MODES:
        raise FleetError(f"make_vec resets envs in gymnasium's AutoresetMode.NEXT_STEP (the default) or SAME_STEP, and "
                         f"autoreset_mode={autoreset_mode!r} was asked. Pass one of those two; for DISABLED (you reset the "
                         f"envs yourself) use gymnasium.vector.SyncVectorEnv.")
    return mode


def _from_env_id(env_id, num_envs, backend, training, verbose, env_workers, env_threads, env_timeout, mode) -> FleetVectorEnv:
    from fleetrl.envs import make_vector_env
    from fleetrl.envs.registry import env_family

    if num_envs is None or num_envs < 1:
        raise FleetError(f"make_vec({env_id!r}, num_envs=...) needs the number of envs (1 or more), got {num_envs}.")
    next_step = mode == gym.vector.AutoresetMode.NEXT_STEP
    family = env_family(env_id, env_timeout)
    # max_restarts=0: an env error reaches the caller, as in gymnasium, instead of a restarted worker
    envs = make_vector_env(env_id, num_envs, backend, training=training, verbose=verbose, max_restarts=0, family=family,
                           env_timeout=env_timeout, env_workers=env_workers, env_threads=env_threads,
                           wrap_env_fn=NextStepEnvFn if next_step else None)
    if next_step and envs.backend == "envpool":
        envs.next_step = True  # EnvPool's own next-step autoreset, set before the first reset
    return FleetVectorEnv(envs, envs.backend, envs.backend_reason, mode)


def _from_env_fns(env_fns, num_envs, backend, verbose, env_workers, env_threads, env_timeout, mode) -> FleetVectorEnv:
    from fleetrl.envs.registry import EnvFamily, read_built
    from fleetrl.envs.spaces import check_same_spaces
    from fleetrl.envs.stepping import check_flags, plan_stepping
    from fleetrl.envs.vector import SyncVectorEnv

    if not env_fns or not all(callable(fn) for fn in env_fns):
        raise FleetError("make_vec takes an env id or a non-empty list of functions that each return an env "
                         "(as gymnasium.vector.SyncVectorEnv takes them).")
    if num_envs is not None and num_envs != len(env_fns):
        raise FleetError(f"make_vec got {len(env_fns)} env functions and num_envs={num_envs}; leave num_envs out with a list "
                         f"of env functions (one env each), or make the list {num_envs} long.")
    if backend in ID_ONLY_BACKENDS:
        raise FleetError(f"The {backend} backend builds its C++ envs from an env id, not from Python env functions: pass the "
                         f"id, make_vec('BreakoutNoFrameskip-v4', num_envs, backend='{backend}'), or use backend='sync', "
                         f"'async' or 'auto' with env functions.")
    n = len(env_fns)
    # the spaces, before any backend is built (gymnasium's AsyncVectorEnv builds one too), bounded as a worker's build
    obs_space, act_space = read_built(env_fns[0], lambda first: (first.observation_space, first.action_space), repr(env_fns[0]), env_timeout)
    _check_array_observations(obs_space)
    check_flags(n, backend, env_workers, env_threads)
    family = EnvFamily("custom", continuous=isinstance(act_space, gym.spaces.Box))
    cores = available_cores()
    reason, cost = "chosen by make_vec's backend argument", None
    if backend == "auto":
        from fleetrl.envs.auto import choose_backend

        choice = choose_backend(FUNCTIONS_NAME, family, n, cores, env_threads=env_threads, env_timeout=env_timeout, make_env=env_fns[0])
        backend, reason, cost = choice.backend, f"auto: {choice.reason}", choice.cost
    if verbose:
        print(f"env backend: {backend} ({reason})", flush=True)
    # the probes above measured the caller's own functions; the backend builds each env with NEXT_STEP's wrapper
    build_fns = [NextStepEnvFn(fn) for fn in env_fns] if mode == gym.vector.AutoresetMode.NEXT_STEP else env_fns
    if backend == "sync":
        envs = SyncVectorEnv(build_fns)
        for i, env in enumerate(envs.envs[1:], start=1):
            try:
                check_same_spaces(i, env, obs_space, act_space)
            except FleetError:
                envs.close()
                raise
        return FleetVectorEnv(envs, backend, reason, mode)
    from fleetrl.envs.shm import SharedMemoryVectorEnv

    plan = plan_stepping(FUNCTIONS_NAME, family, n, cores, cost, env_workers, env_threads, env_timeout=env_timeout,
                         make_env=env_fns[0])
    if verbose:
        print(f"env stepping: {plan.describe()} ({plan.reason})", flush=True)
    envs = SharedMemoryVectorEnv(build_fns, num_workers=plan.workers, threads=plan.threads, max_restarts=0, env_timeout=env_timeout)
    return FleetVectorEnv(envs, backend, reason, mode)


def _check_array_observations(space: gym.Space) -> None:
    """fleetrl's backends keep observations in one array (shared memory for async): Dict, Tuple, Text and other
    structured spaces must be flattened first."""
    if isinstance(space, ARRAY_SPACES):
        return
    raise FleetError(f"make_vec keeps the envs' observations in one array, and the env's observation space is {space}. Wrap "
                     f"each env in gymnasium.wrappers.FlattenObservation (Dict, Tuple, Discrete and Box spaces flatten to one "
                     f"Box), or use gymnasium.vector.SyncVectorEnv for a structured observation.")
