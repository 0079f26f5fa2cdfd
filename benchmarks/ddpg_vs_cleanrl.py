"""fleetrl's DDPG against CleanRL's ddpg_continuous_action.py (issue 36, item 1): a lockstep trace of the two loops.

    python benchmarks/ddpg_vs_cleanrl.py --lockstep --steps 3000 --learning-starts 1000 --seed 1
    python benchmarks/ddpg_vs_cleanrl.py --speed --env-id HalfCheetah-v5 --steps 12000 --learning-starts 2000 --repeats 3
    python benchmarks/ddpg_vs_cleanrl.py --learn --env-id InvertedPendulum-v5 --seeds 1-10 --steps 100000 --learning-starts 10000

``--lockstep``: fleetrl's loop (``fleetrl.algos.ddpg.train``, which runs TD3's loop with one critic; recorded at its
engine calls) beside CleanRL's ddpg_continuous_action.py loop (``plain_ddpg`` below: its networks, acting, target,
losses, Adam steps and soft updates as its file writes them, on benchmarks/plain_offpolicy.py's SB3-style buffer and
gymnasium 1.x's same-step autoreset). CleanRL's loop is given fleetrl's three differences, each a switch:
``fleetrl_draws`` (warm-up actions from numpy's global RNG, not the action space's own), ``copied_targets`` (the target
networks deep-copied, not built and loaded: the same weights without drawing torch's RNG for discarded ones) and
``fused_adam``. Both then take the same actions, updates and target updates, with the same losses, bit for bit; the
first place they part is printed. tests/test_ddpg.py runs it in ``make test``.

``--speed`` and ``--learn`` run CleanRL's own script (benchmarks/cleanrl/ddpg_continuous_action.py: its file with
gymnasium 1.x's changes) and ``fleetrl train ddpg`` as subprocesses, one at a time, alternating sides, one torch thread
each, pinned with ``taskset -c --cpu``, with the same ``--total-timesteps`` and ``--learning-starts``. Speed: CleanRL's
``charts/SPS`` (steps over the seconds since its loop began; fleetrl's is the same measure) and steps over the whole
process's wall time, start-up included. Learning: each run's TensorBoard folder goes to OUT/learn/SIDE/ENV/, and
``fleetrl compare`` reads them (a run's score: the mean of its last episodes' returns).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
CLEANRL_DDPG = os.path.join(HERE, "cleanrl", "ddpg_continuous_action.py")


@dataclass
class DDPGArgs:  # ddpg_continuous_action.py's defaults
    learning_rate: float = 3e-4
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    exploration_noise: float = 0.1
    policy_frequency: int = 2


@dataclass
class Trace:
    """What a DDPG loop did: every step's action, the global step of every optimiser step (critic, then actor where
    due) with its loss, and the global step of every soft target update. A global step is CleanRL's loop variable."""

    actions: list[np.ndarray] = field(default_factory=list)
    update_steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    target_steps: list[int] = field(default_factory=list)
    final_params: dict[str, Any] = field(default_factory=dict)


def plain_ddpg(env_id: str, steps: int, learning_starts: int, seed: int = 1, args: DDPGArgs = DDPGArgs(), trace: Trace | None = None,
               fleetrl_draws: bool = False, copied_targets: bool = False, fused_adam: bool = False) -> Trace:
    """CleanRL's ddpg_continuous_action.py loop for ``steps`` env steps, with the switches above."""
    import torch
    import torch.nn.functional as F
    import torch.optim as optim

    import plain_offpolicy
    from plain_offpolicy import ReplayBuffer, _seed, _soft_update, make_envs

    sys.path.insert(0, os.path.join(HERE, "cleanrl"))
    from ddpg_continuous_action import Actor, QNetwork  # CleanRL's networks, from its file (benchmarks/cleanrl/)

    trace = Trace() if trace is None else trace
    _seed(seed)
    device = torch.device("cpu")
    envs = make_envs(env_id, seed)
    timing = plain_offpolicy.Timing("ddpg", env_id, steps, learning_starts, torch.get_num_threads())

    actor = Actor(envs).to(device)
    qf1 = QNetwork(envs).to(device)
    if copied_targets:  # fleetrl: copies, drawing nothing
        qf1_target, target_actor = copy.deepcopy(qf1), copy.deepcopy(actor)
    else:
        qf1_target = QNetwork(envs).to(device)
        target_actor = Actor(envs).to(device)
        target_actor.load_state_dict(actor.state_dict())
        qf1_target.load_state_dict(qf1.state_dict())
    fused = {"fused": True} if fused_adam else {}
    q_optimizer = optim.Adam(list(qf1.parameters()), lr=args.learning_rate, **fused)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate, **fused)

    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device)

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=seed)
    space = envs.single_action_space
    for global_step in range(steps):
        # ALGO LOGIC: put action logic here
        if global_step < learning_starts:
            if fleetrl_draws:  # fleetrl: numpy's global RNG (fleetrl.offpolicy.uniform_actions)
                actions = np.random.uniform(space.low, space.high, (envs.num_envs, *space.low.shape)).astype(space.dtype)
            else:
                actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(envs.single_action_space.low, envs.single_action_space.high)
        trace.actions.append(np.array(actions[0]))

        # TRY NOT TO MODIFY: execute the game and log data; save data to reply buffer; handle `final_observation`
        next_obs = plain_offpolicy._step_and_store(envs, obs, actions, rb, timing)

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                next_state_actions = target_actor(data.next_observations)
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                next_q_value = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * (qf1_next_target).view(-1)

            qf1_a_values = qf1(data.observations, data.actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
            trace.update_steps.append(global_step)
            trace.losses.append(qf1_loss.item())

            # optimize the model
            q_optimizer.zero_grad()
            qf1_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                trace.update_steps.append(global_step)
                trace.losses.append(actor_loss.item())
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                # update the target network (CleanRL's loop over the parameters: plain_offpolicy._soft_update)
                _soft_update(args.tau, (actor, target_actor), (qf1, qf1_target))
                trace.target_steps.append(global_step)

    envs.close()
    trace.final_params = {**{f"actor.{k}": v.clone() for k, v in actor.state_dict().items()},
                          **{f"qf1.{k}": v.clone() for k, v in qf1.state_dict().items()},
                          **{f"target_actor.{k}": v.clone() for k, v in target_actor.state_dict().items()},
                          **{f"qf1_target.{k}": v.clone() for k, v in qf1_target.state_dict().items()}}
    return trace


# fleetrl's module names of CleanRL's: the actor's are the same but for the trunk; the critic is critics.0
FLEETRL_NAMES = {"actor.trunk.0.": "actor.fc1.", "actor.trunk.2.": "actor.fc2.", "qf.critics.0.": "qf1.",
                 "target_actor.trunk.0.": "target_actor.fc1.", "target_actor.trunk.2.": "target_actor.fc2.",
                 "qf_target.critics.0.": "qf1_target."}


def fleetrl_trace(env_id: str, steps: int, learning_starts: int, seed: int = 1) -> Trace:
    """fleetrl's DDPG run, recorded at the engine calls TD3's loop makes (fleetrl/algos/td3.py): each step's action
    (``step_envs``), each optimiser step's loss (``optimizer_step``), each soft update (``soft_update``, two a time:
    the actor's target, then the critic's)."""
    from fleetrl import checkpoint
    from fleetrl.algos import ddpg, td3

    trace = Trace()
    calls = (td3.step_envs, td3.optimizer_step, td3.soft_update)
    step_envs, optimizer_step, soft_update = calls

    def record_step(envs, rb, obs, actions, *rest):
        trace.actions.append(np.array(actions[0]))
        return step_envs(envs, rb, obs, actions, *rest)

    def record_update(optimizer, sync, loss):
        trace.update_steps.append(len(trace.actions) - 1)
        trace.losses.append(loss.item())
        return optimizer_step(optimizer, sync, loss)

    def record_target(target, source, tau):
        if isinstance(target, td3.Actor):  # once per target update: the actor's comes first
            trace.target_steps.append(len(trace.actions) - 1)
        return soft_update(target, source, tau)

    td3.step_envs, td3.optimizer_step, td3.soft_update = record_step, record_update, record_target
    try:
        with tempfile.TemporaryDirectory() as runs:
            ddpg.train(ddpg.Args(env_id=env_id, seed=seed, total_timesteps=steps, learning_starts=learning_starts, torch_threads=1,
                                 cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run")))
            state = checkpoint.load_checkpoint(os.path.join(runs, "run"))
    finally:
        td3.step_envs, td3.optimizer_step, td3.soft_update = calls
    for part in ("actor", "qf", "target_actor", "qf_target"):
        for key, value in state[part].items():
            name = f"{part}.{key}"
            for ours, theirs in FLEETRL_NAMES.items():
                name = name.replace(ours, theirs) if name.startswith(ours) else name
            trace.final_params[name] = value
    return trace


def compare(ours: Trace, theirs: Trace) -> dict[str, str]:
    """Each record: "identical", or where the two first part."""
    verdicts = {}
    for name in ("actions", "update_steps", "losses", "target_steps"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        first = next((i for i, (x, y) in enumerate(zip(mine, other)) if not np.array_equal(x, y)), None)
        if first is None and len(mine) == len(other):
            verdicts[name] = f"identical ({len(mine):,})"
        else:
            verdicts[name] = f"fleetrl {len(mine):,}, cleanrl {len(other):,}, first differ at index {first}"
    keys = sorted(theirs.final_params)
    # raveled: CleanRL's action_scale and action_bias come from the vector env's (1, A) bounds, fleetrl's from one env's (A,)
    same = set(ours.final_params) == set(keys) and all(np.array_equal(ours.final_params[k].numpy().ravel(), theirs.final_params[k].numpy().ravel())
                                                       for k in keys)
    verdicts["final parameters"] = "identical" if same else f"differ ({sorted(set(ours.final_params) ^ set(keys))[:4]} unmatched)"
    return verdicts


def lockstep(opts: argparse.Namespace) -> dict[str, str]:
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_trace(opts.env_id, opts.steps, opts.learning_starts, opts.seed)
    theirs = plain_ddpg(opts.env_id, opts.steps, opts.learning_starts, seed=opts.seed, fleetrl_draws=True, copied_targets=True,
                        fused_adam=True)
    verdicts = compare(ours, theirs)
    print(f"lockstep, {opts.env_id}, seed {opts.seed}, {opts.steps:,} steps, learning after step {opts.learning_starts:,}:")
    for name, verdict in verdicts.items():
        print(f"  {name:17s} {verdict}")
    return verdicts


# ============================================================================ subprocess runs: speed and learning
def command(side: str, env_id: str, seed: int, opts: argparse.Namespace, run_dir: str) -> tuple[list[str], dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{HERE}"}
    budget = ["--env-id", env_id, "--seed", str(seed), "--total-timesteps", str(opts.steps), "--learning-starts",
              str(opts.learning_starts), "--no-cuda"]
    if side == "cleanrl":
        env["CLEANRL_RUN_DIR"] = run_dir
        return ["taskset", "-c", opts.cpu, sys.executable, CLEANRL_DDPG, *budget], env
    return ["taskset", "-c", opts.cpu, sys.executable, "-m", "fleetrl", "train", "ddpg", *budget, "--no-progress",
            "--env-backend", "sync", "--torch-threads", "1", "--run-dir", run_dir], env


def run_one(side: str, env_id: str, seed: int, opts: argparse.Namespace, kind: str, repeat: int = 0) -> dict:
    """One run (skipped if its result is on file): wall and CPU seconds, the in-loop SPS, the last 20 episodes' mean."""
    from fleetrl.monitor.tbread import read_scalars

    out = os.path.abspath(opts.out)
    result_file = os.path.join(out, "results", f"{kind}_{side}_{env_id}_{seed}_{opts.steps}_{opts.learning_starts}_{repeat}.json")
    if os.path.exists(result_file):
        return json.load(open(result_file))
    run_dir = os.path.join(out, kind, side, env_id, f"{env_id}__ddpg__{seed}__{repeat}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    cmd, env = command(side, env_id, seed, opts, run_dir)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd, open(os.path.join(out, "last_output.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{side} {env_id} seed {seed} failed ({shlex.join(cmd)}); its output: {os.path.join(out, 'last_output.log')}")
    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    result = {"side": side, "env_id": env_id, "seed": seed, "steps": opts.steps, "wall_s": wall,
              "cpu_s": usage.ru_utime + usage.ru_stime, "loop_sps": read_scalars(run_dir, "charts/SPS")[-1].value,
              "score": float(np.mean(returns[-20:])) if returns else float("nan"), "episodes": len(returns), "command": shlex.join(cmd)}
    os.makedirs(os.path.dirname(result_file), exist_ok=True)
    with open(result_file, "w") as f:
        json.dump(result, f)
    return result


def speed(opts: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"cleanrl": [], "fleetrl": []}
    for repeat in range(opts.repeats):
        for side in (("cleanrl", "fleetrl") if repeat % 2 == 0 else ("fleetrl", "cleanrl")):  # alternating
            r = run_one(side, opts.env_id, 1, opts, "speed", repeat)
            results[side].append(r)
            print(f"{side} repeat {repeat}: {r['loop_sps']:,.0f} SPS in the loop, {r['steps'] / r['wall_s']:,.0f} wall", flush=True)
    loop_base = np.median([r["loop_sps"] for r in results["cleanrl"]])
    wall_base = np.median([r["steps"] / r["wall_s"] for r in results["cleanrl"]])
    print(f"\n{opts.env_id}, {opts.steps:,} steps a run, learning after {opts.learning_starts:,}, CleanRL's other defaults, seed 1, "
          f"medians of {opts.repeats}, alternating; one process at a time, one torch thread, taskset -c {opts.cpu}\n")
    print("| side | SPS in the loop (median) | runs | vs CleanRL | SPS, wall, start-up included (median) | vs CleanRL |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for side, runs in results.items():
        loop, wall = [r["loop_sps"] for r in runs], [r["steps"] / r["wall_s"] for r in runs]
        print(f"| {side} | {np.median(loop):,.0f} | {', '.join(f'{x:,.0f}' for x in loop)} | {np.median(loop) / loop_base:.2f}x | "
              f"{np.median(wall):,.0f} | {np.median(wall) / wall_base:.2f}x |")


def learn(opts: argparse.Namespace) -> None:
    low, _, high = opts.seeds.partition("-")
    for i, seed in enumerate(range(int(low), int(high or low) + 1)):
        for side in (("fleetrl", "cleanrl") if i % 2 == 0 else ("cleanrl", "fleetrl")):
            r = run_one(side, opts.env_id, seed, opts, "learn")
            print(f"{side} {opts.env_id} seed {seed}: last-20 mean {r['score']:.1f} ({r['episodes']} episodes), {r['wall_s'] / 60:.1f} min",
                  flush=True)
    out = os.path.abspath(opts.out)
    compare = [sys.executable, "-m", "fleetrl", "compare", os.path.join(out, "learn", "fleetrl", opts.env_id),
               os.path.join(out, "learn", "cleanrl", opts.env_id), "--labels", "fleetrl ddpg", "CleanRL ddpg_continuous_action.py",
               "--out", os.path.join(out, "compare", opts.env_id)]
    print(f"$ {shlex.join(compare)}", flush=True)
    subprocess.run(compare, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--lockstep", action="store_true")
    mode.add_argument("--speed", action="store_true")
    mode.add_argument("--learn", action="store_true")
    parser.add_argument("--env-id", default="InvertedPendulum-v5")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1, help="for --lockstep")
    parser.add_argument("--seeds", default="1-10", help="for --learn: e.g. 1-10")
    parser.add_argument("--repeats", type=int, default=3, help="for --speed")
    parser.add_argument("--cpu", default="1", help="taskset -c for every run")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "ddpg_vs_cleanrl"))
    opts = parser.parse_args()
    if opts.lockstep:
        lockstep(opts)
    elif opts.speed:
        speed(opts)
    else:
        learn(opts)


if __name__ == "__main__":
    main()
