"""Run under torchrun by tests/test_distributed.py: a real PPO run of RecordingDrift-v0; at the end each rank saves
the normalisation statistics it holds (rank{RANK}.npz in the folder given), recorded as they are merged.

The only hook is a wrapper that notes each RunningMeanStd's state after fleetrl's own merge_sums ran: the statistics
are the run's, unchanged.
"""

import os
import sys

import numpy as np

from fleetrl.sampling import normalize

held: dict[int, normalize.RunningMeanStd] = {}
merge_sums = normalize.RunningMeanStd.merge_sums


def noting_merge_sums(self, sums):
    merge_sums(self, sums)
    held[id(self)] = self


normalize.RunningMeanStd.merge_sums = noting_merge_sums

def train(out: str, flags: list[str]) -> None:
    """``fleetrl train ppo FLAGS`` in this process; then this rank's statistics go to OUT/rank{RANK}.npz."""
    from fleetrl.cli import main

    try:
        main(["train", "ppo", *flags])
    finally:  # main ends with sys.exit: save on the way out
        stats = {("obs" if rms.mean.shape else "reward") + key: value for rms in held.values()
                 for key, value in (("_mean", rms.mean), ("_var", rms.var), ("_count", np.float64(rms.count)))}
        np.savez(os.path.join(out, f"rank{os.environ['RANK']}.npz"), **stats)


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2:])
