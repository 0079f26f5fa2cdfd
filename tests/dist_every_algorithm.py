"""Run under torchrun by tests/test_every_algorithm.py: one 2-rank job that runs every check in turn in the same two
processes (each algorithm's training through fleetrl's CLI, and the compute layer's checks), so the suite pays one
launch and one torch import per rank instead of one job each. Usage: dist_every_algorithm.py OUT [NAME ...]

Each job joins the process group and leaves it, as a run does. Between jobs the ranks meet in torchrun's own store, and
rank 0 removes its round's announcement there (fleetrl.distributed.ROUND_STORE_KEY): else the next job's rank 1 would
read the last job's and connect to a round that has ended. Each job's output goes to OUT/NAME/rank{R}.log and its exit
status to OUT/NAME/rank{R}.json; the test reads them with the run folders and asserts what each check proves."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

CARTPOLE = ["--env-id", "CartPole-v1", "--no-cuda"]
OFF_POLICY_SHORT = [*CARTPOLE, "--env-backend", "sync", "--no-progress", "--learning-starts", "1000", "--buffer-size", "2000"]
# 600 steps: 100 updates after learning starts (50 policy updates, the target nets moved after each), where one unsynced
# gradient would part the replicas' bits at once
PENDULUM = ["--env-id", "InvertedPendulum-v5", "--no-cuda", "--env-backend", "sync", "--num-envs", "2", "--total-timesteps", "600",
            "--learning-starts", "400", "--batch-size", "64"]
ON_POLICY_SMALL = [*CARTPOLE, "--env-backend", "sync", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"]

# each algorithm's training under 2 ranks: `fleetrl train` plus these flags (the run folder is added)
TRAIN: dict[str, list[str]] = {
    # the default backend: every env step of both ranks lands in a logged episode
    "ppo": ["ppo", *CARTPOLE, "--total-timesteps", str(4 * 512)],
    "ppo_trxl": ["ppo_trxl", "--env-id", "ProofofMemory-v0", "--no-cuda", "--env-backend", "sync", "--num-envs", "4", "--num-steps", "32",
                 "--num-minibatches", "2", "--trxl-num-layers", "1", "--trxl-num-heads", "1", "--trxl-dim", "32", "--total-timesteps", str(2 * 128)],
    "ppo_lstm": ["ppo_lstm", "--env-id", "CartPoleNoVel-v1", "--no-cuda", "--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2",
                 "--total-timesteps", "128"],  # 2 iterations: the LSTM's state crosses an iteration's end
    "ppo_rnd": ["ppo_rnd", *ON_POLICY_SMALL, "--num-iterations-obs-norm-init", "2", "--total-timesteps", str(4 * 128)],
    "ppg": ["ppg", *ON_POLICY_SMALL, "--n-iteration", "2", "--e-auxiliary", "2", "--num-aux-rollouts", "4",
            "--total-timesteps", str(4 * 128)],
    "pqn": ["pqn", *ON_POLICY_SMALL, "--no-progress", "--precision", "fp32", "--total-timesteps", str(4 * 128)],
    # 2400 steps: each rank's 1000-transition shard wraps (1200 steps each), 140 updates, 7 target copies
    "dqn": ["dqn", *OFF_POLICY_SHORT, "--num-envs", "2", "--batch-size", "64", "--target-network-frequency", "200", "--total-timesteps", "2400"],
    # 50 updates after learning starts, target copies at 600 and 800
    "c51": ["c51", *OFF_POLICY_SHORT, "--num-envs", "2", "--batch-size", "64", "--target-network-frequency", "200", "--total-timesteps", "1000",
            "--learning-starts", "500"],
    # 70 updates after learning starts, and the target copy at 1000 (C51's classic cadence, 500)
    "rainbow": ["rainbow", *OFF_POLICY_SHORT, "--num-envs", "2", "--total-timesteps", "1200", "--learning-starts", "500", "--batch-size", "32"],
    # 50 updates and the target copy at step 500
    "sac_discrete": ["sac_discrete", *CARTPOLE, "--env-backend", "sync", "--num-envs", "2", "--total-timesteps", "600",
                     "--learning-starts", "400", "--batch-size", "64"],
    "sac": ["sac", *PENDULUM],
    "td3": ["td3", *PENDULUM],
    "ddpg": ["ddpg", *PENDULUM],
}
# a multi-agent game (tests/fleetrl_test_games) whose agents share PPO's parameters, and its rows' refusal
LEAVE_EARLY = ["--env-id", "fleetrl_test_games.leave_early", "--no-cuda", "--env-backend", "sync"]
MULTIAGENT: dict[str, list[str]] = {
    "ma_ppo": ["ppo", *LEAVE_EARLY, "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", str(4 * 128)],
}
# refused by every rank, said by one: `fleetrl train` plus these flags
REFUSED: dict[str, list[str]] = {
    "bad_flag": ["ppo", *CARTPOLE, "--num-envs", "4", "--num-minibatches", "7"],
    "ma_bad_rows": ["ppo", *LEAVE_EARLY, "--num-envs", "6", "--total-timesteps", "4096"],
}
# the compute layer's own checks (tests/dist_*_check.py, test_grad_sync.worker), run in the same job
CHECKS = ["grad", "adv_norm", "grad_sync", "norm"]
NORM_TRAIN = ["--env-id", "fleetrl_test_envs:RecordingDrift-v0", "--env-backend", "sync", "--num-envs", "4", "--num-steps", "50",
              "--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "400", "--no-cuda"]
JOBS = [*REFUSED, *CHECKS, *TRAIN, *MULTIAGENT]


def run_job(name: str, folder: Path) -> None:
    """One job on this rank, in this process; raises or exits (SystemExit) as the job does."""
    if name in TRAIN or name in REFUSED or name in MULTIAGENT:
        from fleetrl.cli import main

        main(["train", *(TRAIN.get(name) or MULTIAGENT.get(name) or REFUSED[name]), "--run-dir", str(folder / "run")])
    elif name == "grad":
        import dist_grad_check

        dist_grad_check.main(str(folder))
    elif name == "adv_norm":
        import dist_adv_norm_check

        dist_adv_norm_check.main(str(folder))
    elif name == "grad_sync":
        import test_grad_sync

        from fleetrl import distributed

        bucket_bytes = distributed.BUCKET_BYTES
        try:
            test_grad_sync.worker()  # it makes the buckets small: the next jobs get the engine's own
        finally:
            distributed.BUCKET_BYTES = bucket_bytes
    elif name == "norm":
        (folder / "records").mkdir(exist_ok=True)
        os.environ["FLEETRL_RECORD_DIR"] = str(folder / "records")
        import dist_norm_check  # its import notes each statistics' merge, for this job only

        from fleetrl.sampling import normalize

        try:
            dist_norm_check.train(str(folder), [*NORM_TRAIN, "--run-dir", str(folder / "run")])
        finally:
            normalize.RunningMeanStd.merge_sums = dist_norm_check.merge_sums
            os.environ.pop("FLEETRL_RECORD_DIR")
    else:
        raise SystemExit(f"no job named {name!r}; the jobs are {', '.join(JOBS)}")


def between_jobs(store, name: str, rank: int, world_size: int) -> None:
    """Every rank has left ``name``'s group; then rank 0 removes the round's announcement, and the ranks go on together."""
    from fleetrl.distributed import ROUND_STORE_KEY

    store.add(f"every_algorithm/{name}/left", 1)
    while int(store.add(f"every_algorithm/{name}/left", 0)) < world_size:
        time.sleep(0.05)
    if rank == 0:
        store.delete_key(ROUND_STORE_KEY)
        store.set(f"every_algorithm/{name}/cleared", "1")
    store.wait([f"every_algorithm/{name}/cleared"])


def exit_code_of(job: Callable[[], object], log: Path) -> int:
    """Run ``job`` here with its output in ``log``, and give the exit status a process of its own would have had (a
    traceback is logged). The next job may run after it: a job that failed inside its process group leaves it."""
    import torch.distributed as dist

    with open(log, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            job()
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:  # noqa: BLE001 - recorded for the test, and the next job still runs
            traceback.print_exc()
            return 1
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


def main(out: str, names: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=300))
    for name in names or JOBS:
        folder = Path(out) / name
        folder.mkdir(parents=True, exist_ok=True)
        log, began = folder / f"rank{rank}.log", time.perf_counter()
        default_dtype = torch.get_default_dtype()
        try:
            code = exit_code_of(lambda: run_job(name, folder), log)
        finally:
            torch.set_default_dtype(default_dtype)  # dist_grad_check computes in float64
        (folder / f"rank{rank}.json").write_text(json.dumps({"returncode": code, "seconds": round(time.perf_counter() - began, 1)}))
        between_jobs(store, name, rank, world_size)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1], sys.argv[2:])
