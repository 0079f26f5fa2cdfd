"""CleanRL's prioritised replay (SumSegmentTree, MinSegmentTree, PrioritizedReplayBuffer) is benchmarks/cleanrl/rainbow_atari.py's."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "cleanrl"))
sys.modules[__name__] = __import__("rainbow_atari")
