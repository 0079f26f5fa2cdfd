"""Run under torchrun (or alone) by tests/test_distributed.py: advantage normalisation of a float32 batch whose mean is
large against its spread. Each rank normalises its half (alone: the whole batch) and saves it to OUT/rank{R}.pt."""

import sys

import numpy as np
import torch

from fleetrl.distributed import init_distributed

BATCH = 4096


def main(out_dir: str) -> None:
    dist = init_distributed(cuda=False)
    rng = np.random.default_rng(0)  # the same batch on every rank
    advantages = torch.as_tensor(rng.normal(loc=1.0e4, scale=0.5, size=BATCH).astype(np.float32))
    share = BATCH // dist.world_size
    mine = advantages[dist.rank * share : (dist.rank + 1) * share]
    torch.save(dist.normalize(mine), f"{out_dir}/rank{dist.rank}.pt")
    dist.close()


if __name__ == "__main__":
    main(sys.argv[1])
