"""fleetrl's PQN against CleanRL's pqn.py (issue 35, item 2): a lockstep trace of the two loops, speed side by side, and
learning runs for `fleetrl compare`.

    python benchmarks/pqn_vs_cleanrl.py --lockstep --steps 4096           # same draws: where do the two loops part?
    python benchmarks/pqn_vs_cleanrl.py --speed --steps 50000 --repeats 3  # CartPole, alternating, medians of 3
    python benchmarks/pqn_vs_cleanrl.py --speed --env-id Breakout-v5 --steps 4096 --repeats 3  # vs pqn_atari_envpool.py
    python benchmarks/pqn_vs_cleanrl.py --learn --env-id Acrobot-v1 --seeds 1-3 --out /tmp/pqn_learn
    python benchmarks/pqn_vs_cleanrl.py --report --env-id Acrobot-v1 --out /tmp/pqn_learn   # last-20 means per seed
    fleetrl compare /tmp/pqn_learn/Acrobot-v1/fleetrl /tmp/pqn_learn/Acrobot-v1/cleanrl --labels fleetrl cleanrl \
        --score-bounds Acrobot-v1=-500,0

``--lockstep``: fleetrl's loop (recorded at its calls: the sampler's draws, the actions, the Q(lambda) returns, the
minibatch permutations and each loss) beside CleanRL's pqn.py loop (``plain_pqn`` below: its network, seeding,
storage, act, Q(lambda) and update code as in CleanRL's file) given fleetrl's draws: each step's explore uniform and
random action, and each epoch's permutation. Everything else (the env transitions, the initial weights, the greedy
actions, the returns, the RAdam updates) must then agree bit for bit; the first place they part is printed.

``--speed`` and ``--learn`` run CleanRL's own pqn.py (or pqn_atari_envpool.py), read from ``--cleanrl`` (a CleanRL
checkout or bare mirror) and ported to gymnasium 1.x (two changes: same-step autoreset, 1.x's final_info), in a
subprocess with one torch thread under ``taskset -c --cpus``; SPS as CleanRL prints it (its last ``SPS:`` line) and as
fleetrl logs it (charts/SPS).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLEANRL = "/work/.mirror/vwxyzjn+cleanrl/repo"
SPS_LINE = re.compile(r"^SPS: (\d+)", re.M)
# gymnasium 1.x's port of CleanRL's pqn.py (CleanRL pins gymnasium 0.29): same-step autoreset, and final_info's new shape
PORT = [
    ("        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) for i in range(args.num_envs)]\n    )",
     "        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) for i in range(args.num_envs)],\n"
     "        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"),
    ('            if "final_info" in infos:\n                for info in infos["final_info"]:\n',
     '            if "final_info" in infos and "_episode" in infos["final_info"]:  # gymnasium 1.x: a dict of arrays with masks\n'
     '                for i in infos["final_info"]["_episode"].nonzero()[0]:\n'
     '                    info = {"episode": {k: infos["final_info"]["episode"][k][i] for k in ("r", "l")}}\n'),
]
# pqn_atari_envpool.py imports gym 0.x (not installed with gymnasium 1.x): envpool's gymnasium API, and its wrapper
# given the vector's spaces (gymnasium 1.x wrappers forward no other attributes); the loop and its arithmetic unchanged
PORT_ATARI = [
    ("import gym\n", "import gymnasium as gym\n"),
    ('env_type="gym",', 'env_type="gymnasium",'),
    # the gymnasium vector has these, read-only
    ("    envs.num_envs = args.num_envs\n    envs.single_action_space = envs.action_space\n"
     "    envs.single_observation_space = envs.observation_space\n", ""),
    ("        observations = super().reset(**kwargs)\n", "        observations, _ = super().reset(**kwargs)\n"),
    ("        observations, rewards, dones, infos = super().step(action)\n",
     "        observations, rewards, terminations, truncations, infos = super().step(action)\n"
     "        dones = np.logical_or(terminations, truncations)\n"),
    ("    envs = RecordEpisodeStatistics(envs)\n",
     "    envs = RecordEpisodeStatistics(envs)\n    envs.single_action_space, envs.single_observation_space = envs.action_space, envs.observation_space\n"),
]


# ============================================================================ CleanRL's loop, for the lockstep trace
@dataclass
class Trace:
    """What a PQN loop did: every step's actions (all envs), every iteration's Q(lambda) returns, every update's loss."""

    actions: list[list[int]] = field(default_factory=list)
    returns: list[np.ndarray] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    uniforms: list[np.ndarray] = field(default_factory=list)  # fleetrl's draws: per step, (explore uniform, random action)
    permutations: list[np.ndarray] = field(default_factory=list)  # fleetrl's draws: per epoch, the minibatch order
    truncations: int = 0


def plain_pqn(env_id: str, steps: int, seed: int, draws: Trace, trace: Trace, num_envs: int = 4, num_steps: int = 128) -> None:
    """CleanRL's pqn.py main loop (defaults), gymnasium 1.x same-step autoreset, with fleetrl's draws from ``draws``."""
    import gymnasium as gym
    import torch
    import torch.nn.functional as F
    import torch.optim as optim
    from torch import nn

    from fleetrl.nets import layer_init

    class QNetwork(nn.Module):  # CleanRL's, verbatim
        def __init__(self, env):
            super().__init__()
            self.network = nn.Sequential(
                layer_init(nn.Linear(np.array(env.single_observation_space.shape).prod(), 120)), nn.LayerNorm(120), nn.ReLU(),
                layer_init(nn.Linear(120, 84)), nn.LayerNorm(84), nn.ReLU(),
                layer_init(nn.Linear(84, env.single_action_space.n)),
            )

        def forward(self, x):
            return self.network(x)

    def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
        slope = (end_e - start_e) / duration
        return max(slope * t + start_e, end_e)

    learning_rate, update_epochs, num_minibatches, gamma, max_grad_norm, q_lambda = 2.5e-4, 4, 4, 0.99, 10.0, 0.65
    start_e, end_e, exploration_fraction, total_timesteps = 1, 0.05, 0.5, steps
    batch_size = num_envs * num_steps
    minibatch_size, num_iterations = batch_size // num_minibatches, total_timesteps // batch_size
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cpu")
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make(env_id)) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    q_network = QNetwork(envs).to(device)
    optimizer = optim.RAdam(q_network.parameters(), lr=learning_rate)
    obs = torch.zeros((num_steps, num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((num_steps, num_envs) + envs.single_action_space.shape).to(device)
    rewards = torch.zeros((num_steps, num_envs)).to(device)
    dones = torch.zeros((num_steps, num_envs)).to(device)
    values = torch.zeros((num_steps, num_envs)).to(device)
    global_step = 0
    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(num_envs).to(device)
    draw, epoch_draw = iter(draws.uniforms), iter(draws.permutations)
    for iteration in range(1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * learning_rate
        for step in range(0, num_steps):
            global_step += num_envs
            obs[step] = next_obs
            dones[step] = next_done
            epsilon = linear_schedule(start_e, end_e, exploration_fraction * total_timesteps, global_step)
            uniform = next(draw)  # fleetrl's draws in place of torch.randint and torch.rand
            random_actions = torch.as_tensor(uniform[:, 1]).long()
            with torch.no_grad():
                q_values = q_network(next_obs)
                max_actions = torch.argmax(q_values, dim=1)
                values[step] = q_values[torch.arange(num_envs), max_actions].flatten()
            explore = torch.as_tensor(uniform[:, 0]) < epsilon
            action = torch.where(explore, random_actions, max_actions)
            actions[step] = action
            trace.actions.append(action.tolist())
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            trace.truncations += int(truncations.sum())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
        with torch.no_grad():  # Compute Q(lambda) targets
            returns = torch.zeros_like(rewards).to(device)
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    next_value, _ = torch.max(q_network(next_obs), dim=-1)
                    nextnonterminal = 1.0 - next_done
                    returns[t] = rewards[t] + gamma * next_value * nextnonterminal
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    next_value = values[t + 1]
                    returns[t] = rewards[t] + gamma * (q_lambda * returns[t + 1] + (1 - q_lambda) * next_value) * nextnonterminal
        trace.returns.append(returns.numpy().copy())
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_returns = returns.reshape(-1)
        for epoch in range(update_epochs):
            b_inds = next(epoch_draw)  # fleetrl's permutation in place of np.random.shuffle
            for start in range(0, batch_size, minibatch_size):
                end = start + minibatch_size
                mb_inds = b_inds[start:end]
                old_val = q_network(b_obs[mb_inds]).gather(1, b_actions[mb_inds].unsqueeze(-1).long()).squeeze()
                loss = F.mse_loss(b_returns[mb_inds], old_val)
                trace.losses.append(loss.item())
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), max_grad_norm)
                optimizer.step()
    envs.close()


def fleetrl_trace(seed: int, steps: int, env_id: str = "CartPole-v1") -> Trace:
    """fleetrl's PQN run, recorded at its calls: the sampler's draws and the actions (rollout), the returns
    (q_lambda_returns), the minibatch order (torch.randperm) and the losses (td_loss)."""
    import torch

    from fleetrl.algos import pqn

    trace = Trace()
    calls = (pqn.rollout, pqn.q_lambda_returns, pqn.td_loss, torch.randperm)

    def recording_rollout(steps_, *args, **kwargs):
        num_actions = kwargs["num_actions"]

        def recorded():
            for due in steps_:
                uniform = np.exp(-due.noise)  # as rollout() reads them
                random_actions = np.minimum(uniform[:, -1] * num_actions, num_actions - 1).astype(np.int64)
                trace.uniforms.append(np.stack([uniform[:, 0], random_actions], 1))
                yield due

        return calls[0](recorded(), *args, **kwargs)

    def recording_returns(b, gamma, q_lambda):
        returns = calls[1](b, gamma, q_lambda)
        trace.returns.append(returns.copy())
        trace.actions += b.actions.tolist()  # every step's actions, as stored and sent
        trace.truncations += int((b.dones & ~b.terminated).sum())
        return returns

    def recording_loss(q_network, mb):
        loss, old_val = calls[2](q_network, mb)
        trace.losses.append(loss.item())
        return loss, old_val

    def recording_randperm(n, *args, **kwargs):
        perm = calls[3](n, *args, **kwargs)
        trace.permutations.append(perm.numpy().copy())
        return perm

    pqn.rollout, pqn.q_lambda_returns, pqn.td_loss, torch.randperm = recording_rollout, recording_returns, recording_loss, recording_randperm
    try:
        with tempfile.TemporaryDirectory() as runs:
            pqn.train(pqn.Args(env_id=env_id, seed=seed, total_timesteps=steps, torch_threads=1, cuda=False, env_backend="sync",
                               precision="fp32", progress=False, run_dir=os.path.join(runs, "run")))
    finally:
        pqn.rollout, pqn.q_lambda_returns, pqn.td_loss, torch.randperm = calls
    return trace


def lockstep(seed: int, steps: int) -> tuple[Trace, Trace]:
    """Both loops on the same draws; returns (fleetrl's trace, CleanRL's)."""
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_trace(seed, steps)
    theirs = Trace()
    plain_pqn("CartPole-v1", steps, seed, ours, theirs)
    return ours, theirs


def first_difference(ours: Trace, theirs: Trace) -> str | None:
    for what in ("actions", "returns", "losses"):
        a, b = getattr(ours, what), getattr(theirs, what)
        for i, (x, y) in enumerate(zip(a, b)):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                return f"{what}[{i}]: fleetrl {x!r} vs CleanRL {y!r}"
        if len(a) != len(b):
            return f"{what}: fleetrl has {len(a)}, CleanRL {len(b)}"
    return None


# ============================================================================ speed and learning (subprocesses)
def cleanrl_script(folder: str, atari: bool, repo: str) -> str:
    """CleanRL's pqn.py (or pqn_atari_envpool.py) from ``repo``, ported to gymnasium 1.x, written into ``folder``."""
    name = "pqn_atari_envpool.py" if atari else "pqn.py"
    git = ["git", "-C", repo, "show", f"HEAD:cleanrl/{name}"]
    text = subprocess.run(git, check=True, capture_output=True, text=True).stdout
    for old, new in PORT_ATARI if atari else PORT:
        if old not in text:
            raise SystemExit(f"{name}: the text to port was not found (has CleanRL's file changed?):\n{old}")
        text = text.replace(old, new)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def timed(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd``; with the CPU seconds (user + system) it and its children took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_side(side: str, env_id: str, steps: int, seed: int, out: str, cpus: str, script: str, extra: list[str]) -> tuple[float, float]:
    """One run: (SPS in the loop, steps per CPU second, start-up included). CleanRL's SPS is its last printed line;
    fleetrl's, its last charts/SPS (the same measure: steps since the loop started over the seconds since)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    if side == "cleanrl":
        cmd = [sys.executable, script, "--env-id", env_id, "--total-timesteps", str(steps), "--seed", str(seed), "--no-cuda", *extra]
        proc, cpu = timed(["taskset", "-c", cpus, *cmd], cwd=out, env=env)
        return float(SPS_LINE.findall(proc.stdout)[-1]), steps / cpu
    if env_id.endswith("-v5"):  # EnvPool's Breakout-v5 (CleanRL's id) is fleetrl's BreakoutNoFrameskip-v4: no sticky actions
        env_id = env_id.split("-v")[0] + "NoFrameskip-v4"
    run_dir = os.path.join(out, "runs", f"{env_id}__pqn__{seed}__{int(time.time() * 1000)}")
    cmd = [os.path.join(ROOT, ".venv", "bin", "fleetrl"), "train", "pqn", "--env-id", env_id, "--total-timesteps", str(steps),
           "--seed", str(seed), "--no-cuda", "--no-progress", "--torch-threads", "1", "--run-dir", run_dir, *extra]
    proc, cpu = timed(["taskset", "-c", cpus, *cmd], env=env)
    from fleetrl.monitor.tbread import read_scalars

    return float(read_scalars(run_dir, "charts/SPS")[-1].value), steps / cpu


def speed(opts: argparse.Namespace) -> None:
    atari = "-v5" in opts.env_id or "NoFrameskip" in opts.env_id
    with tempfile.TemporaryDirectory() as out:
        script = cleanrl_script(out, atari, opts.cleanrl)
        sps: dict[str, list[float]] = {"cleanrl": [], "fleetrl": []}
        per_cpu: dict[str, list[float]] = {"cleanrl": [], "fleetrl": []}
        for repeat in range(opts.repeats):
            for side in (("cleanrl", "fleetrl") if repeat % 2 == 0 else ("fleetrl", "cleanrl")):  # alternating
                flags = opts.fleetrl_flags.split() if side == "fleetrl" else []
                value, cpu = run_side(side, opts.env_id, opts.steps, 1, out, opts.cpus, script, flags)
                sps[side].append(value)
                per_cpu[side].append(cpu)
                print(f"  {side} run {repeat + 1}: {value:,.0f} SPS, {cpu:,.0f} steps per CPU second", flush=True)
    median = {side: float(np.median(v)) for side, v in sps.items()}
    cpu_median = {side: float(np.median(v)) for side, v in per_cpu.items()}
    print(f"\nspeed: {opts.env_id}, {opts.steps:,} steps, CleanRL's defaults, medians of {opts.repeats}, alternating, taskset -c {opts.cpus}, "
          f"one torch thread, fleetrl flags: {opts.fleetrl_flags or '(none)'}\n")
    print("| side | SPS in the loop (median) | all runs | vs CleanRL | steps per CPU second, start-up included (median) | vs CleanRL |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side in ("cleanrl", "fleetrl"):
        runs = ", ".join(f"{v:,.0f}" for v in sps[side])
        print(f"| {side} | {median[side]:,.0f} | {runs} | {median[side] / median['cleanrl']:.2f}x | {cpu_median[side]:,.0f} | "
              f"{cpu_median[side] / cpu_median['cleanrl']:.2f}x |")


def learn(opts: argparse.Namespace) -> None:
    """Alternating seeds, each side's runs under OUT/ENV/SIDE (a folder of run folders for `fleetrl compare`)."""
    low, _, high = opts.seeds.partition("-")
    for seed in range(int(low), int(high or low) + 1):
        for side in ("cleanrl", "fleetrl"):
            out = os.path.join(opts.out, opts.env_id, side)
            os.makedirs(out, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                script = cleanrl_script(tmp, False, opts.cleanrl)
                started = time.time()
                value, _ = run_side(side, opts.env_id, opts.steps, seed, out, opts.cpus, script, [])
            print(f"{opts.env_id} {side} seed {seed}: {value:,.0f} SPS, {time.time() - started:.0f} s", flush=True)


def report(opts: argparse.Namespace) -> None:
    """The mean return of the last 20 episodes of each finished run under OUT/ENV/SIDE/runs (the issue's measure)."""
    from fleetrl.monitor.tbread import read_scalars

    scores: dict[str, dict[int, float]] = {}
    for side in ("cleanrl", "fleetrl"):
        folder = os.path.join(opts.out, opts.env_id, side, "runs")
        for run in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            returns = [p.value for p in read_scalars(os.path.join(folder, run), "charts/episodic_return")]
            steps = [p.step for p in read_scalars(os.path.join(folder, run), "charts/SPS")]
            if returns and steps and steps[-1] >= opts.steps - 1024:  # finished runs only
                scores.setdefault(side, {})[int(run.split("__")[2])] = float(np.mean(returns[-20:]))
    seeds = sorted(set().union(*[set(v) for v in scores.values()]) if scores else set())
    print(f"{opts.env_id}, {opts.steps:,} steps: mean return of the last 20 episodes\n")
    print("| side | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± std |")
    print("| --- |" + " --- |" * (len(seeds) + 1))
    for side, by_seed in scores.items():
        values = [by_seed[s] for s in seeds if s in by_seed]
        cells = " | ".join(f"{by_seed[s]:.1f}" if s in by_seed else "-" for s in seeds)
        print(f"| {side} | {cells} | {np.mean(values):.1f} ± {np.std(values):.1f} ({len(values)} runs) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--report", action="store_true", help="the learning runs' table, from --out")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=None, help="[lockstep 4096, speed 50,000, learn 500,000]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", default="1")
    parser.add_argument("--out", default="pqn_vs_cleanrl")
    parser.add_argument("--cleanrl", default=CLEANRL, help="a CleanRL checkout or bare mirror")
    parser.add_argument("--fleetrl-flags", default="", help="extra flags for fleetrl's side (speed)")
    opts = parser.parse_args()
    if opts.lockstep:
        opts.steps = opts.steps or 4096
        ours, theirs = lockstep(opts.seed, opts.steps)
        where = first_difference(ours, theirs)
        print(f"lockstep, CartPole-v1, seed {opts.seed}, {opts.steps} steps: {len(ours.actions)} acting steps, {len(ours.losses)} updates, "
              f"{ours.truncations} truncations: " + ("identical (actions, Q(lambda) returns, losses)" if where is None else f"first difference: {where}"))
    elif opts.speed:
        opts.steps = opts.steps or 50_000
        speed(opts)
    elif opts.learn or opts.report:
        opts.steps = opts.steps or 500_000
        (learn if opts.learn else report)(opts)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
