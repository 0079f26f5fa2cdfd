"""fleetrl's Rainbow against CleanRL's rainbow_atari.py (issue 35, item 3): a lockstep trace of the two loops, and an
Atari run of each side by side at a budget this machine allows.

    python benchmarks/rainbow_vs_cleanrl.py --lockstep --steps 3000 --learning-starts 500   # where do the loops part?
    python benchmarks/rainbow_vs_cleanrl.py --atari --steps 100000 --learning-starts 20000  # both scripts on Breakout

``--lockstep``: fleetrl's loop (``fleetrl.algos.rainbow.train``, recorded at its engine calls) beside CleanRL's
rainbow_atari.py loop (``plain_rainbow`` below: its act and update code as its file writes them, its NoisyLinear and
network classes and its PrioritizedReplayBuffer verbatim from benchmarks/cleanrl_rainbow.py and cleanrl_per.py). Both
run on ``EndlessWalk-v0`` (below), a vector env whose episodes never end: CleanRL's n-step queue and fleetrl's differ
at episode ends, on purpose (fleetrl/algos/rainbow.py), and nowhere else. Four changes make CleanRL's script run there,
none in its arithmetic: its CNN trunk becomes fleetrl's classic-control one (one 120-unit ReLU layer; the noisy
dueling streams 84 wide), its buffer stores float32 observations (it stores uint8 frames), Adam is fused (fleetrl's,
as DQN's), and its ``rb.add`` gets the one env's row, not the (1,) arrays, which numpy 2 refuses to put in a scalar slot
(numpy 1, which CleanRL pins, warned and took the element). Both then take the same actions, updates, target copies, sampled slots, importance weights, new priorities
and losses, bit for bit; the first place they part is printed.

``--atari``: CleanRL's own script (benchmarks/cleanrl/rainbow_atari.py: rainbow_atari.py with gymnasium 1.x's changes,
its run folder from CLEANRL_RUN_DIR) and ``fleetrl train rainbow`` on one Atari game with the same flags, one after the
other (or at the same time, one ``--sides`` each on its own ``--cpu``), one torch thread each, pinned with ``taskset -c``:
SPS and the episodes' returns at that budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
CLEANRL_RAINBOW = HERE / "cleanrl" / "rainbow_atari.py"
# the hyperparameters both loops of the lockstep use: fleetrl's classic-control defaults for Rainbow
LOCKSTEP = dict(learning_rate=2.5e-4, buffer_size=10_000, gamma=0.99, target_network_frequency=500, batch_size=128,
                train_frequency=10, n_step=3, prioritized_replay_alpha=0.5, prioritized_replay_beta=0.4,
                prioritized_replay_eps=1e-6, n_atoms=101, v_min=-100.0, v_max=100.0)


class EndlessWalkEnv(gym.Env):
    """A 4-D state drifting with the action (left or right on its first axis), noise from the env's seeded RNG, a
    reward that is the first coordinate (rounded to float32, so float64 sums of it are the same however stored), and no
    episode end."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.state = np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        push = np.array([1.0 if action == 1 else -1.0, 0.5, -0.5, 0.0], np.float32)
        self.state = (0.9 * self.state + 0.1 * push + 0.1 * self.np_random.standard_normal(4)).astype(np.float32)
        return self.state.copy(), float(np.float32(self.state[0])), False, False, {}


if "EndlessWalk-v0" not in gym.registry:  # (run as a script, this module is imported a second time under its name)
    gym.register("EndlessWalk-v0", entry_point=EndlessWalkEnv)


@dataclass
class Trace:
    """What a Rainbow loop did: each step's action; each update's global step, sampled slots, importance weights, new
    priorities (each sample's loss) and loss; each target copy's global step; the final weights."""

    actions: list[int] = field(default_factory=list)
    update_steps: list[int] = field(default_factory=list)
    target_steps: list[int] = field(default_factory=list)
    indices: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    priorities: list[np.ndarray] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    final_params: dict = field(default_factory=dict)


# ============================================================================ CleanRL's loop, in this process
def plain_rainbow(env_id: str, steps: int, learning_starts: int, seed: int, trace: Trace) -> None:
    """CleanRL's rainbow_atari.py loop for ``steps`` env steps with LOCKSTEP's hyperparameters and the module
    docstring's three changes; ``trace`` records it."""
    import torch
    import torch.nn as nn
    import torch.optim as optim

    import cleanrl_per
    import cleanrl_rainbow
    import plain_offpolicy as po
    from cleanrl_rainbow import NoisyLinear

    a = argparse.Namespace(total_timesteps=steps, learning_starts=learning_starts, **LOCKSTEP)

    class NoisyDuelingDistributionalNetwork(cleanrl_rainbow.NoisyDuelingDistributionalNetwork):
        """CleanRL's network with fleetrl's classic-control trunk for the CNN, and no /255 (vector observations)."""

        def __init__(self, env, n_atoms, v_min, v_max):
            nn.Module.__init__(self)
            self.n_atoms = n_atoms
            self.v_min = v_min
            self.v_max = v_max
            self.delta_z = (v_max - v_min) / (n_atoms - 1)
            self.n_actions = env.single_action_space.n
            self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms))
            self.network = nn.Sequential(nn.Linear(int(np.prod(env.single_observation_space.shape)), 120), nn.ReLU())
            self.value_head = nn.Sequential(NoisyLinear(120, 84), nn.ReLU(), NoisyLinear(84, n_atoms))
            self.advantage_head = nn.Sequential(NoisyLinear(120, 84), nn.ReLU(), NoisyLinear(84, n_atoms * self.n_actions))

        def forward(self, x):
            h = self.network(x)
            value = self.value_head(h).view(-1, 1, self.n_atoms)
            advantage = self.advantage_head(h).view(-1, self.n_actions, self.n_atoms)
            q_atoms = value + advantage - advantage.mean(dim=1, keepdim=True)
            return torch.softmax(q_atoms, dim=2)

    po._seed(seed)
    device = torch.device("cpu")
    envs = po.make_envs(env_id, seed)
    q_network = NoisyDuelingDistributionalNetwork(envs, a.n_atoms, a.v_min, a.v_max).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=a.learning_rate, eps=1.5e-4, fused=True)
    target_network = NoisyDuelingDistributionalNetwork(envs, a.n_atoms, a.v_min, a.v_max).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = cleanrl_per.PrioritizedReplayBuffer(a.buffer_size, envs.single_observation_space.shape, device, a.n_step, a.gamma,
                                             a.prioritized_replay_alpha, a.prioritized_replay_beta, a.prioritized_replay_eps)
    rb.buffer_obs = np.zeros((a.buffer_size, *envs.single_observation_space.shape), np.float32)  # uint8 frames in CleanRL
    rb.buffer_next_obs = np.zeros_like(rb.buffer_obs)

    obs, _ = envs.reset(seed=seed)
    for global_step in range(a.total_timesteps):
        # anneal PER beta to 1
        rb.beta = min(1.0, a.prioritized_replay_beta + global_step * (1.0 - a.prioritized_replay_beta) / a.total_timesteps)

        # ALGO LOGIC: put action logic here
        with torch.no_grad():
            q_dist = q_network(torch.Tensor(obs).to(device))
            q_values = torch.sum(q_dist * q_network.support, dim=2)
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
        trace.actions.append(int(actions[0]))

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs[0], actions[0], rewards[0], real_next_obs[0], terminations[0])  # numpy 2 refuses (1,) arrays into its scalar slots
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > a.learning_starts:
            if global_step % a.train_frequency == 0:
                # reset the noise for both networks
                q_network.reset_noise()
                target_network.reset_noise()
                data = rb.sample(a.batch_size)

                with torch.no_grad():
                    next_dist = target_network(data.next_observations)  # [B, num_actions, n_atoms]
                    support = target_network.support  # [n_atoms]
                    next_q_values = torch.sum(next_dist * support, dim=2)  # [B, num_actions]  # noqa: F841 - CleanRL's

                    # double q-learning
                    next_dist_online = q_network(data.next_observations)  # [B, num_actions, n_atoms]
                    next_q_online = torch.sum(next_dist_online * support, dim=2)  # [B, num_actions]
                    best_actions = torch.argmax(next_q_online, dim=1)  # [B]
                    next_pmfs = next_dist[torch.arange(a.batch_size), best_actions]  # [B, n_atoms]

                    # compute the n-step Bellman update.
                    gamma_n = a.gamma**a.n_step
                    next_atoms = data.rewards + gamma_n * support * (1 - data.dones.float())
                    tz = next_atoms.clamp(q_network.v_min, q_network.v_max)

                    # projection
                    delta_z = q_network.delta_z
                    b = (tz - q_network.v_min) / delta_z  # shape: [B, n_atoms]
                    l = b.floor().clamp(0, a.n_atoms - 1)  # noqa: E741 - CleanRL's name
                    u = b.ceil().clamp(0, a.n_atoms - 1)

                    # (l == u).float() handles the case where bj is exactly an integer
                    # example bj = 1, then the upper ceiling should be uj= 2, and lj= 1
                    d_m_l = (u.float() + (l == b).float() - b) * next_pmfs  # [B, n_atoms]
                    d_m_u = (b - l) * next_pmfs  # [B, n_atoms]

                    target_pmfs = torch.zeros_like(next_pmfs)
                    for i in range(target_pmfs.size(0)):
                        target_pmfs[i].index_add_(0, l[i].long(), d_m_l[i])
                        target_pmfs[i].index_add_(0, u[i].long(), d_m_u[i])

                dist = q_network(data.observations)  # [B, num_actions, n_atoms]
                pred_dist = dist.gather(1, data.actions.unsqueeze(-1).expand(-1, -1, a.n_atoms)).squeeze(1)
                log_pred = torch.log(pred_dist.clamp(min=1e-5, max=1 - 1e-5))

                loss_per_sample = -(target_pmfs * log_pred).sum(dim=1)
                loss = (loss_per_sample * data.weights.squeeze()).mean()

                # update priorities
                new_priorities = loss_per_sample.detach().cpu().numpy()
                rb.update_priorities(data.indices, new_priorities)
                trace.update_steps.append(global_step)
                trace.indices.append(np.asarray(data.indices))
                trace.weights.append(data.weights.squeeze(1).numpy().copy())
                trace.priorities.append(new_priorities.copy())
                trace.losses.append(loss.item())

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % a.target_network_frequency == 0:
                for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(1.0 * param.data + (1.0 - 1.0) * target_param.data)  # tau 1.0
                trace.target_steps.append(global_step)
    envs.close()
    trace.final_params = {k: v.clone() for k, v in q_network.state_dict().items()}


# ============================================================================ fleetrl's loop, recorded
def fleetrl_trace(seed: int, steps: int, learning_starts: int, env_id: str = "EndlessWalk-v0") -> Trace:
    """fleetrl's Rainbow run on ``env_id`` with LOCKSTEP's hyperparameters, recorded at the engine calls DQN's loop makes
    and at the replay buffer's sample and update_priorities."""
    import plain_offpolicy

    from fleetrl import checkpoint
    from fleetrl.algos import rainbow
    from fleetrl.sampling.replay import ReplayBuffer

    trace = Trace()
    sample, update_priorities = ReplayBuffer.sample, ReplayBuffer.update_priorities

    def record_sample(self, batch_size):
        batch = sample(self, batch_size)
        trace.indices.append(batch.indices.copy())
        trace.weights.append(batch.weights.numpy().copy())
        return batch

    def record_priorities(self, indices, errors):
        trace.priorities.append(errors.numpy().copy())
        return update_priorities(self, indices, errors)

    ReplayBuffer.sample, ReplayBuffer.update_priorities = record_sample, record_priorities
    try:
        with plain_offpolicy.recording_dqn_loop(trace), tempfile.TemporaryDirectory() as runs:
            rainbow.train(rainbow.Args(env_id=f"rainbow_vs_cleanrl:{env_id}", seed=seed, total_timesteps=steps, learning_starts=learning_starts,
                                       torch_threads=1, cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run"),
                                       **LOCKSTEP))
            trace.final_params = checkpoint.load_checkpoint(os.path.join(runs, "run"))["q_network"]
    finally:
        ReplayBuffer.sample, ReplayBuffer.update_priorities = sample, update_priorities
    return trace


def compare(ours: Trace, theirs: Trace) -> dict[str, str]:
    """For each record: "identical", or where the two loops first part."""
    out = {}
    for name in ("actions", "update_steps", "target_steps", "indices", "weights", "priorities", "losses"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        first = next((i for i, (x, y) in enumerate(zip(mine, other)) if not np.array_equal(x, y)), None)
        if first is None and len(mine) == len(other):
            out[name] = f"identical ({len(mine):,})"
        else:
            out[name] = f"fleetrl {len(mine):,}, CleanRL {len(other):,}; first differ at {first}"
    ours_params = [v for k, v in ours.final_params.items() if k != "atoms"]
    theirs_params = [v for k, v in theirs.final_params.items() if k != "support"]
    same = len(ours_params) == len(theirs_params) and all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(ours_params, theirs_params))
    out["final weights"] = "identical" if same else "differ"
    return out


def lockstep(opts: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    ours = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts)
    theirs = Trace()
    plain_rainbow("EndlessWalk-v0", opts.steps, opts.learning_starts, opts.seed, theirs)
    print(f"lockstep, EndlessWalk-v0, seed {opts.seed}, {opts.steps:,} steps, learning from step {opts.learning_starts:,}:")
    for name, verdict in compare(ours, theirs).items():
        print(f"  {name:14s} {verdict}")


# ============================================================================ Atari, side by side
def atari_command(side: str, opts: argparse.Namespace, run_dir: Path) -> tuple[list[str], dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{HERE}", "CLEANRL_RUN_DIR": str(run_dir)}
    flags = ["--env-id", opts.env_id, "--seed", str(opts.seed), "--total-timesteps", str(opts.steps),
             "--learning-starts", str(opts.learning_starts), "--buffer-size", str(opts.buffer_size)]
    if side == "cleanrl":
        return ["taskset", "-c", opts.cpu, sys.executable, str(CLEANRL_RAINBOW), *flags, "--no-cuda"], env
    return ["taskset", "-c", opts.cpu, sys.executable, "-m", "fleetrl", "train", "rainbow", *flags, "--no-cuda", "--no-progress",
            "--torch-threads", "1", "--env-backend", "sync", "--run-dir", str(run_dir)], env


def atari(opts: argparse.Namespace) -> None:
    from fleetrl.monitor.tbread import read_scalars

    out = Path(opts.out).resolve()
    rows = []
    for side in ("fleetrl", "cleanrl"):
        result_file = out / f"{side}.json"
        if side not in opts.sides.split(","):
            if result_file.exists():  # the other side's run, made by another invocation (--sides, --cpu)
                rows.append((side, json.loads(result_file.read_text())))
            continue
        if not result_file.exists():
            run_dir = out / side
            shutil.rmtree(run_dir, ignore_errors=True)
            cmd, env = atari_command(side, opts, run_dir)
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as cwd, open(out / f"{side}.log", "w") as log:
                proc = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
            if proc.returncode != 0:
                sys.exit(f"{side} failed ({shlex.join(cmd)}); its output: {out / f'{side}.log'}")
            returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
            losses = [p.value for p in read_scalars(run_dir, "losses/td_loss")]
            result_file.write_text(json.dumps({"wall_s": time.perf_counter() - start, "returns": returns, "last_loss": losses[-1:],
                                               "command": shlex.join(cmd)}))
        rows.append((side, json.loads(result_file.read_text())))
    print(f"\n{opts.env_id}, {opts.steps:,} steps, learning from {opts.learning_starts:,}, buffer {opts.buffer_size:,}, seed {opts.seed}; "
          f"one torch thread each, pinned to a core (taskset)\n")
    print("| side | wall | SPS | episodes | mean return, first 10 | mean return, last 10 | last td_loss |\n| --- | --- | --- | --- | --- | --- | --- |")
    for side, r in rows:
        ret = r["returns"]
        print(f"| {side} | {r['wall_s'] / 60:.1f} min | {opts.steps / r['wall_s']:,.0f} | {len(ret)} | {np.mean(ret[:10]):.1f} | "
              f"{np.mean(ret[-10:]):.1f} | {r['last_loss'][0] if r['last_loss'] else float('nan'):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--lockstep", action="store_true")
    mode.add_argument("--atari", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="[lockstep 3,000; atari 100,000]")
    parser.add_argument("--learning-starts", type=int, default=None, help="[lockstep 500; atari 20,000]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4", help="for --atari")
    parser.add_argument("--buffer-size", type=int, default=100_000, help="for --atari")
    parser.add_argument("--cpu", default="1", help="taskset -c for each run")
    parser.add_argument("--sides", default="fleetrl,cleanrl", help="for --atari: the sides to run here (run each side in "
                        "an invocation of its own, on its own --cpu, to run them at the same time; a finished side's result is kept)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "rainbow_vs_cleanrl"))
    opts = parser.parse_args()
    if opts.lockstep:
        opts.steps, opts.learning_starts = opts.steps or 3000, opts.learning_starts or 500
        return lockstep(opts)
    opts.steps, opts.learning_starts = opts.steps or 100_000, opts.learning_starts or 20_000
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    return atari(opts)


if __name__ == "__main__":
    main()
