"""Environment layer: env id -> family -> construction, and the vector backends behind one interface."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from fleetrl.cores import available_cores
from fleetrl.envs import atari
from fleetrl.envs.multiagent import AgentRows, is_atari_game
from fleetrl.envs.registry import MULTIAGENT_FAMILIES, EnvFactory, EnvFamily, env_family, env_spec
from fleetrl.envs.stepping import check_flags, plan_stepping
from fleetrl.envs.vector import GymAsyncVectorEnv, GymSyncVectorEnv, SyncVectorEnv, episode_stats
from fleetrl.errors import FleetError

if TYPE_CHECKING:  # the env layer does not import torch at runtime (worker processes import it too)
    from fleetrl.runtime import ThreadPlan

BACKENDS = (
    "auto",  # chosen from the family, the cores and the installed extras (fleetrl/envs/auto.py)
    "sync",  # in-process, envs stepped in turn
    "async",  # fleetrl's worker processes over shared memory, with stepping threads for envs that wait (fleetrl/envs/shm/)
    "ale",  # ale-py's C++ AtariVectorEnv
    "envpool",  # EnvPool's C++ thread pool (Atari, MuJoCo, classic control, Procgen)
    "gym-sync",  # gymnasium's SyncVectorEnv (SAME_STEP), the reference and baseline
    "gym-async",  # gymnasium's AsyncVectorEnv (SAME_STEP): a process per env, the baseline for envs that wait
)


def make_vector_env(
    env_id: str,
    num_envs: int,
    backend: str = "sync",
    training: bool = True,
    sticky_actions: float | None = None,
    family: EnvFamily | None = None,
    async_batch: int | None = None,
    cores: int | None = None,
    verbose: bool = False,
    video_dir: str | None = None,
    every_episode: bool = False,
    threads: ThreadPlan | None = None,
    max_restarts: int = 10,
    env_timeout: float | None = 60.0,
    env_workers: int | None = None,
    env_threads: int | None = None,
    frame_stack: int | None = None,
    wrap_env_fn: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
):
    """Build ``num_envs`` copies of ``env_id`` behind the vector interface of :mod:`fleetrl.envs.vector`.

    ``cores``: the CPU cores this process may use (under torchrun: its share of the machine).
    ``video_dir``: record env 0's episodes there as MP4 (backends that step Python envs: sync, async);
    CleanRL's capped cubic schedule of episodes, or ``every_episode``.
    ``threads``: the run's thread plan (:func:`fleetrl.runtime.plan_threads`); its ``env_workers``
    sets the async backend's worker processes and ale/EnvPool's threads (without a plan: one per
    core of ``cores``, at most one per env). With ``verbose`` the plan is printed after the backend; it is attached to the
    envs as ``thread_plan`` (one line, for the logs).
    ``max_restarts``, ``env_timeout``: the async backend restarts env workers that raise, die or hang
    (longer than ``env_timeout`` s) up to ``max_restarts`` times in all; other backends ignore them.
    ``env_workers``, ``env_threads`` (the flags): the async backend's worker processes and stepping threads per
    worker; left None, they are planned from a measured step (:mod:`fleetrl.envs.stepping`), and the plan is
    attached to the envs as ``stepping`` (None on other backends).
    ``wrap_env_fn``: applied to each env's function before a backend that steps Python envs (sync, async, gym-*) builds
    it (make_vec's NEXT_STEP adapter, fleetrl/envs/gym_vector.py); the C++ backends build no Python env and ignore it.
    """
    family = family or env_family(env_id)
    if backend not in BACKENDS:
        raise FleetError(f"Unknown --env-backend {backend!r}; choose one of: {', '.join(BACKENDS)}.")
    rows = None
    if family.name in MULTIAGENT_FAMILIES:  # --num-envs and --async-batch count agent rows; the backend steps games
        rows = family.agents
        num_envs, async_batch = games_of_rows(env_id, family, num_envs, async_batch, backend)
    cores = cores or available_cores()
    check_flags(num_envs, backend, env_workers, env_threads)
    reason, cost = "chosen with --env-backend", None
    if backend == "auto":
        from fleetrl.envs.auto import choose_backend

        choice = choose_backend(env_id, family, num_envs, cores, need_frames=video_dir is not None, async_batch=async_batch,
                                env_threads=env_threads, env_timeout=env_timeout)
        backend, reason, cost = choice.backend, f"auto: {choice.reason}", choice.cost
        check_flags(num_envs, backend, env_workers, env_threads)
    if video_dir and backend not in ("sync", "async", "gym-sync", "gym-async"):
        raise FleetError(f"--capture-video renders frames from Python envs, which the {backend} backend does not have. "
                         f"Use --env-backend sync or async (or auto) with --capture-video.")
    stepping = None
    if backend == "async":
        stepping = plan_stepping(env_id, family, num_envs, cores, cost, env_workers, env_threads,
                                 per_core_workers=threads.env_workers if threads is not None else None, async_batch=async_batch,
                                 env_timeout=env_timeout)
        workers = stepping.workers
    else:
        workers = min(env_workers or (threads.env_workers if threads is not None else cores), num_envs)
    thread_plan = threads.describe(backend, stepping) if threads is not None else None
    if verbose:
        print(f"env backend: {backend} ({reason})", flush=True)
        if stepping is not None:
            print(f"env stepping: {stepping.describe()} ({stepping.reason})", flush=True)
        if thread_plan:
            print(thread_plan, flush=True)
    envs = _build(env_id, num_envs, backend, training, sticky_actions, family, async_batch, workers, video_dir, every_episode,
                  max_restarts, env_timeout, stepping.threads if stepping is not None else 1, frame_stack or atari.FRAME_STACK,
                  wrap_env_fn)
    envs.backend, envs.backend_reason, envs.thread_plan, envs.stepping = backend, reason, thread_plan, stepping  # logged
    if rows is not None:
        envs = AgentRows(envs, family.agent_names, clip_rewards=is_atari_game(env_id))
    return envs


def games_of_rows(env_id: str, family: EnvFamily, num_envs: int, async_batch: int | None, backend: str) -> tuple[int, int | None]:
    """A PettingZoo game's rows as games: ``--num-envs`` and ``--async-batch`` in whole games, on a backend that steps
    Python envs; else a clear error."""
    a = family.agents
    if backend not in ("auto", "sync", "async"):
        raise FleetError(f"{env_id} is a PettingZoo game, which the sync and async backends step (each agent a row); "
                         f"--env-backend {backend} cannot. Use --env-backend sync, async or auto.")
    for flag, count in (("--num-envs", num_envs), ("--async-batch", async_batch)):
        if count is not None and count % a:
            raise FleetError(f"{flag} {count} counts agent rows, as CleanRL's multi-agent script does, and {env_id} has {a} agents "
                             f"in a game, so it must be a multiple of {a} (whole games): e.g. {flag} {max(a, count - count % a)} "
                             f"or {count - count % a + a}.")
    return num_envs // a, None if async_batch is None else async_batch // a


def _build(env_id, num_envs, backend, training, sticky_actions, family, async_batch, workers, video_dir, every_episode,
           max_restarts=10, env_timeout=60.0, stepping_threads=1, frame_stack=4, wrap_env_fn=None):
    # ``workers``: worker processes (async) or C++ threads (ale, envpool): explicit, so that several
    # training processes on one machine do not each start a thread per core
    if family.name == "procgen" and backend != "envpool":
        raise FleetError(f"{env_id} is a Procgen env, which only EnvPool provides: use --env-backend envpool (or auto).")
    if backend == "ale":
        from fleetrl.envs.native import AleVectorEnv

        if family.name != "atari":
            raise FleetError(f"--env-backend ale runs Atari games only, and {env_id} is a {family.name} env. Use sync, async or auto.")
        return AleVectorEnv(env_id, num_envs, training, sticky_actions, num_threads=workers, async_batch=async_batch,
                            frame_stack=frame_stack)
    if backend == "envpool":
        from fleetrl.envs.native import EnvPoolVectorEnv

        return EnvPoolVectorEnv(env_id, num_envs, family=family.name, training=training, sticky_actions=sticky_actions, num_threads=workers,
                                async_batch=async_batch, frame_stack=frame_stack)
    factories = [EnvFactory(env_id, family.name, training, sticky_actions, video_dir if i == 0 else None, every_episode, frame_stack)
                 for i in range(num_envs)]
    if wrap_env_fn is not None:
        factories = [wrap_env_fn(f) for f in factories]
    if backend == "async":
        from fleetrl.envs.shm import SharedMemoryVectorEnv

        return SharedMemoryVectorEnv(factories, num_workers=workers, async_batch=async_batch, max_restarts=max_restarts,
                                     env_timeout=env_timeout, threads=stepping_threads)
    if backend == "gym-async":
        return GymAsyncVectorEnv(factories)
    return (GymSyncVectorEnv if backend == "gym-sync" else SyncVectorEnv)(factories)


from fleetrl.envs.gym_vector import make_vec  # noqa: E402  (fleetrl's backends as a gymnasium VectorEnv, for any script)

__all__ = ["BACKENDS", "EnvFactory", "EnvFamily", "env_family", "env_spec", "episode_stats", "make_vec", "make_vector_env"]
