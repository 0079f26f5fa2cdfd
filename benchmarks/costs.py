"""The engine's costs, measured on this machine: `python benchmarks/costs.py WHAT [flags]` (each WHAT has --help).

  learner-start  what starting the learner process (--policy-lag 1) costs the trainer, by start method
  learner-step   one PPO learner step and one acting forward (Nature CNN), by precision, memory format and compile
  micro          the per-step costs fleetrl's code quotes: numpy acting, host Q-values, the env check, DQN's draws
  radam          PQN's update with torch's RAdam against fleetrl.optim.RAdam
  startup        a process start: importing torch, torch._dynamo, a 512-step CartPole run with and without it
  replay-memory  a filled DQN Atari replay buffer's resident memory against CleanRL's and SB3's
  per            prioritised replay's sum tree against CleanRL's SegmentTree, and its memory
  soak           a long PPO run per env backend, its process tree's RSS over time (memory stays flat)
  ceiling        SAC's and TD3's matmul FLOPs a learning step against this CPU's matmul peak
  preemption     PPG at Procgen's defaults: SIGTERM to exit, and what the stop writes, by the phase's iteration
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ROOT, add_flags, alternate, env_with_path, fmt, host_line, med, median_us, run_process, table

RUN_PPO = ["train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "512", "--no-cuda", "--no-progress"]


# ============================================================================ learner-start
LEARNER_START = r"""
import json, sys, time
import torch
from fleetrl import learner as learner_module
from fleetrl.algos.dqn import QNetwork
method, net, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
if hasattr(learner_module, "processes"):  # a checkout from before the forkserver always forks
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
print("BENCH_RESULT " + json.dumps({"constructor": constructor, "first": first - steady}))
"""


def learner_start(opts: argparse.Namespace) -> None:
    """Each measurement a fresh process that builds DQN's network and Adam, runs torch once, then times the constructor
    (the learner process starts there) and the first update's extra wait, at once or --setup-seconds later (a run
    fills its buffer in between)."""
    rows = []
    for net in opts.nets.split(","):
        for method in opts.methods.split(","):
            runs = {"constructor": [], "at once": [], "later": []}
            for _ in range(opts.repeats):
                for pause, column in ((0.0, "at once"), (opts.setup_seconds, "later")):
                    r = run_process([sys.executable, "-c", LEARNER_START, method, net, str(pause)], timeout=300)["result"]
                    runs[column].append(r["first"])
                    runs["constructor"].append(r["constructor"])
            rows.append([net, method, *(f"{med(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in runs.values())])
    print(table(["network", "start method", "constructor s", "first update at once s", f"first update {opts.setup_seconds:g} s later s"], rows))


# ============================================================================ learner-step
def learner_step(opts: argparse.Namespace) -> None:
    """fleetrl's PPO Agent (Nature CNN): forward, the PPO loss, backward and Adam on a minibatch of 256 (CleanRL's Atari
    defaults), and acting on 8 observations; settings take turns within each repeat. bf16 is measured also where the CPU
    only emulates it (auto never picks it there)."""
    import gymnasium as gym
    import numpy as np
    import torch

    from fleetrl.accel import Accel, native_bf16
    from fleetrl.algos.ppo import Agent, Args, ppo_loss
    from fleetrl.distributed import Dist

    torch.set_num_threads(opts.threads)
    rng = np.random.default_rng(0)
    mb = {"obs": torch.as_tensor(rng.integers(0, 255, (256, 4, 84, 84), dtype=np.uint8)), "actions": torch.as_tensor(rng.integers(0, 4, 256)),
          "logprobs": torch.full((256,), -np.log(4)), "values": torch.zeros(256), "advantages": torch.randn(256), "returns": torch.randn(256)}
    native = native_bf16(torch.device("cpu"))

    def setting(dtype: torch.dtype, channels_last: bool, compiled: bool):
        torch.manual_seed(0)
        agent = Accel(dtype, channels_last).apply(Agent((4, 84, 84), gym.spaces.Discrete(4)))
        optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
        loss_fn, act = (torch.compile(ppo_loss), torch.compile(agent)) if compiled else (ppo_loss, agent)  # act: the forward

        def learn() -> None:
            loss, _ = loss_fn(agent, mb, Args(clip_coef=0.1, ent_coef=0.01), Dist())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        def infer() -> None:
            with torch.inference_mode():
                act(mb["obs"][:8])

        learn(), learn(), infer(), infer()  # compiles here
        return learn, infer

    fns = {s: setting(*s) for c in ((False,) if opts.no_compile else (False, True)) for s in
           ((d, cl, c) for d in (torch.float32, torch.bfloat16) for cl in (False, True)) if not (c and s[0] == torch.bfloat16 and not native[0])}
    res = {s: ([], []) for s in fns}
    for _ in range(opts.repeats):
        for s, (learn, infer) in fns.items():
            res[s][0].append(median_us(learn, 1, opts.steps) / 1e3)
            res[s][1].append(median_us(infer, 1, opts.steps * 10) / 1e3)
    base = med(res[(torch.float32, False, False)][0])
    print(f"torch {torch.__version__}, {opts.threads} threads; {native[1]}\n")
    print(table(["precision", "memory format", "compiled", "learner step, minibatch 256 (ms)", "speed-up", "acting forward, batch 8 (ms)"],
                [["bf16" if d == torch.bfloat16 else "fp32", "channels-last" if cl else "NCHW", "yes" if c else "no", f"{med(lt):.0f}",
                  f"{base / med(lt):.2f}x", f"{med(it):.2f}"] for (d, cl, c), (lt, it) in res.items()]))


# ============================================================================ micro
def micro(opts: argparse.Namespace) -> None:
    """Each row times one call many times and keeps the fastest of 7 rounds (the least disturbed by other jobs)."""
    import gymnasium as gym
    import numpy as np
    import torch

    from fleetrl.algos.ppo import Agent
    from fleetrl.envs.registry import EnvFactory
    from fleetrl.nets import mlp
    from fleetrl.sampling.acting import TorchActor, host_forward, make_actor

    torch.set_num_threads(1)
    best = lambda fn: min(median_us(fn, 2000, 1) for _ in range(7))  # noqa: E731
    agent, obs = Agent((4,), gym.spaces.Discrete(2)), np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    numpy_actor, torch_actor = make_actor(agent, torch.device("cpu"), 0), TorchActor(agent, torch.device("cpu"), 0)
    q = mlp(4, 2, out_std=1.0, hidden=(120, 84), activation=torch.nn.ReLU)
    numpy_q = host_forward(q, torch.device("cpu"))

    def torch_q():
        with torch.inference_mode():
            return q(torch.as_tensor(obs[:1])).numpy()

    def stepper(env):
        env.reset(seed=0)
        return lambda: env.step(0)[2] and env.reset()

    rows = [(f"PPO acting, CartPole, 4 envs: numpy path ({type(numpy_actor).__name__})", best(lambda: numpy_actor.act(obs))),
            ("PPO acting, CartPole, 4 envs: torch path", best(lambda: torch_actor.act(obs))),
            ("DQN Q-values, CartPole, 1 env: numpy path (host_forward)", best(lambda: numpy_q(obs[:1]))),
            ("DQN Q-values, CartPole, 1 env: torch module", best(torch_q)),
            ("CartPole step through fleetrl's env (CheckOutputs, EpisodeStats)", best(stepper(EnvFactory("CartPole-v1", "classic")()))),
            ("CartPole step, gymnasium's plain env", best(stepper(gym.make("CartPole-v1")))),
            ("DQN exploration draw: np.random.random((2, 1)), one call", best(lambda: np.random.random((2, 1)))),
            ("DQN exploration draw: np.random.randint(2) and np.random.random()", best(lambda: (np.random.randint(2), np.random.random())))]
    print(table(["what (fastest of 7 rounds of 2000 calls, one torch thread)", "µs a call"], [[n, f"{us:.1f}"] for n, us in rows]))


# ============================================================================ radam
def radam(opts: argparse.Namespace) -> None:
    """PQN's 120-84 LayerNorm MLP on CartPole's shapes, a minibatch of 128, updated as pqn.py does (zero_grad, backward,
    clip_grad_norm_ at 10, step); CPU time, after checking the two optimisers leave identical parameters."""
    import torch
    from torch import nn

    from fleetrl import optim
    from fleetrl.nets import layernorm_mlp

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    obs, returns = torch.randn(128, 4, generator=g) * 3, torch.randn(128, generator=g) * 10

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

    makers = {"torch.optim.RAdam": torch.optim.RAdam, "fleetrl.optim.RAdam": optim.RAdam}
    nets = []
    for make in makers.values():
        net, _, update = setup(make)
        for _ in range(300):
            update()
        nets.append(net)
    rows = []
    for name, make in makers.items():
        _, opt, update = setup(make)
        whole = median_us(update, opts.calls, opts.repeats, time.process_time)  # leaves gradients in place for the step alone
        rows.append([name, fmt(median_us(opt.step, opts.calls, opts.repeats, time.process_time)), fmt(whole)])
    print(f"parameters identical after the same 300 updates: {all(torch.equal(a, b) for a, b in zip(*(n.parameters() for n in nets)))}\n")
    print(table(["optimiser", "step alone (µs, median)", "whole update (µs, median)"], rows))


# ============================================================================ startup
def startup(opts: argparse.Namespace) -> None:
    """Each row a fresh process, alternating; medians of wall and CPU (user + system) seconds."""
    main = "import sys; from fleetrl.cli import main; main(sys.argv[1:])"
    rows = {"python -c 'import torch'": ["-c", "import torch"], "python -c 'import torch, torch._dynamo'": ["-c", "import torch, torch._dynamo"],
            "fleetrl train ppo, 512 CartPole steps": ["-c", main, *RUN_PPO],
            "the same run, torch._dynamo imported first (as torch.optim.Adam did)": ["-c", "import torch._dynamo; " + main, *RUN_PPO]}
    env = env_with_path(OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        def run(name: str, repeat: int) -> dict:
            argv = rows[name] + (["--run-dir", f"{tmp}/{repeat}-{len(name)}"] if "train" in rows[name] else [])
            return run_process([sys.executable, *argv], env=env, cwd=ROOT)

        run("fleetrl train ppo, 512 CartPole steps", -1)  # caches: pyc files, the measured precision
        runs = alternate(rows, opts.repeats, run, lambda n, r: f"{r['wall']:.2f} s")
    print(table(["process", "wall s", "CPU s", "wall s, every run"], [[n, f"{med(r['wall'] for r in rs):.2f}", f"{med(r['cpu'] for r in rs):.2f}",
                                                                     ", ".join(f"{r['wall']:.2f}" for r in rs)] for n, rs in runs.items()]))


# ============================================================================ replay-memory
def replay_memory(opts: argparse.Namespace) -> None:
    """Random actions in fleetrl's DQN Atari env (episodic life, same-step autoreset) recorded, then cycled into a
    --capacity buffer until every slot and frame is written (resident, as in a long run), beside the Q-network, its target
    and Adam. CleanRL's dqn_atari.py (SB3's buffer, optimize_memory_usage=True) and SB3's default from their array shapes."""
    import gymnasium as gym
    import numpy as np
    import psutil
    import torch

    from fleetrl.algos.dqn import QNetwork
    from fleetrl.envs import make_vector_env
    from fleetrl.sampling import replay

    gb = lambda n: f"{n / 1e9:,.2f} GB ({n / 2**30:,.2f} GiB)"  # noqa: E731
    rss = lambda: psutil.Process().memory_info().rss  # noqa: E731
    need = replay.required_bytes(opts.capacity, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4))
    if need + (2 << 30) > psutil.virtual_memory().available:  # refuse rather than push the machine into swap or the OOM killer
        raise SystemExit(f"costs.py replay-memory: the buffer needs {gb(need)} and 2 GiB of margin, and this machine has "
                         f"{gb(psutil.virtual_memory().available)} available now. Stop other runs, or lower --capacity.")
    envs = make_vector_env(opts.env_id, 1, opts.backend, training=True)
    rng, (obs, _) = np.random.default_rng(1), envs.reset(seed=1)
    steps = []  # (obs, next obs, action, reward, terminated, truncated, info)
    while len(steps) < opts.source_steps or not (steps[-1][6] and steps[-1][6].get("_episode", [False])[0]):  # to a game's end
        action = rng.integers(envs.single_action_space.n, size=1)
        next_obs, reward, term, trunc, info = envs.step(action)
        steps.append((obs, next_obs, action, reward, term, trunc, {k: info[k] for k in ("final_obs", "_final_obs", "_episode") if k in info}))
        obs = next_obs
    space, actions = envs.single_observation_space, envs.single_action_space
    envs.close()
    q, target = QNetwork(space.shape, int(actions.n)), QNetwork(space.shape, int(actions.n))
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-4, fused=True)
    before = rss()
    rb = replay.ReplayBuffer(opts.capacity, 1, space, actions, "cpu")
    added = 0
    while added < opts.capacity or (rb.frame_stack and int(rb.written.min()) < rb.frames_per_env and added < 1.5 * opts.capacity):
        rb.add(*steps[added % len(steps)])
        added += 1
    filled = rss()
    for _ in range(3):  # Adam's state exists
        data = rb.sample(32)
        with torch.no_grad():
            y = data.rewards + 0.99 * target(data.next_obs).max(dim=1).values * (1 - data.dones)
        loss = torch.nn.functional.mse_loss(q(data.obs).gather(1, data.actions.long().view(-1, 1)).squeeze(1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    frames = opts.capacity * 4 * 84 * 84
    print(f"{host_line()}\n{opts.capacity:,} transitions of {opts.env_id}, {added:,} adds of {len(steps):,} recorded random steps, cycled\n")
    print(table(["what", "bytes"], [["fleetrl `ReplayBuffer.required_bytes`", gb(need)], ["RSS added by building and filling the buffer", gb(filled - before)],
                                    ["**process RSS**, filled buffer (buffer, networks, Adam, torch, the recorded frames)", f"**{gb(rss())}**"],
                                    ["CleanRL `dqn_atari.py`: SB3 buffer, `optimize_memory_usage=True`", gb(frames + opts.capacity * 20)],
                                    ["SB3 `ReplayBuffer` default (obs and next obs apart)", gb(2 * frames + opts.capacity * 20)]]))


# ============================================================================ per
def per(opts: argparse.Namespace) -> None:
    """Medians of --repeats calls (CleanRL's: --cleanrl-repeats), one thread; both trees hold the same priorities (fleetrl's
    heap is CleanRL's), so both draw the same slots. Memory: a 1M Atari buffer, uniform and prioritised 3-step."""
    import rainbow_atari as cleanrl_per  # CleanRL's prioritised replay, vendored
    import gymnasium as gym
    import numpy as np
    import torch

    from fleetrl.sampling.replay import ReplayBuffer, required_bytes

    atari, four = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4)
    uniform, rainbow = required_bytes(opts.capacity, atari, four), required_bytes(opts.capacity, atari, four, n_step=3, prioritized=True)
    torch.set_num_threads(1)
    n, rng = opts.capacity, np.random.default_rng(0)
    ours = ReplayBuffer(n, 1, gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), alpha=0.5, gamma=0.99, check_memory=False)
    ours.obs[:] = ours.next_obs[:] = rng.standard_normal((n, 4)).astype(np.float32)
    ours.actions[:], ours.rewards[:], ours.dones[:], ours.filled, ours.row = 0, 1.0, 0.0, ours.rows, 0
    tree = ours.priorities
    tree.update(np.arange(n), rng.exponential(1.0, n).astype(np.float32))
    theirs = cleanrl_per.PrioritizedReplayBuffer(n, (4,), "cpu", 1, 0.99, alpha=0.5, beta=0.4)
    theirs.sum_tree.tree[:] = tree.tree.nodes  # the same heap, the same sums
    theirs.min_tree.tree[n - 1:] = tree.tree.leaves
    theirs.size, theirs.max_priority = n, tree.max_priority

    def theirs_sample():  # CleanRL's sample, less its gathers of the arrays and tensors
        total = theirs.sum_tree.total()
        idx = [theirs.sum_tree.retrieve(np.random.uniform(total / 32 * i, total / 32 * (i + 1))) for i in range(32)]
        w = (theirs.size * np.array([theirs.sum_tree.tree[i + n - 1] for i in idx]) / total) ** -theirs.beta
        return w / w.max()

    slots, errors, new = tree.sample(32), rng.standard_normal(32).astype(np.float32), iter(range(10**9))
    pairs = [("sample 32 (draws, search, IS weights)", lambda: tree.weights(tree.sample(32), n, 0.4), theirs_sample),
             ("update 32 priorities", lambda: ours.update_priorities(slots, errors), lambda: theirs.update_priorities(slots, errors)),
             ("insert 1 transition (max priority)", lambda: tree.insert([next(new) % n]),
              lambda: (theirs.sum_tree.update(next(new) % n, 1.0), theirs.min_tree.update(next(new) % n, 1.0))),
             ("whole batch: sample(32), tensors included", lambda: ours.sample(32), lambda: theirs.sample(32))]
    rows = [(name, median_us(a, 1, opts.repeats), median_us(b, 1, opts.cleanrl_repeats)) for name, a, b in pairs]
    print(f"{n:,} slots, batch 32\n\n" + table(["operation", "fleetrl", "CleanRL", "CleanRL / fleetrl"],
                                               [[name, f"{a:,.0f} us", f"{b:,.0f} us", f"{b / a:.1f}x"] for name, a, b in rows]))
    print(f"\n- Target: a 32-transition batch from 1M in at most 1 ms: sample 32 took {rows[0][1]:,.0f} us.\n- Memory of {opts.capacity:,} "
          f"Atari transitions: DQN's buffer {uniform / 1e9:.3f} GB, prioritised 3-step +{(rainbow - uniform) / 1e6:.1f} MB; CleanRL's "
          f"PrioritizedReplayBuffer {(opts.capacity * (2 * 4 * 84 * 84 + 13) + 8 * (2 * opts.capacity - 1)) / 1e9:.3f} GB (from its shapes).")


# ============================================================================ soak
SOAK_ENVS = {"sync": "CartPole-v1", "async": "CartPole-v1", "gym-sync": "CartPole-v1", "envpool": "CartPole-v1", "ale": "BreakoutNoFrameskip-v4"}


def soak(opts: argparse.Namespace) -> None:
    """`fleetrl train ppo` per backend with a huge --total-timesteps, SIGTERM after --minutes; the first --warmup share is
    warm-up. RSS swings within an iteration (an update allocates and frees its batch copies), so a leak shows in the trend
    of per-minute medians, not in single samples: flat means every minute's median within --tolerance of the first's."""
    import numpy as np
    import psutil

    rows = []
    for backend in opts.backends:
        with tempfile.TemporaryDirectory(prefix=f"soak-{backend}-") as run_dir:
            proc = subprocess.Popen([sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", SOAK_ENVS[backend], "--env-backend", backend,
                                     "--no-cuda", "--total-timesteps", str(10**10), "--checkpoint-every", "20", "--run-dir", run_dir, "--no-progress"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env_with_path())
            samples, start = [], time.time()
            try:
                while time.time() - start < opts.minutes * 60:
                    if proc.poll() is not None:
                        raise SystemExit(f"{backend}: the run ended early (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
                    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                    samples.append((time.time() - start, sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20))
                    time.sleep(opts.interval)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        after = [(t, r) for t, r in samples if t >= opts.warmup * opts.minutes * 60]
        minutes = [med(r for t, r in after if int((t - after[0][0]) // 60) == m) for m in range(int((after[-1][0] - after[0][0]) // 60) + 1)]
        worst = max(abs(m - minutes[0]) / minutes[0] for m in minutes)
        rows.append([backend, SOAK_ENVS[backend], len(samples), f"{minutes[0]:.0f}", f"{minutes[-1]:.0f}", f"{minutes[-1] / minutes[0] - 1:+.1%}",
                     f"{worst:.1%}", f"{np.polyfit([t / 3600 for t, _ in after], [r for _, r in after], 1)[0]:+.1f}",
                     f"{min(r for _, r in after):.0f}-{max(r for _, r in after):.0f}", "yes" if worst <= opts.tolerance else "NO", proc.returncode])
    print(f"\n{host_line()}\nPPO memory soak, {opts.minutes:g} min per backend, RSS of the trainer and its workers every {opts.interval:g} s\n")
    print(table(["backend", "env", "samples", "first minute after warm-up, median (MB)", "last minute, median (MB)", "drift", "worst minute vs first",
                 "trend (MB/hour)", "samples min-max (MB)", f"within {opts.tolerance:.0%}", "exit on SIGTERM"], rows))


# ============================================================================ ceiling
def ceiling(opts: argparse.Namespace) -> None:
    """Matmul FLOPs per learning step (torch's FlopCounterMode over a short fleetrl run, CleanRL's defaults; elementwise
    ops not counted, so the ceiling is generous) against a 256^3 fp32 matmul's best throughput: the SPS if nothing else
    took any time, and with --plain-sps the share of that peak a 2x target would need."""
    import importlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    envs, cores = {"sac": "HalfCheetah-v5", "td3": "HalfCheetah-v5", "dqn": "CartPole-v1"}, os.cpu_count() or 1
    plain = {k: float(v) for k, v in (item.split("=", 1) for item in opts.plain_sps)}
    flops = {}
    for algo in opts.algos.split(","):
        module, counter = importlib.import_module(f"fleetrl.algos.{algo}"), FlopCounterMode(display=False)
        with tempfile.TemporaryDirectory() as runs, counter:
            module.train(module.Args(env_id=envs[algo], total_timesteps=1200, learning_starts=1000, seed=1, run_dir=f"{runs}/run", progress=False))
        flops[algo] = counter.get_total_flops() / 200

    def gflops(threads: int) -> float:
        torch.set_num_threads(threads)
        a = torch.randn(256, 256)
        return 2 * 256**3 / min(median_us(lambda: a @ a, 2000, 1) for _ in range(5)) / 1e3

    peak = {1: gflops(1), cores: gflops(cores)}
    print(f"{host_line()}\n256x256x256 fp32 matmul: {peak[1]:.0f} GFLOP/s on 1 thread, {peak[cores]:.0f} on {cores}\n")
    print(table(["algorithm", "env", "matmul GFLOP per learning step", "ceiling SPS (1 thread / all cores)", "plain SPS", "2x plain needs"],
                [[a.upper(), envs[a], f"{f / 1e9:.3f}", f"{peak[1] * 1e9 / f:,.0f} / {peak[cores] * 1e9 / f:,.0f}", plain.get(a, "-"),
                  f"{2 * plain[a] * f / (peak[cores] * 1e9):.0%} of the {cores}-core peak" if a in plain else "-"] for a, f in flops.items()]))


# ============================================================================ preemption
SIGNALLED = "signalled_at"  # where the child writes the time it sent itself SIGTERM


def preemption_child(env_id: str, at: int, run_dir: str, stop_rollouts_gb: float) -> None:
    """PPG's real loop, signal handling and checkpoint writer at Procgen's defaults, with a small stand-in network (the
    IMPALA CNN's update takes minutes on two cores; the checkpoint's rollouts are the frames whatever the network), that
    sends itself SIGTERM after the update of the phase's iteration ``at``; exits as `fleetrl train` does."""
    import torch
    from torch import nn

    from fleetrl.algos import ppg
    from fleetrl.errors import exit_on_error

    class Frames(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.avg_pool2d(x.float() / 255.0, 8).flatten(1)  # 3x8x8: cheap, and the rollouts are the same

    class SmallAgent(ppg.Agent):
        def __init__(self, obs_shape, action_space, impala: bool = False):
            nn.Module.__init__(self)
            self.continuous, self.compute_dtype = False, torch.float32
            self.trunk = nn.Sequential(Frames(), nn.Linear(obs_shape[0] * (obs_shape[1] // 8) * (obs_shape[2] // 8), 32), nn.ReLU())
            self.actor, self.critic, self.aux_critic = nn.Linear(32, int(action_space.n)), nn.Linear(32, 1), nn.Linear(32, 1)

    class SignalAfter(ppg.AuxiliaryPhase):
        def after_update(self, iteration: int, batch: dict) -> dict:
            stats = super().after_update(iteration, batch)
            if iteration == at:
                Path(run_dir, SIGNALLED).write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's would: caught, the run checkpoints and stops
            return stats

    args = ppg.Args(env_id=env_id, total_timesteps=2 * 64 * 256 * 32, run_dir=run_dir, cuda=False, progress=False, precision="fp32", seed=1,
                    stop_rollouts_gb=stop_rollouts_gb)
    ppg.Agent, ppg.AuxiliaryPhase = SmallAgent, SignalAfter  # this child process's PPG: its loop, with these two
    exit_on_error(lambda: ppg.train(args))


def preemption(opts: argparse.Namespace) -> None:
    """Each row one run at ppg_procgen.py's defaults (64 envs x 256 steps, --n-iteration 32: a phase keeps 6.4 GB of
    frames) on EnvPool's Procgen; SIGTERM to exit is wall seconds from the signal to the process's end."""
    from fleetrl import checkpoint

    rows = []
    for at in (int(a) for a in opts.at.split(",")):
        if not 1 <= at <= 31:
            raise SystemExit(f"--at {at}: give iterations of the phase before its last (the auxiliary phase), 1 to 31")
        with tempfile.TemporaryDirectory() as run_dir:
            proc = subprocess.Popen([sys.executable, __file__, "preemption", "--child", str(at), "--env-id", opts.env_id, "--run-dir", run_dir,
                                     "--stop-rollouts-gb", str(opts.stop_rollouts_gb)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env=env_with_path())
            _, status, usage = os.wait4(proc.pid, 0)
            ended, code = time.time(), os.waitstatus_to_exitcode(status)
            if code != 128 + signal.SIGTERM or not Path(run_dir, SIGNALLED).exists():
                raise SystemExit(f"the run signalled in iteration {at} ended with {code}, not 143 after its checkpoint:\n{proc.stderr.read()[-3000:]}")
            found = checkpoint.list_checkpoints(run_dir)
            size = sum(p.stat().st_size for p in found[-1].parent.glob(f"{found[-1].stem}.*")) if found else 0
            rows.append([f"{at} of 32", f"{at * 64:,} ({at * 256 * 64 * 3 * 64 * 64 / 1e9:.1f} GB)", f"{ended - float(Path(run_dir, SIGNALLED).read_text()):.1f}",
                         f"{size / 1e9:.2f} GB" if size else "none: resumes from the phase's start", f"{usage.ru_maxrss / 2**20:.1f} GiB"])
    print(f"\nPPG on {opts.env_id}, Procgen's defaults, --stop-rollouts-gb {opts.stop_rollouts_gb:g}, SIGTERM after the update of the phase's "
          f"iteration K\n\n" + table(["SIGTERM in iteration", "rollouts stored", "SIGTERM to exit (s)", "checkpoint written", "peak RSS"], rows))


# ============================================================================ the command line
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    commands = {"learner-start": learner_start, "learner-step": learner_step, "micro": micro, "radam": radam, "startup": startup,
                "replay-memory": replay_memory, "per": per, "soak": soak, "ceiling": ceiling, "preemption": preemption}
    p = {name: sub.add_parser(name, help=(fn.__doc__ or "").split(". ")[0], description=fn.__doc__) for name, fn in commands.items()}
    for name, repeats in (("learner-start", 5), ("learner-step", 3), ("radam", 5), ("startup", 5), ("per", 2000)):
        p[name].add_argument("--repeats", type=int, default=repeats)
    add_flags(p["learner-start"], nets=("mlp,cnn", "mlp (DQN's CartPole network), cnn (the Nature CNN)"),
              methods=("fork,forkserver,spawn", "start methods to measure"), setup_seconds=(5.0, "between the constructor and the first update"))
    add_flags(p["learner-step"], steps=(5, "timed learner steps per setting per repeat (acting: 10x)"), threads=2,
              no_compile=(False, "leave out the compiled settings (each compiles ~15-40 s)"))
    add_flags(p["radam"], calls=1000)
    add_flags(p["replay-memory"], env_id="BreakoutNoFrameskip-v4", backend="sync", capacity=(1_000_000, "DQN Atari's --buffer-size"),
              source_steps=(3_000, "real env steps recorded, then cycled"))
    add_flags(p["per"], capacity=1_000_000, cleanrl_repeats=300)
    p["soak"].add_argument("--backends", nargs="+", default=["sync", "async", "envpool", "ale"], choices=list(SOAK_ENVS))
    add_flags(p["soak"], minutes=20.0, warmup=(0.2, "share of the run counted as warm-up"), interval=(5.0, "seconds between RSS samples"),
              tolerance=0.10)
    add_flags(p["ceiling"], algos="sac,td3")
    p["ceiling"].add_argument("--plain-sps", nargs="*", default=[], metavar="ALGO=SPS", help="the plain loop's SPS (speed.py offpolicy)")
    add_flags(p["preemption"], env_id=("StarpilotEasy-v0", "an EnvPool Procgen env"),
              at=("1,4,31", "the phase's iterations (1-31) SIGTERM lands in, comma-separated"),
              stop_rollouts_gb=(1.0, "PPG's flag: the most stored rollouts a stop writes"))
    p["preemption"].add_argument("--child", type=int, help=argparse.SUPPRESS)
    p["preemption"].add_argument("--run-dir", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.what == "preemption" and opts.child:
        return preemption_child(opts.env_id, opts.child, opts.run_dir, opts.stop_rollouts_gb)
    commands[opts.what](opts)


if __name__ == "__main__":
    main()
