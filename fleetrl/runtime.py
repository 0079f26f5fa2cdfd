"""Process setup shared by the algorithms: device choice, seeding and CPU threads."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch


def pick_device(cuda: bool, warn: bool = True) -> torch.device:
    """CUDA when asked and present; otherwise the CPU, with one warning line if CUDA was asked for."""
    if cuda and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if cuda and warn:
        print("warning: --cuda is on but no CUDA GPU is available; training on the CPU (pass --no-cuda to silence this).", file=sys.stderr)
    return torch.device("cpu")


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def set_torch_threads(threads: int | None, local_world_size: int = 1) -> int:
    """Set intra-op threads explicitly: default cores / processes on this machine (at least 1).

    Two torch processes that each take every core slow each other down several times over.
    """
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // max(local_world_size, 1))
    torch.set_num_threads(threads)
    return threads
