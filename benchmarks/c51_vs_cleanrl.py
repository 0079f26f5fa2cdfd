"""fleetrl's C51 against CleanRL's c51.py (issue 35, item 1): a lockstep trace of the two loops, speed side by side,
and learning over seeds with `fleetrl compare`.

    python benchmarks/c51_vs_cleanrl.py --lockstep --steps 4000 --learning-starts 1000   # where do the loops part?
    python benchmarks/c51_vs_cleanrl.py --speed --steps 30000 --repeats 3                # SPS, alternating, medians
    python benchmarks/c51_vs_cleanrl.py --learn --env-ids CartPole-v1,Acrobot-v1 --seeds 1-10 --steps 500000

``--lockstep``: fleetrl's loop (``fleetrl.algos.c51.train``, recorded at its engine calls) beside CleanRL's c51.py loop
(``plain_c51`` below: its network, ``get_action``, projection loop, Adam with ``eps=0.01 / batch_size`` and target
copy, as its file writes them, on benchmarks/plain_offpolicy.py's SB3-style buffer) given fleetrl's two differences
of DQN's (one uniform pair of exploration draws a step from numpy's global RNG, fused Adam). Both then take the same
actions, updates, target copies and losses, bit for bit; the first place they part is printed.

``--speed`` and ``--learn`` run CleanRL's own script (benchmarks/cleanrl/c51.py: c51.py with gymnasium 1.x's changes)
and ``fleetrl train c51`` as subprocesses, one at a time, alternating sides, one torch thread each, pinned with
``taskset -c --cpu`` (``--policy-lag 1`` gets ``--lag-cpus``, two cores: its learner process runs on the second).
Speed: env steps over the whole process's wall time, start-up included. Learning: each run's TensorBoard folder goes
to OUT/SIDE/ENV/, and ``fleetrl compare`` reads them (a run's score: the mean of its last episodes' returns).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
CLEANRL_C51 = HERE / "cleanrl" / "c51.py"
SCORE_BOUNDS = {"CartPole-v1": "0,500", "Acrobot-v1": "-500,0", "MountainCar-v0": "-200,0"}


# ============================================================================ CleanRL's loop, in this process
def plain_c51(env_id: str, steps: int, learning_starts: int, seed: int = 1, numpy_draws: bool = False, fused_adam: bool = False,
              final_obs: bool = False, trace=None):
    """CleanRL's c51.py loop for ``steps`` env steps with its defaults (``numpy_draws``, ``fused_adam``: fleetrl's two
    differences of DQN's, as plain_offpolicy.plain_dqn takes them); ``trace`` (plain_offpolicy.Trace) records it.

    ``final_obs``: store the episode's final observation as a terminal transition's next observation, as fleetrl's buffer
    does (CleanRL's stores the next episode's first). The bootstrap is zeroed either way, but C51's projection still sums
    the next distribution's 101 probabilities onto the reward's atom, to 1 within rounding that depends on them: without
    this switch the targets of terminal transitions differ in their last bits (DQN's ``target_max * 0`` does not)."""
    import gymnasium as gym
    import torch
    import torch.nn as nn
    import torch.optim as optim

    import plain_offpolicy as po

    lr, n_atoms, v_min, v_max, buffer_size, gamma = 2.5e-4, 101, -100, 100, 10_000, 0.99
    target_network_frequency, batch_size, start_e, end_e, exploration_fraction, train_frequency = 500, 128, 1, 0.05, 0.5, 10

    class QNetwork(nn.Module):  # CleanRL's, as c51.py writes it
        def __init__(self, env, n_atoms=101, v_min=-100, v_max=100):
            super().__init__()
            self.env = env
            self.n_atoms = n_atoms
            self.register_buffer("atoms", torch.linspace(v_min, v_max, steps=n_atoms))
            self.n = env.single_action_space.n
            self.network = nn.Sequential(nn.Linear(np.array(env.single_observation_space.shape).prod(), 120), nn.ReLU(),
                                         nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, self.n * n_atoms))

        def get_action(self, x, action=None):
            logits = self.network(x)
            # probability mass function for each action
            pmfs = torch.softmax(logits.view(len(x), self.n, self.n_atoms), dim=2)
            q_values = (pmfs * self.atoms).sum(2)
            if action is None:
                action = torch.argmax(q_values, 1)
            return action, pmfs[torch.arange(len(x)), action]

    po._seed(seed)
    envs = po.make_envs(env_id, seed)
    timing = po.Timing("c51", env_id, steps, learning_starts, torch.get_num_threads())
    q_network = QNetwork(envs, n_atoms=n_atoms, v_min=v_min, v_max=v_max)
    optimizer = optim.Adam(q_network.parameters(), lr=lr, eps=0.01 / batch_size, **({"fused": True} if fused_adam else {}))
    target_network = QNetwork(envs, n_atoms=n_atoms, v_min=v_min, v_max=v_max)
    target_network.load_state_dict(q_network.state_dict())
    rb = po.ReplayBuffer(buffer_size, envs.single_observation_space, envs.single_action_space, "cpu")

    obs, _ = envs.reset(seed=seed)
    for global_step in range(steps):
        epsilon = po.linear_schedule(start_e, end_e, exploration_fraction * steps, global_step)
        draws = np.random.random((2, envs.num_envs)) if numpy_draws else None
        if (draws[0, 0] if numpy_draws else random.random()) < epsilon:
            actions = ((draws[1] * envs.single_action_space.n).astype(np.int64) if numpy_draws else
                       np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)]))
        else:
            actions, pmf = q_network.get_action(torch.Tensor(obs))
            actions = actions.cpu().numpy()
        if trace is not None:
            trace.actions.append(int(actions[0]))
        if final_obs:  # the transition fleetrl stores; its env step and episode records are CleanRL's
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            real_next_obs = next_obs.copy()
            for idx in np.flatnonzero(terminations | truncations):
                real_next_obs[idx] = infos["final_obs"][idx]
            rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
            obs = next_obs
        else:
            obs = po._step_and_store(envs, obs, actions, rb, timing)

        if global_step > learning_starts:
            if global_step % train_frequency == 0:
                data = rb.sample(batch_size)
                with torch.no_grad():
                    _, next_pmfs = target_network.get_action(data.next_observations)
                    next_atoms = data.rewards + gamma * target_network.atoms * (1 - data.dones)
                    # projection
                    delta_z = target_network.atoms[1] - target_network.atoms[0]
                    tz = next_atoms.clamp(v_min, v_max)

                    b = (tz - v_min) / delta_z
                    l = b.floor().clamp(0, n_atoms - 1)  # noqa: E741 - CleanRL's name
                    u = b.ceil().clamp(0, n_atoms - 1)
                    d_m_l = (u + (l == u).float() - b) * next_pmfs
                    d_m_u = (b - l) * next_pmfs
                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])

                _, old_pmfs = q_network.get_action(data.observations, data.actions.flatten())
                loss = (-(target_pmfs * old_pmfs.clamp(min=1e-5, max=1 - 1e-5).log()).sum(-1)).mean()
                if trace is not None:
                    trace.update_steps.append(global_step)
                    trace.losses.append(loss.item())

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if global_step % target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())
                if trace is not None:
                    trace.target_steps.append(global_step)
    envs.close()
    if trace is not None:
        trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}
    return timing


def fleetrl_trace(seed: int, steps: int, learning_starts: int, env_id: str = "CartPole-v1"):
    """fleetrl's C51 run, its actions, update and target steps and losses recorded at the engine calls DQN's loop makes."""
    import plain_offpolicy

    from fleetrl.algos import c51

    trace = plain_offpolicy.Trace()
    with plain_offpolicy.recording_dqn_loop(trace), tempfile.TemporaryDirectory() as runs:
        c51.train(c51.Args(env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts, torch_threads=1,
                           cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run")))
        from fleetrl import checkpoint

        trace.final_params = checkpoint.load_checkpoint(os.path.join(runs, "run"))["q_network"]
    return trace


def lockstep(opts: argparse.Namespace) -> None:
    import torch

    import plain_offpolicy

    torch.set_num_threads(1)
    ours = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts)
    theirs = plain_offpolicy.Trace()
    plain_c51("CartPole-v1", opts.steps, opts.learning_starts, seed=opts.seed, numpy_draws=True, fused_adam=True,
              final_obs=not opts.cleanrl_next_obs, trace=theirs)
    print(f"lockstep, CartPole-v1, seed {opts.seed}, {opts.steps:,} steps, learning from step {opts.learning_starts:,}:")
    for name in ("actions", "update_steps", "target_steps", "losses"):
        mine, other = np.asarray(getattr(ours, name)), np.asarray(getattr(theirs, name))
        same = len(mine) == len(other) and np.array_equal(mine, other)
        first = next((i for i, (x, y) in enumerate(zip(mine, other)) if x != y), None)
        print(f"  {name:13s} fleetrl {len(mine):7,} cleanrl {len(other):7,}: " + ("identical" if same else f"first differ at index {first}"))
        if name == "losses" and len(mine) == len(other) and not same:
            differ = mine != other
            print(f"    {differ.sum()} of {len(mine)} losses differ, by at most {np.max(np.abs(mine - other) / np.abs(other)):.1e} relative")
    same = all(np.array_equal(ours.final_params[k].numpy(), theirs.final_params[k].numpy()) for k in theirs.final_params)
    print(f"  final network parameters: {'identical' if same else 'differ'}")


# ============================================================================ subprocess runs: speed and learning
def command(side: str, env_id: str, seed: int, steps: int, run_dir: Path, opts: argparse.Namespace) -> tuple[list[str], dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{HERE}"}
    if side == "cleanrl":
        env["CLEANRL_RUN_DIR"] = str(run_dir)
        return ["taskset", "-c", opts.cpu, sys.executable, str(CLEANRL_C51), "--env-id", env_id, "--seed", str(seed),
                "--total-timesteps", str(steps), "--no-cuda"], env
    lag = side == "fleetrl-lag1"
    return ["taskset", "-c", opts.lag_cpus if lag else opts.cpu, sys.executable, "-m", "fleetrl", "train", "c51", "--env-id", env_id,
            "--seed", str(seed), "--total-timesteps", str(steps), "--no-cuda", "--no-progress", "--env-backend", "sync",
            "--run-dir", str(run_dir), *(["--policy-lag", "1"] if lag else ["--torch-threads", "1"])], env


def run_one(side: str, env_id: str, seed: int, steps: int, opts: argparse.Namespace, kind: str) -> dict:
    out = Path(opts.out).resolve()
    result_file = out / "results" / f"{kind}_{side}_{env_id}_{seed}_{steps}_{opts.repeat}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    exp = "c51"
    run_dir = out / kind / side / env_id / f"{env_id}__{exp}__{seed}__{opts.repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd, env = command(side, env_id, seed, steps, run_dir, opts)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd, open(out / "last_output.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{side} {env_id} seed {seed} failed ({shlex.join(cmd)}); its output: {out / 'last_output.log'}")
    from fleetrl.monitor.tbread import read_scalars

    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    result = {"side": side, "env_id": env_id, "seed": seed, "steps": steps, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
              "score": float(np.mean(returns[-20:])) if returns else float("nan"), "episodes": len(returns), "command": shlex.join(cmd),
              "loop_sps": read_scalars(run_dir, "charts/SPS")[-1].value}  # both sides: steps / seconds since the loop began
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.write_text(json.dumps(result))
    return result


def speed(opts: argparse.Namespace) -> None:
    sides = opts.sides.split(",")
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(opts.repeats):
        opts.repeat = repeat
        for side in (sides if repeat % 2 == 0 else sides[::-1]):  # alternating
            r = run_one(side, "CartPole-v1", 1, opts.steps, opts, "speed")
            results[side].append(r)
            print(f"{side} repeat {repeat}: {r['steps'] / r['wall_s']:,.0f} SPS (wall), {r['wall_s']:.1f} s", flush=True)
    base = float(np.median([r["steps"] / r["wall_s"] for r in results["cleanrl"]]))
    print(f"\nCartPole-v1, {opts.steps:,} steps a run (learning from 10,000), CleanRL's defaults, seed 1, medians of {opts.repeats}, "
          f"alternating; one process at a time, one torch thread; taskset -c {opts.cpu} (--policy-lag 1: {opts.lag_cpus})\n")
    loop_base = float(np.median([r["loop_sps"] for r in results["cleanrl"]]))
    print("| side | SPS in the loop (charts/SPS) | vs CleanRL | SPS (wall, start-up included) | vs CleanRL | SPS (CPU time) | runs (in-loop SPS) |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for side in sides:
        wall = [r["steps"] / r["wall_s"] for r in results[side]]
        cpu = [r["steps"] / r["cpu_s"] for r in results[side]]
        loop = [r["loop_sps"] for r in results[side]]
        print(f"| {side} | {np.median(loop):,.0f} | {np.median(loop) / loop_base:.2f}x | {np.median(wall):,.0f} | {np.median(wall) / base:.2f}x | "
              f"{np.median(cpu):,.0f} | {', '.join(f'{w:,.0f}' for w in loop)} |")


def learn(opts: argparse.Namespace) -> None:
    opts.repeat = 0
    seeds = [int(s) for part in opts.seeds.split(",") for s in
             (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))]
    for env_id in opts.env_ids.split(","):
        for i, seed in enumerate(seeds):
            for side in (["fleetrl", "cleanrl"] if i % 2 == 0 else ["cleanrl", "fleetrl"]):
                r = run_one(side, env_id, seed, opts.steps, opts, "learn")
                print(f"{side} {env_id} seed {seed}: last-20 mean {r['score']:.1f} ({r['episodes']} episodes), {r['wall_s'] / 60:.1f} min",
                      flush=True)
        out = Path(opts.out).resolve()
        compare = [sys.executable, "-m", "fleetrl", "compare", str(out / "learn" / "fleetrl" / env_id), str(out / "learn" / "cleanrl" / env_id),
                   "--labels", "fleetrl c51", "CleanRL c51.py", "--out", str(out / "compare" / env_id),
                   "--score-bounds", f"{env_id}={SCORE_BOUNDS[env_id]}"]
        print(f"$ {shlex.join(compare)}", flush=True)
        subprocess.run(compare, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--lockstep", action="store_true")
    mode.add_argument("--speed", action="store_true")
    mode.add_argument("--learn", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="[lockstep 4,000; speed 30,000; learn 500,000]")
    parser.add_argument("--learning-starts", type=int, default=1000, help="for --lockstep")
    parser.add_argument("--seed", type=int, default=3, help="for --lockstep")
    parser.add_argument("--cleanrl-next-obs", action="store_true", help="for --lockstep: CleanRL's next obs at a termination")
    parser.add_argument("--seeds", default="1-10", help="for --learn: e.g. 1-10 or 1,3,5-8")
    parser.add_argument("--env-ids", default="CartPole-v1,Acrobot-v1", help="for --learn")
    parser.add_argument("--repeats", type=int, default=3, help="for --speed")
    parser.add_argument("--sides", default="cleanrl,fleetrl,fleetrl-lag1", help="for --speed")
    parser.add_argument("--cpu", default="1", help="taskset -c for every run but --policy-lag 1's")
    parser.add_argument("--lag-cpus", default="0,1", help="taskset -c for --policy-lag 1 (its learner process takes a core)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "c51_vs_cleanrl"))
    opts = parser.parse_args()
    if opts.lockstep:
        opts.steps = opts.steps or 4000
        return lockstep(opts)
    if opts.speed:
        opts.steps = opts.steps or 30_000
        return speed(opts)
    opts.steps = opts.steps or 500_000
    return learn(opts)


if __name__ == "__main__":
    main()
