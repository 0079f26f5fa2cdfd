"""Run under torchrun by tests/test_dqn.py: in one 2-rank launch, a DQN run with --save-buffer and then two resumes of
copies of it, each job in the same two processes (as tests/dist_every_algorithm.py runs its jobs: one launch and one torch
import per rank instead of three). Each rank writes its replay buffer as it was at each checkpoint
(``saved_rank{R}_{STEP}.npz``) and as a resume restored it (``restored_rank{R}.npz``, with the step of the checkpoint it
came from) into the job's folder. Usage: dist_replay_check.py OUT TOTAL RESUME_TOTAL FLAGS...

Jobs, each in OUT/NAME (its output in rank{R}.log, its exit status in rank{R}.json):
- ``saved``: ``fleetrl train dqn FLAGS --total-timesteps TOTAL``, its run folder OUT/saved/run. Then rank 0 copies that
  folder to OUT/resumed/run, OUT/torn/run (where it cuts the end off rank 1's shard of the last checkpoint, as if rank 1
  was killed while its node wrote it) and OUT/alone/run (untouched, for the test's own resume under one process).
- ``resumed`` and ``torn``: ``--total-timesteps RESUME_TOTAL --resume auto`` on their copies."""

import datetime
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from fleetrl import checkpoint, offpolicy
from fleetrl.cli import main
from fleetrl.run import Run

buffers = {}
job_folder = {"path": "."}  # where the running job's buffers go
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
    dump(os.path.join(job_folder["path"], f"saved_rank{run.dist.rank}_{global_step}.npz"), buffers[run.dist.rank])
    return path


def dump_after_restore(run):
    restore(run)
    if run.resumed is not None:
        dump(os.path.join(job_folder["path"], f"restored_rank{run.dist.rank}.npz"), buffers[run.dist.rank], step=run.global_step)


offpolicy.make_replay, Run.save_checkpoint, Run.restore = keep_replay, dump_at_save, dump_after_restore


def run_job(folder: Path, rank: int, argv: list[str]) -> None:
    """``fleetrl train dqn ARGV`` on this rank, in this process, its output and exit status recorded in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    job_folder["path"] = str(folder)
    from dist_every_algorithm import exit_code_of

    code = exit_code_of(lambda: main(["train", "dqn", *argv, "--run-dir", str(folder / "run")]), folder / f"rank{rank}.log")
    (folder / f"rank{rank}.json").write_text(json.dumps({"returncode": code}))


def copy_the_saved_run(out: Path) -> None:
    """Rank 0, between the jobs: the resumes' copies of the saved run, rank 1's last shard torn in one of them."""
    for name in ("resumed", "torn", "alone"):
        shutil.copytree(out / "saved" / "run", out / name / "run")
    latest = checkpoint.resolve_checkpoint(str(out / "torn" / "run"))
    shard = next(s["name"] for s in json.loads(checkpoint.manifest_path(latest).read_text())["shards"] if s["rank"] == 1)
    torn = out / "torn" / "run" / "checkpoints" / shard
    torn.write_bytes(torn.read_bytes()[:-100])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from dist_every_algorithm import between_jobs

    out, total, resume_total, flags = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                                       timeout=datetime.timedelta(seconds=300))
    run_job(out / "saved", rank, [*flags, "--total-timesteps", total])
    between_jobs(store, "replay/saved", rank, world_size)
    if rank == 0:
        copy_the_saved_run(out)
        store.set("replay/copied", "1")
    store.wait(["replay/copied"])
    for name in ("resumed", "torn"):
        run_job(out / name, rank, [*flags, "--total-timesteps", resume_total, "--resume", "auto"])
        between_jobs(store, f"replay/{name}", rank, world_size)
