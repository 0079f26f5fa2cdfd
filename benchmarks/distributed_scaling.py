"""Weak scaling of data-parallel PPO under torchrun on this machine's CPUs.

    python benchmarks/distributed_scaling.py [--env-id BreakoutNoFrameskip-v4] [--iterations 6] [--repeats 3] [--cuda]

1 process x 1 thread against N processes x 1 thread each (torchrun, gloo), with the same work per
process (--envs-per-process envs x 128 steps), the `sync` env backend pinned so that no native
thread pool already fills the cores in the baseline. SPS is the median over iterations (the first
left out) of charts/SPS_window; the all-reduce time is perf/comm_time as a share of each update
(perf/learn_time + perf/comm_time). Efficiency = SPS(N) / (N x SPS(1)).

With --cuda every process trains on the GPU(s): on a one-GPU machine this is 1 process against N
processes sharing that GPU (gloo, which NCCL cannot do; see docs/distributed.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from fleetrl.monitor.tbread import read_scalars


def run(processes: int, args, out: str) -> dict[str, float]:
    envs = args.envs_per_process * processes
    total = args.iterations * envs * args.num_steps
    train = ["-m", "fleetrl", "train", "ppo", "--env-id", args.env_id, "--num-envs", str(envs), "--num-steps", str(args.num_steps),
             "--total-timesteps", str(total), "--env-backend", "sync", "--torch-threads", "1",
             "--cuda" if args.cuda else "--no-cuda", "--no-progress",
             "--checkpoint-every", "100000", "--run-dir", out]
    if processes == 1:
        cmd = [sys.executable, *train]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *train]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({processes} processes):\n{proc.stderr[-3000:]}")
    sps = [p.value for p in read_scalars(out, "charts/SPS_window")][1:]
    learn = [p.value for p in read_scalars(out, "perf/learn_time")][1:]
    comm = [p.value for p in read_scalars(out, "perf/comm_time")][1:] or [0.0] * len(learn)
    return {"sps": statistics.median(sps), "comm_share_of_update": statistics.median(c / (c + l) for c, l in zip(comm, learn))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--envs-per-process", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda", action="store_true", help="train on the GPU(s) (the processes share them)")
    args = parser.parse_args()
    if args.cuda and not torch.cuda.is_available():
        raise SystemExit("--cuda: no CUDA GPU is available here (or this torch build has no CUDA).")
    results: dict[int, list[dict[str, float]]] = {1: [], args.processes: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for n in results:
                results[n].append(run(n, args, os.path.join(tmp, f"p{n}_r{r}")))
    one = statistics.median(x["sps"] for x in results[1])
    many = statistics.median(x["sps"] for x in results[args.processes])
    comm = statistics.median(x["comm_share_of_update"] for x in results[args.processes])
    where = f"on {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}" if args.cuda else "on the CPU"
    print(f"\nPPO {args.env_id}, {args.envs_per_process} envs x {args.num_steps} steps per process, sync backend, 1 torch thread "
          f"per process, {os.cpu_count()} CPU cores, learner {where}, median of {args.repeats} repeats\n")
    print("| processes | SPS (median) | SPS (repeats) | all-reduce share of update | weak-scaling efficiency |")
    print("| --- | --- | --- | --- | --- |")
    def repeats(n: int) -> str:
        return ", ".join(f"{x['sps']:,.0f}" for x in results[n])

    print(f"| 1 | {one:,.0f} | {repeats(1)} | - | 1.00 |")
    print(f"| {args.processes} | {many:,.0f} | {repeats(args.processes)} | {100 * comm:.1f}% | {many / (args.processes * one):.2f} |")


if __name__ == "__main__":
    main()
