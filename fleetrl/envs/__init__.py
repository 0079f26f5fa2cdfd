"""Environment layer: env id -> family -> construction, and the vector backends behind one interface."""

from __future__ import annotations

from fleetrl.envs.registry import EnvFactory, EnvFamily, env_family, env_spec
from fleetrl.envs.vector import GymSyncVectorEnv, SyncVectorEnv, episode_stats
from fleetrl.errors import FleetError

# name -> constructor taking the list of env factories
BACKENDS = {
    "sync": SyncVectorEnv,  # in-process, envs stepped in turn
    "gym-sync": GymSyncVectorEnv,  # gymnasium's SyncVectorEnv (SAME_STEP), the reference and baseline
}


def make_vector_env(
    env_id: str,
    num_envs: int,
    backend: str = "sync",
    training: bool = True,
    sticky_actions: float | None = None,
    family: EnvFamily | None = None,
):
    """Build ``num_envs`` copies of ``env_id`` behind the vector interface of :mod:`fleetrl.envs.vector`."""
    family = family or env_family(env_id)
    if backend not in BACKENDS:
        raise FleetError(f"Unknown --env-backend {backend!r}; choose one of: {', '.join(BACKENDS)}.")
    factories = [EnvFactory(env_id, family.name, training, sticky_actions) for _ in range(num_envs)]
    return BACKENDS[backend](factories)


__all__ = ["EnvFactory", "EnvFamily", "env_family", "env_spec", "episode_stats", "make_vector_env"]
