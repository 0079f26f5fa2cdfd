"""What starting the learner process (``--policy-lag 1``) costs the trainer, by start method: fleetrl's forkserver
against fork (what fleetrl did before; unsafe in a process that runs threads) and spawn.

    python benchmarks/learner_start.py                  # DQN's CartPole network and Atari's Nature CNN, 5 repeats each
    python benchmarks/learner_start.py --repeats 3 --nets mlp --setup-seconds 3

Each measurement runs in a fresh process, as a training run does: it builds the network and its Adam optimiser and runs
torch once (a trainer's threads exist before its learner starts), then times what the trainer waits for:

* "constructor": ``Learner(...)`` (the learner process starts here; with forkserver this includes starting the server
  once per process, which a run on the async env backend has done already for its env workers);
* "first update": the first call (the learner gets its state) through ``sync()`` (the update done, the state fetched),
  less the same with the learner running, when the first call comes right after the constructor ("at once": the
  learner's boot is all waited for) or ``--setup-seconds`` later (a run sets up and fills its buffer in between: DQN's
  10,000 random CartPole steps take a few seconds, Atari's 80,000 several minutes).

Run from a checkout before the forkserver (``--methods fork``), the first call forked the learner, which inherited its
state; here every method sends the state as one pickle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
METHODS = ("fork", "forkserver", "spawn")

MEASURE = r"""
import json, sys, time
import torch
from fleetrl import learner as learner_module
from fleetrl.algos.dqn import QNetwork

method, net, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
if hasattr(learner_module, "processes"):  # a checkout from before the forkserver always forks (``--methods fork``)
    learner_module.processes.context = (lambda real: lambda: real(method))(learner_module.processes.context)
torch.set_num_threads(2)
shape = (4,) if net == "mlp" else (4, 84, 84)
q = QNetwork(shape, 2)
optimizer = torch.optim.Adam(q.parameters(), lr=1e-4)
batch = torch.zeros((32, *shape), dtype=torch.float32 if net == "mlp" else torch.uint8)

def update(x):
    loss = q(x).float().mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    return {"loss": loss.detach()}

q(batch).sum().backward()  # a trainer has run torch (and its thread pool) before its learner starts
optimizer.zero_grad()
t0 = time.perf_counter()
learner = learner_module.Learner([update], acting=q, owned={"q": q, "optimizer": optimizer}, lag=1, device="cpu")
constructor = time.perf_counter() - t0
time.sleep(pause)
t0 = time.perf_counter(); learner(update, batch); learner.sync(); first = time.perf_counter() - t0
t0 = time.perf_counter(); learner(update, batch); learner.sync(); steady = time.perf_counter() - t0
learner.close()
print(json.dumps({"constructor": constructor, "first": first - steady}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nets", default="mlp,cnn", help="mlp (DQN's CartPole network), cnn (the Nature CNN)")
    parser.add_argument("--methods", default=",".join(METHODS), help="start methods to measure")
    parser.add_argument("--setup-seconds", type=float, default=5.0, help="between the constructor and the first update")
    opts = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    print(f"{ROOT}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of {opts.repeats} fresh processes (min-max)")
    print(f"| network | start method | constructor (s) | first update at once (s) | first update {opts.setup_seconds:g} s later (s) |")
    print("|---|---|---|---|---|")
    for net in opts.nets.split(","):
        for method in opts.methods.split(","):
            runs: dict[str, list[float]] = {"constructor": [], "at once": [], "later": []}
            for _ in range(opts.repeats):
                for pause, column in ((0.0, "at once"), (opts.setup_seconds, "later")):
                    proc = subprocess.run([sys.executable, "-c", MEASURE, method, net, str(pause)], capture_output=True, text=True,
                                          env=env, timeout=300)
                    if proc.returncode:
                        sys.exit(f"{method} {net} failed:\n{proc.stderr[-2000:]}")
                    measured = json.loads(proc.stdout.strip().splitlines()[-1])
                    runs[column].append(measured["first"])
                    runs["constructor"].append(measured["constructor"])
            cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in runs.values()]
            print(f"| {net} | {method} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
