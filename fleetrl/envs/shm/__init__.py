"""The async backend: env worker processes over shared memory (layout, worker loop, supervisor, the vector env)."""

from fleetrl.envs.shm.vector import SharedMemoryVectorEnv, default_start_method

__all__ = ["SharedMemoryVectorEnv", "default_start_method"]
