"""What one PPO learner step and one acting forward cost on this machine, per precision, memory format and compile.

    python benchmarks/learner_step.py [--repeats 3] [--steps 5] [--threads 2] [--no-compile]

The network is fleetrl's PPO Agent (Nature CNN for Breakout's 4x84x84 frames). A learner step is forward, the PPO loss,
backward and Adam on a minibatch of 256 (CleanRL's Atari defaults: 8 envs x 128 steps / 4 minibatches); acting is a
forward on 8 observations under inference_mode. The settings take turns within each repeat, so load changes hit them
alike; the table gives the median over repeats of each repeat's median step. bf16 is measured everywhere, also where
the CPU only emulates it (auto never picks it there).
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from fleetrl.accel import Accel, native_bf16
from fleetrl.algos.ppo import Agent, Args, ppo_loss
from fleetrl.distributed import Dist

OBS_SHAPE, ACTIONS, MINIBATCH, ACT_BATCH = (4, 84, 84), 4, 256, 8


def make_setting(dtype: torch.dtype, channels_last: bool, compiled: bool):
    torch.manual_seed(0)
    agent = Accel(dtype, channels_last).apply(Agent(OBS_SHAPE, gym.spaces.Discrete(ACTIONS)))
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    loss_fn = torch.compile(ppo_loss) if compiled else ppo_loss
    act = torch.compile(agent.act) if compiled else agent.act
    rng = np.random.default_rng(0)
    mb = {"obs": torch.as_tensor(rng.integers(0, 255, (MINIBATCH, *OBS_SHAPE), dtype=np.uint8)),
          "actions": torch.as_tensor(rng.integers(0, ACTIONS, MINIBATCH)), "logprobs": torch.full((MINIBATCH,), -np.log(ACTIONS)),
          "values": torch.zeros(MINIBATCH), "advantages": torch.randn(MINIBATCH), "returns": torch.randn(MINIBATCH)}
    args = Args(clip_coef=0.1, ent_coef=0.01)

    def learn() -> None:
        loss, _ = loss_fn(agent, mb, args, Dist())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def infer() -> None:
        with torch.inference_mode():
            act(mb["obs"][:ACT_BATCH])

    return learn, infer


def median_seconds(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed learner steps per setting per repeat (acting: 10x)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled settings (each compiles ~15-40 s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = [(d, cl, c) for c in ((False,) if args.no_compile else (False, True)) for d in (torch.float32, torch.bfloat16)
                for cl in (False, True) if not (c and d == torch.bfloat16 and not native_bf16(torch.device("cpu"))[0])]
    fns = {}
    for s in settings:  # build and warm up (compiles here)
        learn, infer = make_setting(*s)
        learn(), learn(), infer(), infer()
        fns[s] = (learn, infer)
    results = {s: ([], []) for s in settings}
    for _ in range(args.repeats):
        for s, (learn, infer) in fns.items():
            results[s][0].append(median_seconds(learn, args.steps))
            results[s][1].append(median_seconds(infer, args.steps * 10))
    base = statistics.median(results[(torch.float32, False, False)][0])
    print(f"torch {torch.__version__}, {args.threads} threads; {native_bf16(torch.device('cpu'))[1]}\n")
    print("| precision | memory format | compiled | learner step, minibatch 256 (ms) | speed-up | acting forward, batch 8 (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (dtype, cl, compiled), (learn_t, infer_t) in results.items():
        learn_ms, infer_ms = statistics.median(learn_t) * 1e3, statistics.median(infer_t) * 1e3
        print(f"| {'bf16' if dtype == torch.bfloat16 else 'fp32'} | {'channels-last' if cl else 'NCHW'} | {'yes' if compiled else 'no'} "
              f"| {learn_ms:.0f} | {base * 1e3 / learn_ms:.2f}x | {infer_ms:.2f} |")


if __name__ == "__main__":
    main()
