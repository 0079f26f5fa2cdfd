"""How fast SAC and TD3 could go on this CPU: the arithmetic of one learning step against what the CPU's matrix
multiply reaches, so a speed target can be checked against the machine before anyone chases it.

    python benchmarks/offpolicy_ceiling.py                      # SAC and TD3 on HalfCheetah-v5 (~1 min)
    python benchmarks/offpolicy_ceiling.py --algos sac,td3,dqn --plain-sps sac=87 td3=149

What it measures:
* FLOPs per learning step: torch's FlopCounterMode over a short fleetrl run (CleanRL's defaults), divided by the
  steps that learned. Matrix multiplies only (the elementwise ops are not counted, so the ceiling is generous).
* The matrix multiply's throughput: a 256 x 256 x 256 float32 matmul (the critics' hidden layer at batch 256), with
  1 thread and with every core, the fastest of 5 timings (the machine's load only lowers it).
* The ceiling: the SPS if every step's FLOPs ran at that throughput, with nothing else (env, Python, elementwise ops,
  the optimiser) taking any time. With ``--plain-sps`` (the plain CleanRL loop's SPS, from offpolicy_speed.py), the
  share of that throughput a 2x target would need.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

ENVS = {"sac": "HalfCheetah-v5", "td3": "HalfCheetah-v5", "dqn": "CartPole-v1"}
LEARNING_STEPS = 200  # learning steps counted (the run is learning_starts + this)


def flops_per_step(algo: str) -> float:
    module = importlib.import_module(f"fleetrl.algos.{algo}")
    learning_starts = 1_000
    counter = FlopCounterMode(display=False)
    with tempfile.TemporaryDirectory() as runs, counter:
        module.train(module.Args(env_id=ENVS[algo], total_timesteps=learning_starts + LEARNING_STEPS, learning_starts=learning_starts,
                                 seed=1, run_dir=os.path.join(runs, "run"), progress=False))
    return counter.get_total_flops() / LEARNING_STEPS


def matmul_gflops(threads: int, size: int = 256, repeats: int = 2_000) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(100):
        a @ b
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        timings.append((time.perf_counter() - start) / repeats)
    return 2 * size**3 / min(timings) / 1e9  # the fastest timing: a ceiling is a best case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="sac,td3")
    parser.add_argument("--plain-sps", nargs="*", default=[], metavar="ALGO=SPS", help="the plain loop's SPS, for the 2x column")
    opts = parser.parse_args()
    plain = {k: float(v) for k, v in (item.split("=", 1) for item in opts.plain_sps)}
    cores = os.cpu_count() or 1
    flops = {algo: flops_per_step(algo) for algo in opts.algos.split(",")}
    peak = {1: matmul_gflops(1), cores: matmul_gflops(cores)}
    torch.set_num_threads(cores)

    print(f"\n## Off-policy compute ceiling (benchmarks/offpolicy_ceiling.py)\n\n{cores} cores; torch {torch.__version__}; "
          f"256x256x256 fp32 matmul: {peak[1]:.0f} GFLOP/s on 1 thread, {peak[cores]:.0f} on {cores}\n")
    print("| algorithm | env | matmul GFLOP per learning step | ceiling SPS (1 thread / all cores) | plain SPS | 2x plain needs |")
    print("| --- | --- | --- | --- | --- | --- |")
    for algo, f in flops.items():
        ceiling = [peak[t] * 1e9 / f for t in (1, cores)]
        need = ""
        if algo in plain:
            share = 2 * plain[algo] * f / (peak[cores] * 1e9)
            need = f"{2 * plain[algo]:.0f} SPS: {share:.0%} of the {cores}-core matmul peak, every cycle"
        print(f"| {algo.upper()} | {ENVS[algo]} | {f / 1e9:.3f} | {ceiling[0]:,.0f} / {ceiling[1]:,.0f} | {plain.get(algo, '-')} | {need or '-'} |")


if __name__ == "__main__":
    main()
