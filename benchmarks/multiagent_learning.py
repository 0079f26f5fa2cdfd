"""Parameter-shared PPO (``fleetrl train ppo``) on a PettingZoo game against independent PPO learners and a random
policy, at equal agent steps, several seeds, compared with rliable intervals by ``fleetrl compare`` (issue 37).

    python benchmarks/multiagent_learning.py --env-id mpe2.simple_spread_v3 --seeds 1-10 --steps 500000 --cpu 1

Each seed runs the three in turn (the order alternating between seeds), each pinned to ``--cpu`` with one torch thread:
* ``shared``: ``fleetrl train ppo`` (one network for every agent; PPO's defaults for vector games but ``--num-envs``);
* ``independent``: benchmarks/ippo_pettingzoo.py, CleanRL's ppo.py loop with one network per agent, the same flags;
* ``random``: the same script's uniform random actions.
A run's score is its episodes' mean return (each agent's episode, as fleetrl logs it) over the last ``--window``; the
table and figures come from ``fleetrl compare`` over the three folders.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = ("shared", "independent", "random")


def command(config: str, opts: argparse.Namespace, seed: int, run_dir: str) -> list[str]:
    common = ["--env-id", opts.env_id, "--seed", str(seed), "--total-timesteps", str(opts.steps), "--num-envs", str(opts.num_envs),
              "--run-dir", run_dir]
    pinned = ["taskset", "-c", opts.cpu, sys.executable]
    if config == "shared":
        return [*pinned, "-m", "fleetrl", "train", "ppo", *common, "--env-backend", "sync", "--torch-threads", "1", "--no-progress",
                "--no-cuda"]
    return [*pinned, os.path.join(HERE, "ippo_pettingzoo.py"), *common, *(["--random"] if config == "random" else [])]


def run(config: str, opts: argparse.Namespace, seed: int) -> dict:
    from fleetrl.monitor.tbread import read_scalars

    folder = opts.env_id
    run_dir = os.path.join(opts.out, config, f"{folder}__{config}__{seed}__0")
    result_file = os.path.join(opts.out, "results", f"{config}_{seed}_{opts.steps}.json")
    if os.path.exists(result_file):
        return json.load(open(result_file))
    cmd = command(config, opts, seed, run_dir)
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{config} seed {seed} failed ({shlex.join(cmd)}):\n{done.stderr[-3000:]}")
    returns = [p.value for p in read_scalars(run_dir, "charts/episodic_return")]
    result = {"config": config, "seed": seed, "score": float(np.mean(returns[-opts.window:])), "episodes": len(returns),
              "wall_s": time.perf_counter() - start, "command": shlex.join(cmd)}
    os.makedirs(os.path.dirname(result_file), exist_ok=True)
    json.dump(result, open(result_file, "w"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="mpe2.simple_spread_v3")
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--steps", type=int, default=500_000, help="agent steps per run (rows x steps)")
    parser.add_argument("--num-envs", type=int, default=6, help="agent rows, every config (6: 2 games of 3 agents)")
    parser.add_argument("--window", type=int, default=300, help="the last episodes a run's score averages")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which of shared,independent,random to run")
    parser.add_argument("--cpu", default="1", help="taskset -c for every run")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "multiagent_learning"))
    opts = parser.parse_args()
    opts.out = os.path.abspath(opts.out)
    low, _, high = opts.seeds.partition("-")
    configs = tuple(c for c in CONFIGS if c in opts.configs.split(","))
    if not configs:
        parser.error(f"--configs names none of {','.join(CONFIGS)}")
    scores: dict[str, list[float]] = {c: [] for c in configs}
    for i, seed in enumerate(range(int(low), int(high or low) + 1)):
        for config in (configs if i % 2 == 0 else configs[::-1]):
            r = run(config, opts, seed)
            scores[config].append(r["score"])
            print(f"{config:11s} seed {seed}: mean return of the last {opts.window} agent episodes {r['score']:.2f} "
                  f"({r['episodes']} episodes, {r['wall_s'] / 60:.1f} min)", flush=True)
    print(f"\n{opts.env_id}, {opts.steps:,} agent steps a run, --num-envs {opts.num_envs}, seeds {opts.seeds}\n")
    print("| config | mean score | per seed |\n| --- | --- | --- |")
    for config in configs:
        print(f"| {config} | {np.mean(scores[config]):.2f} | {', '.join(f'{s:.1f}' for s in scores[config])} |")
    compare = [sys.executable, "-m", "fleetrl", "compare", *(os.path.join(opts.out, c) for c in configs), "--labels", *configs,
               "--out", os.path.join(opts.out, "compare")]
    print(f"\n$ {shlex.join(compare)}", flush=True)
    subprocess.run(compare, check=True, env={**os.environ, "PYTHONPATH": ROOT})


if __name__ == "__main__":
    main()
