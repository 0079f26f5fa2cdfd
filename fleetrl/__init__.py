"""fleetrl: fast, distributed deep RL training with CleanRL-readable algorithms."""

__version__ = "0.1.0"
