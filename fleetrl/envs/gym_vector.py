"""``make_vec``: fleetrl's vector backends as a real ``gymnasium.vector.VectorEnv``, for any script (CleanRL's included).

It is a thin adapter: the backends step the envs, with fleetrl's same-step autoreset, and this module puts their
results in gymnasium 1.x's form, exactly as ``gymnasium.vector.SyncVectorEnv(..., autoreset_mode=SAME_STEP)`` gives
them for the same env functions and seeds (tests/test_make_vec.py checks it step for step):

* ``info["final_obs"]`` is an object array holding each finished env's last observation (None elsewhere), with the
  mask ``info["_final_obs"]``; ``info["final_info"]`` holds the finished envs' last infos, batched, with
  ``info["_final_info"]``. Every other key is the envs' own step infos (or, for an env that was reset, its reset
  infos), batched by gymnasium's own ``VectorEnv._add_info``, each with its ``_key`` mask.
* Episode statistics: an env built from an id carries fleetrl's ``EpisodeStats``, so a finished episode's return and
  length are in ``info["final_info"]["episode"]``, where CleanRL's per-env ``RecordEpisodeStatistics`` puts them.
  ``gymnasium.wrappers.vector.RecordEpisodeStatistics(make_vec(...))`` adds ``info["episode"]`` / ``info["_episode"]``.
* The C++ backends (``ale``, ``envpool``) have no per-env Python infos: their ``final_info`` holds the episode
  statistics only, and their other infos are empty.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.cores import available_cores
from fleetrl.errors import FleetError

MAKE_VEC_BACKENDS = ("auto", "sync", "async", "ale", "envpool")  # gym-sync and gym-async are gymnasium's own classes
ID_ONLY_BACKENDS = ("ale", "envpool")  # their C++ envs are built from an id, never from a Python function
ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
FUNCTIONS_NAME = "env functions"  # how the probes and the printed reason name a list of env functions


class FleetVectorEnv(gym.vector.VectorEnv):
    """One of fleetrl's vector backends behind gymnasium's ``VectorEnv`` interface (same-step autoreset).

    ``backend``: the backend's name; ``backend_reason``: why it was chosen (``auto``'s printed reason). The fleetrl
    backend itself is ``fleet_envs`` (with its ``send``/``recv`` for scripts that want them)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, fleet_envs: Any, backend: str, backend_reason: str):
        self.fleet_envs = fleet_envs
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

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every env; with ``seed`` an int, env ``i`` is seeded ``seed + i`` (as gymnasium's vector envs do)."""
        if options:
            raise FleetError(f"make_vec's envs take no reset options (got {options}): fleetrl's backends reset every env the same "
                             f"way. Pass what varies through the env functions' arguments instead.")
        seed = self._seed_base(seed)
        super().reset(seed=seed)  # seeds the vector's own np_random, as gymnasium's vector envs do
        obs, fleet_info = self.fleet_envs.reset(seed=seed)
        infos: dict[str, Any] = {}
        for i, (_, reset_info) in sorted(fleet_info.get("env_infos", {}).items()):
            infos = self._add_info(infos, reset_info, i)
        return obs, infos

    def step(self, actions: Any):
        obs, reward, terminated, truncated, fleet_info = self.fleet_envs.step(np.asarray(actions))
        return obs, reward, terminated, truncated, self._gym_infos(fleet_info)

    def close_extras(self, **kwargs: Any) -> None:
        self.fleet_envs.close()

    def _gym_infos(self, fleet_info: dict[str, Any]) -> dict[str, Any]:
        """fleetrl's step info in gymnasium's SAME_STEP form: envs added in index order, as SyncVectorEnv adds them (the
        first env to give a key sets its array's dtype)."""
        env_infos = fleet_info.get("env_infos", {})
        finished = fleet_info.get("_final_obs")
        finished_ids = np.flatnonzero(finished).tolist() if finished is not None else []
        if not env_infos and not finished_ids:
            return {}
        infos: dict[str, Any] = {}
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
        return f"FleetVectorEnv(backend={self.backend!r}, num_envs={self.num_envs})"


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
    autoreset_mode: gym.vector.AutoresetMode = gym.vector.AutoresetMode.SAME_STEP,
) -> FleetVectorEnv:
    """``num_envs`` envs on one of fleetrl's backends, as a ``gymnasium.vector.VectorEnv`` with same-step autoreset.

    ``env_id_or_env_fns``: an env id, built as ``fleetrl train`` builds it (Atari ids with fleetrl's Atari
    preprocessing: 84x84 gray frames stacked 4, frame skip 4, noop starts, and in ``training`` episodic life and reward
    clipping; ``module:Env-v0`` imports the module), or a list of functions that each return an env, as gymnasium's
    ``SyncVectorEnv`` takes (``num_envs`` may then be left out). ``backend``: ``auto`` (chosen as ``fleetrl train``
    chooses it, the reason printed with ``verbose``), ``sync``, ``async`` (worker processes over shared memory, with
    stepping threads for envs that wait), ``ale`` or ``envpool`` (env ids only). ``env_workers``, ``env_threads``: the
    async backend's worker processes and threads per worker (planned from a measured step when left out).
    ``env_timeout``: seconds an async worker may take for one step before it counts as hung. ``autoreset_mode``: taken
    as gymnasium's vector envs take it, so that a SyncVectorEnv call becomes a make_vec call; SAME_STEP is the only one.

    An env that raises makes ``step``/``reset`` raise in the caller (the async backend restarts nothing here);
    ``close()`` stops every worker process.
    """
    if backend not in MAKE_VEC_BACKENDS:
        raise FleetError(f"make_vec has no backend {backend!r}; choose one of: {', '.join(MAKE_VEC_BACKENDS)}. (For gymnasium's "
                         f"own vector envs, build gymnasium.vector.SyncVectorEnv or AsyncVectorEnv directly.)")
    if autoreset_mode != gym.vector.AutoresetMode.SAME_STEP:
        raise FleetError(f"make_vec's backends reset an env in the step that ends its episode (AutoresetMode.SAME_STEP), and "
                         f"autoreset_mode={autoreset_mode} was asked. Read the last observation from info['final_obs'] "
                         f"(masked by info['_final_obs']), or use gymnasium.vector.SyncVectorEnv for {autoreset_mode}.")
    if isinstance(env_id_or_env_fns, str):
        return _from_env_id(env_id_or_env_fns, num_envs, backend, training, verbose, env_workers, env_threads, env_timeout)
    return _from_env_fns(list(env_id_or_env_fns), num_envs, backend, verbose, env_workers, env_threads, env_timeout)


def _from_env_id(env_id, num_envs, backend, training, verbose, env_workers, env_threads, env_timeout) -> FleetVectorEnv:
    from fleetrl.envs import make_vector_env

    if num_envs is None or num_envs < 1:
        raise FleetError(f"make_vec({env_id!r}, num_envs=...) needs the number of envs (1 or more), got {num_envs}.")
    # max_restarts=0: an env error reaches the caller, as in gymnasium, instead of a restarted worker
    envs = make_vector_env(env_id, num_envs, backend, training=training, verbose=verbose, max_restarts=0,
                           env_timeout=env_timeout, env_workers=env_workers, env_threads=env_threads)
    return FleetVectorEnv(envs, envs.backend, envs.backend_reason)


def _from_env_fns(env_fns, num_envs, backend, verbose, env_workers, env_threads, env_timeout) -> FleetVectorEnv:
    from fleetrl.envs.registry import EnvFamily
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
    first = env_fns[0]()  # the spaces, before any backend is built (gymnasium's AsyncVectorEnv builds one too)
    try:
        obs_space, act_space = first.observation_space, first.action_space
    finally:
        first.close()
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
    if backend == "sync":
        envs = SyncVectorEnv(env_fns)
        for i, env in enumerate(envs.envs[1:], start=1):
            try:
                check_same_spaces(i, env, obs_space, act_space)
            except FleetError:
                envs.close()
                raise
        return FleetVectorEnv(envs, backend, reason)
    from fleetrl.envs.shm import SharedMemoryVectorEnv

    plan = plan_stepping(FUNCTIONS_NAME, family, n, cores, cost, env_workers, env_threads, env_timeout=env_timeout,
                         make_env=env_fns[0])
    if verbose:
        print(f"env stepping: {plan.describe()} ({plan.reason})", flush=True)
    envs = SharedMemoryVectorEnv(env_fns, num_workers=plan.workers, threads=plan.threads, max_restarts=0, env_timeout=env_timeout)
    return FleetVectorEnv(envs, backend, reason)


def _check_array_observations(space: gym.Space) -> None:
    """fleetrl's backends keep observations in one array (shared memory for async): Dict, Tuple, Text and other
    structured spaces must be flattened first."""
    if isinstance(space, ARRAY_SPACES):
        return
    raise FleetError(f"make_vec keeps the envs' observations in one array, and the env's observation space is {space}. Wrap "
                     f"each env in gymnasium.wrappers.FlattenObservation (Dict, Tuple, Discrete and Box spaces flatten to one "
                     f"Box), or use gymnasium.vector.SyncVectorEnv for a structured observation.")
