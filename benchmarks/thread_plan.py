"""The measurements behind the thread plan (fleetrl/runtime.py): PPO SPS for torch threads x env workers on this machine.

    python benchmarks/thread_plan.py [--repeats 3] [--only cartpole,busy,breakout-ale,breakout-async,overlap,omp] [--torch 1,2] [--workers 1,2]

Each PPO run is its own process (threads are set per process): CleanRL's shapes, a few iterations, the first left
out. The runs alternate within each repeat, so load from other jobs spreads over all of them; each run records
the cores other processes kept busy just before it started (``fleetrl.runtime.busy_cores_elsewhere``). ``overlap`` emulates
``--policy-lag 1`` until the sampler lands: a thread steps ale Breakout x8 and acts with the Nature CNN while the main
thread trains it, and the SPS an iteration would reach is computed from both rates. ``omp`` times one Nature CNN
minibatch (256) and one acting call (8) with 1 and 2 threads, OpenMP's default wait policy against
``OMP_WAIT_POLICY=PASSIVE`` (read when torch loads, so each is its own process). Prints markdown tables: the median,
all runs, and which row the thread plan picks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # run from a checkout

RESULT_MARKER = "THREAD_PLAN_RESULT "
BUSY_ENV = "ppo_speed_envs:BusyWait200us-v0"  # benchmarks/ppo_speed_envs.py: a 200 us pure-Python step


@dataclass(frozen=True)
class Config:
    group: str
    env_id: str
    backend: str
    num_envs: int
    iterations: int  # the first is left out
    torch_threads: int
    workers: int  # async worker processes, or ale's C++ threads; unused by sync

    @property
    def label(self) -> str:
        env_side = "-" if self.backend == "sync" else str(self.workers)
        return f"| {self.group} | {self.backend} | {self.torch_threads} | {env_side} |"


def configs() -> list[Config]:
    out = [Config("cartpole", "CartPole-v1", "sync", 4, 12, t, 1) for t in (1, 2)]
    for group, env_id, backend, n, iters in [("busy", BUSY_ENV, "async", 8, 8),
                                             ("breakout-ale", "BreakoutNoFrameskip-v4", "ale", 8, 2),
                                             ("breakout-async", "BreakoutNoFrameskip-v4", "async", 8, 2)]:
        out += [Config(group, env_id, backend, n, iters, t, w) for t in (1, 2) for w in (1, 2)]
    return out


# ============================================================================ one PPO run (the subprocess)
def run_child(config: Config) -> None:
    import fleetrl.algos.ppo as ppo
    import fleetrl.run as run
    from fleetrl.runtime import busy_cores_elsewhere, plan_threads

    busy = busy_cores_elsewhere(1.0)
    plan = replace(plan_threads(num_envs=config.num_envs), env_workers=config.workers)
    make = run.make_vector_env
    run.make_vector_env = lambda *a, **k: make(*a, **{**k, "threads": plan})  # the env side of this row (the session builds the envs)
    with tempfile.TemporaryDirectory(prefix="thread_plan_") as tmp:
        args = ppo.Args(env_id=config.env_id, env_backend=config.backend, num_envs=config.num_envs, torch_threads=config.torch_threads,
                        run_dir=os.path.join(tmp, "run"), progress=False, checkpoint_every=10**9, cuda=False)
        args.total_timesteps = config.iterations * config.num_envs * 128  # num_steps: CleanRL's 128 for both families
        result = ppo.train(args)
    print(RESULT_MARKER + json.dumps({"iteration_seconds": result.iteration_seconds, "batch": config.num_envs * 128, "busy": busy}),
          flush=True)


def measure(config: Config) -> tuple[float, float]:
    """(SPS, cores busy with other processes just before the run)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(config.__dict__)],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{config}: exit code {proc.returncode}\n{proc.stderr[-2000:]}")
    out = json.loads(lines[-1][len(RESULT_MARKER):])
    seconds = out["iteration_seconds"][1:]  # the first iteration warms up the kernels
    return out["batch"] * len(seconds) / sum(seconds), out["busy"]


# ============================================================================ --policy-lag 1, emulated
def overlap(torch_threads: int, seconds: float) -> dict[str, float]:
    """Iteration SPS of Breakout x8 x 128 steps when sampling (ale + acting) runs beside learning (4 epochs x 4 minibatches
    of 256), from the rates each side reaches while the other runs; and serially, from each side alone."""
    import numpy as np
    import torch

    from fleetrl.algos.ppo import Agent
    from fleetrl.envs import make_vector_env
    from fleetrl.runtime import plan_threads

    torch.set_num_threads(torch_threads)
    envs = make_vector_env("BreakoutNoFrameskip-v4", 8, "ale", threads=plan_threads(num_envs=8))
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    learner = Agent(envs.single_observation_space.shape, envs.single_action_space)
    optimizer = torch.optim.Adam(learner.parameters(), lr=2.5e-4, eps=1e-5)
    batch = torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (256,))
    stop = threading.Event()
    counts = {"env_steps": 0, "minibatches": 0}

    last = {"obs": envs.reset(seed=0)[0]}  # reset once: ALE's reset of 8 games takes about a second here

    def sample() -> None:
        obs = last["obs"]
        while not stop.is_set():
            with torch.no_grad():
                action, _, _ = agent.act(torch.from_numpy(np.asarray(obs)).float() / 255.0)
            obs, *_ = envs.step(action.numpy())
            counts["env_steps"] += 8
        last["obs"] = obs

    def learn() -> None:
        while not stop.is_set():
            logprob, entropy, value = learner.evaluate({"obs": batch.float() / 255.0, "actions": actions})
            loss = -(logprob.mean() + 0.01 * entropy.mean()) + 0.5 * value.pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            counts["minibatches"] += 1

    def rates(*jobs) -> tuple[float, float]:
        def run_for(duration: float) -> float:
            threads = [threading.Thread(target=job) for job in jobs]
            start = time.perf_counter()
            for t in threads:
                t.start()
            time.sleep(duration)
            stop.set()
            for t in threads:
                t.join()
            stop.clear()
            return time.perf_counter() - start

        run_for(0.5)  # warm-up: kernels and the env threads
        counts.update(env_steps=0, minibatches=0)
        elapsed = run_for(seconds)
        return counts["env_steps"] / elapsed, counts["minibatches"] / elapsed

    try:
        steps_alone, _ = rates(sample)
        _, mbs_alone = rates(learn)
        steps_beside, mbs_beside = rates(sample, learn)
    finally:
        envs.close()
    if not (steps_alone and mbs_alone and steps_beside and mbs_beside):
        raise RuntimeError(f"a side made no progress in {seconds} s (env steps/s alone {steps_alone:.0f}, beside {steps_beside:.0f}; "
                           f"minibatches/s alone {mbs_alone:.2f}, beside {mbs_beside:.2f}); raise --overlap-seconds")
    steps, minibatches = 8 * 128, 16
    return {"serial": steps / (steps / steps_alone + minibatches / mbs_alone),
            "overlapped": steps / max(steps / steps_beside, minibatches / mbs_beside),
            "env steps/s beside": steps_beside, "minibatches/s beside": mbs_beside}


# ============================================================================ OpenMP's wait policy
def cnn_times(torch_threads: int) -> dict[str, float]:
    """Median ms of a Nature CNN training minibatch (256) and an acting call (8), and the cores busy elsewhere before."""
    import torch

    from fleetrl.nets import NatureCNN
    from fleetrl.runtime import busy_cores_elsewhere

    busy = busy_cores_elsewhere(0.5)
    torch.set_num_threads(torch_threads)
    net, head = NatureCNN(4), torch.nn.Linear(NatureCNN.out_dim, 4)
    optimizer = torch.optim.Adam([*net.parameters(), *head.parameters()])
    batch, acting = torch.rand(256, 4, 84, 84), torch.rand(8, 4, 84, 84)

    def train_step() -> None:
        optimizer.zero_grad()
        head(net(batch)).pow(2).mean().backward()
        optimizer.step()

    def timed(fn, calls: int) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    timed(train_step, 2)  # warm-up
    train_ms = timed(train_step, 6)
    with torch.no_grad():
        timed(lambda: head(net(acting)), 5)
        act_ms = timed(lambda: head(net(acting)), 50)
    return {"train_ms": train_ms, "act_ms": act_ms, "busy": busy}


# ============================================================================ the parent
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="cartpole,busy,breakout-ale,breakout-async,overlap")
    parser.add_argument("--torch", default="1,2", help="torch thread counts to measure")
    parser.add_argument("--workers", default="1,2", help="env worker counts to measure")
    parser.add_argument("--overlap-seconds", type=float, default=3.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--overlap-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--omp-child", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return run_child(Config(**json.loads(opts.child)))
    if opts.overlap_child:
        print(RESULT_MARKER + json.dumps(overlap(opts.overlap_child, opts.overlap_seconds)), flush=True)
        return None
    if opts.omp_child:
        print(RESULT_MARKER + json.dumps(cnn_times(opts.omp_child)), flush=True)
        return None

    from fleetrl.runtime import plan_threads

    groups = opts.only.split(",")
    torch_counts, worker_counts = ({int(v) for v in arg.split(",")} for arg in (opts.torch, opts.workers))
    rows = [c for c in configs() if c.group in groups and c.torch_threads in torch_counts
            and (c.backend == "sync" or c.workers in worker_counts)]
    sps: dict[Config, list[float]] = {c: [] for c in rows}
    busy: dict[Config, list[float]] = {c: [] for c in rows}
    lag: dict[int, list[dict[str, float]]] = {1: [], 2: []} if "overlap" in groups else {}
    omp: dict[tuple[int, str], list[dict[str, float]]] = {(t, p): [] for t in (1, 2) for p in ("default", "PASSIVE")} if "omp" in groups else {}
    started = time.time()
    for repeat in range(opts.repeats):
        for config in rows:
            rate, others = measure(config)
            sps[config].append(rate)
            busy[config].append(others)
            print(f"repeat {repeat + 1}: {config.label} {rate:,.0f} SPS ({others:.1f} cores busy elsewhere)", file=sys.stderr, flush=True)
        for threads in lag:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--overlap-child", str(threads),
                                   "--overlap-seconds", str(opts.overlap_seconds)], capture_output=True, text=True, timeout=600)
            lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
            if not lines:
                raise RuntimeError(f"overlap emulation failed:\n{proc.stderr[-2000:]}")
            lag[threads].append(json.loads(lines[-1][len(RESULT_MARKER):]))
        for (threads, policy), runs in omp.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy == "PASSIVE":
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--omp-child", str(threads)],
                                  capture_output=True, text=True, timeout=600, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
            if not lines:
                raise RuntimeError(f"the wait-policy measurement failed:\n{proc.stderr[-2000:]}")
            runs.append(json.loads(lines[-1][len(RESULT_MARKER):]))
    minutes = (time.time() - started) / 60
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]

    cores = os.cpu_count() or 1
    print(f"\nPPO SPS by thread setting, {cores} cores, median of {opts.repeats} (one process each, first iteration left out);"
          f" {minutes:.0f} min, load average at the end {' '.join(load)}\n")
    print("The plan's pick depends on the cores other jobs use (`busy`): `plan, free` marks its pick on an otherwise idle host,\n"
          "`plan, 1 busy` its pick while other processes keep a core busy.\n")
    print("| workload | backend | torch threads | env workers | SPS (median) | all runs | cores busy elsewhere, each run | plan |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for config in rows:
        picks = []
        for name, others in (("plan, free", 0.0), ("plan, 1 busy", 1.0)):
            plan = plan_threads(cores, num_envs=config.num_envs, cnn="Breakout" in config.env_id, busy_elsewhere=others)
            if config.torch_threads == plan.torch_threads and (config.backend == "sync" or config.workers == plan.env_workers):
                picks.append(name)
        runs = ", ".join(f"{v:,.0f}" for v in sps[config])
        others = ", ".join(f"{v:.1f}" for v in busy[config])
        print(f"{config.label} {statistics.median(sps[config]):,.0f} | {runs} | {others} | {'; '.join(picks)} |")
    if lag:
        plan = plan_threads(cores, num_envs=8, cnn=True, policy_lag=1)
        print("\n--policy-lag 1 emulated: Breakout x8 x 128 steps, sampling (ale + Nature CNN acting) in a thread beside the learner"
              " (16 minibatches of 256); iteration SPS, median of repeats\n")
        print("| torch threads | serial | overlapped | env steps/s beside learning | minibatches/s beside sampling | plan |")
        print("| --- | --- | --- | --- | --- | --- |")
        for threads, runs in lag.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"| {threads} | {med['serial']:,.0f} | {med['overlapped']:,.0f} | {med['env steps/s beside']:,.0f} | "
                  f"{med['minibatches/s beside']:.2f} | {'**plan**' if threads == plan.torch_threads else ''} |")
    if omp:
        print("\nNature CNN by OpenMP wait policy: ms per training minibatch (256) and per acting call (8), median of repeats\n")
        print("| torch threads | OMP_WAIT_POLICY | train ms | all runs | act ms | all runs | cores busy elsewhere, each run |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for (threads, policy), runs in omp.items():
            cells = []
            for key in ("train_ms", "act_ms"):
                values = [r[key] for r in runs]
                cells += [f"{statistics.median(values):,.1f}", ", ".join(f"{v:,.1f}" for v in values)]
            others = ", ".join(f"{r['busy']:.1f}" for r in runs)
            print(f"| {threads} | {policy} | {' | '.join(cells)} | {others} |")
    return None


if __name__ == "__main__":
    main()
