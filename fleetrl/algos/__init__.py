"""One readable file per algorithm. Each module exposes ``Args``, ``train`` and ``policy_from_checkpoint``."""

ALGOS = ("ppo",)
