"""Monitoring layer: TensorBoard scalars under CleanRL's names, phase timing, resources, the progress display."""

from fleetrl.monitor.logger import Logger, TrainResult
from fleetrl.monitor.progress import Progress
from fleetrl.monitor.resources import ResourceSampler, describe_usage
from fleetrl.monitor.timing import PhaseTimer

__all__ = ["Logger", "PhaseTimer", "Progress", "ResourceSampler", "TrainResult", "describe_usage"]
