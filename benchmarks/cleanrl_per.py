"""CleanRL's prioritised replay: SumSegmentTree, MinSegmentTree and PrioritizedReplayBuffer (n-step returns) of
``cleanrl/rainbow_atari.py`` at vwxyzjn/cleanrl commit fe8d8a03c41a7ef5b523e2e354bd01c363e786bb, imported from the one
copy of that file here, benchmarks/cleanrl/rainbow_atari.py (its classes verbatim; MIT License, Copyright (c) 2019
CleanRL developers, benchmarks/cleanrl/upstream/LICENSE).

The reference that tests/test_prioritized_replay.py and benchmarks/prioritized_replay.py compare fleetrl's sum tree and
prioritised replay buffer with (priorities, sampled slots and importance weights), and that the Rainbow lockstep
(benchmarks/rainbow_vs_cleanrl.py) runs beside fleetrl's loop.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "cleanrl"))
from rainbow_atari import MinSegmentTree, PrioritizedBatch, PrioritizedReplayBuffer, SumSegmentTree  # noqa: E402

__all__ = ["MinSegmentTree", "PrioritizedBatch", "PrioritizedReplayBuffer", "SumSegmentTree"]
