"""PQN's update on one minibatch: torch's RAdam against fleetrl.optim.RAdam (the same arithmetic over one flat tensor).

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/radam_step.py --repeats 5

PQN's 120-84 LayerNorm MLP on CartPole's shapes, a minibatch of 128, as pqn.py updates it (zero_grad, backward,
clip_grad_norm_ at 10, step). Prints the CPU time of the optimiser step alone and of the whole update, the median
of ``--repeats`` timings of 1,000 calls each, after checking that the two optimisers leave identical parameters.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from fleetrl import optim
from fleetrl.nets import layernorm_mlp


def timed(fn, calls: int, repeats: int) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e6)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    obs, returns = torch.randn(128, 4, generator=generator) * 3, torch.randn(128, generator=generator) * 10
    def setup(make):
        torch.manual_seed(0)
        net = layernorm_mlp(4, 2)
        opt = make(net.parameters(), lr=2.5e-4)

        def update():
            opt.zero_grad()
            nn.functional.mse_loss(returns, net(obs)[:, 0]).backward()
            nn.utils.clip_grad_norm_(net.parameters(), 10.0)
            opt.step()

        return net, opt, update

    makers = (("torch.optim.RAdam", torch.optim.RAdam), ("fleetrl.optim.RAdam", optim.RAdam))
    checked = []
    for _, make in makers:  # the same 300 updates each: identical parameters
        net, _, update = setup(make)
        for _ in range(300):
            update()
        checked.append(net)
    same = all(torch.equal(a, b) for a, b in zip(*(n.parameters() for n in checked)))
    rows = []
    for name, make in makers:
        _, opt, update = setup(make)
        whole = timed(update, opts.calls, opts.repeats)  # leaves gradients in place for the step alone
        rows.append((name, timed(opt.step, opts.calls, opts.repeats), whole))
    print(f"parameters identical after the same updates: {same}\n")
    print("| optimiser | step alone (µs, median) | whole update (µs, median) |\n| --- | --- | --- |")
    for name, step, update in rows:
        print(f"| {name} | {step:,.0f} | {update:,.0f} |")


if __name__ == "__main__":
    main()
