"""Run like ``python -m fleetrl train dqn ...`` (under torchrun, or alone), writing each rank's replay buffer to OUT as it
was at each checkpoint (``saved_rank{R}_{STEP}.npz``) and as a resume restored it (``restored_rank{R}.npz``, with the
step of the checkpoint it came from). Usage: dist_replay_check.py OUT train dqn FLAGS..."""

import os
import sys

import numpy as np
import torch

from fleetrl import offpolicy
from fleetrl.cli import main
from fleetrl.run import Run

OUT = sys.argv[1]
buffers = {}
make_replay, save_checkpoint, restore = offpolicy.make_replay, Run.save_checkpoint, Run.restore


def dump(path: str, rb, **extra) -> None:
    state = rb.state_dict()
    arrays = {k: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in state.items() if not isinstance(v, list)}
    for k, v in state.items():
        if isinstance(v, list):  # per-env frame rings
            arrays.update({f"{k}_{i}": t.numpy() for i, t in enumerate(v)})
    np.savez(path, length=len(rb), **arrays, **{k: np.asarray(v) for k, v in extra.items()})


def keep_replay(run, envs):
    buffers[run.dist.rank] = rb = make_replay(run, envs)
    return rb


def dump_at_save(run, global_step, iteration):
    path = save_checkpoint(run, global_step, iteration)
    dump(os.path.join(OUT, f"saved_rank{run.dist.rank}_{global_step}.npz"), buffers[run.dist.rank])
    return path


def dump_after_restore(run):
    restore(run)
    if run.resumed is not None:
        dump(os.path.join(OUT, f"restored_rank{run.dist.rank}.npz"), buffers[run.dist.rank], step=run.global_step)


offpolicy.make_replay, Run.save_checkpoint, Run.restore = keep_replay, dump_at_save, dump_after_restore

if __name__ == "__main__":
    main(sys.argv[2:])
