"""CleanRL's Rainbow networks: NoisyLinear and NoisyDuelingDistributionalNetwork of ``cleanrl/rainbow_atari.py`` at
vwxyzjn/cleanrl commit fe8d8a03c41a7ef5b523e2e354bd01c363e786bb, imported from the one copy of that file here,
benchmarks/cleanrl/rainbow_atari.py (its classes verbatim; MIT License, Copyright (c) 2019 CleanRL developers,
benchmarks/cleanrl/upstream/LICENSE). Its replay buffer is benchmarks/cleanrl_per.py.

What tests/test_rainbow.py and benchmarks/rainbow_vs_cleanrl.py compare fleetrl's Rainbow with: its initial weights,
noise and outputs, and (with an MLP trunk in place of the CNN, benchmarks/rainbow_vs_cleanrl.py) its update, step by step.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "cleanrl"))
from rainbow_atari import NoisyDuelingDistributionalNetwork, NoisyLinear  # noqa: E402

__all__ = ["NoisyDuelingDistributionalNetwork", "NoisyLinear"]
