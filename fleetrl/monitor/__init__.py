"""Monitoring layer: TensorBoard scalars under CleanRL's names, and the progress display."""

from fleetrl.monitor.logger import Logger
from fleetrl.monitor.progress import Progress

__all__ = ["Logger", "Progress"]
