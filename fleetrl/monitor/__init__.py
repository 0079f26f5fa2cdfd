"""Monitoring layer: TensorBoard scalars under CleanRL's names, and the progress display."""

from fleetrl.monitor.logger import Logger, TrainResult
from fleetrl.monitor.progress import Progress
from fleetrl.monitor.timing import PhaseTimer

__all__ = ["Logger", "PhaseTimer", "Progress", "TrainResult"]
