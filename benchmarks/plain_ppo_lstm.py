"""CleanRL's loops live in benchmarks/cleanrl/loops/ (this one: ppo_lstm.py); the old name stays for the speed scripts."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "cleanrl"))
sys.modules[__name__] = __import__("loops.ppo_lstm", fromlist=["*"])
