"""The async backend: env worker processes over shared memory (layout, worker loop, supervisor, the vector env)."""

from fleetrl.envs.shm.vector import SharedMemoryVectorEnv

__all__ = ["SharedMemoryVectorEnv"]
