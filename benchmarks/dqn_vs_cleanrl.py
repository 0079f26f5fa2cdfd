"""fleetrl's DQN against CleanRL's dqn.py on CartPole-v1 (issue 22, item 9): the final returns of many seeds, with
exact two-sample tests, and a lockstep trace of the two loops.

    python benchmarks/dqn_vs_cleanrl.py --seeds 1-10                   # both sides, 500k steps (CleanRL's defaults)
    python benchmarks/dqn_vs_cleanrl.py --seeds 1-10 --sides cleanrl,fleetrl,fleetrl-orthogonal --markdown out.md
    python benchmarks/dqn_vs_cleanrl.py --lockstep --steps 60000       # same init, same draws: where do they diverge?

Sides: ``cleanrl`` is CleanRL's dqn.py loop (benchmarks/plain_offpolicy.py: its network and default init, its RNG
streams, SB3's buffer, gymnasium 1.x same-step autoreset); ``fleetrl`` is ``fleetrl.algos.dqn.train``;
``fleetrl-orthogonal`` is fleetrl with its network re-initialised as before issue 22 (CleanRL's PPO orthogonal init:
gain sqrt(2) inside, 1.0 on the output, zero biases). ``cleanrl-numpy-draws`` and ``cleanrl-fused-adam`` are CleanRL's
loop with one of fleetrl's two remaining differences each (plain_dqn's switches).

Each run is a subprocess under ``nice -n 19`` with one torch thread, ``--parallel`` (2) at a time; its episode
returns are kept in ``--results`` (one JSON per side and seed), so a second call prints the table without rerunning.
A run's score is the mean return of its last 20 episodes (the issue's measure); the table also gives the last 100.
The two sides are compared with exact permutation tests (all splits of the pooled scores when there are at most a
million, else 200,000 random ones): the Mann-Whitney U statistic (midranks: many runs tie at 500) and the difference
of the means.

``--lockstep``: fleetrl's loop (recorded at its engine calls) and CleanRL's loop (its own network, seeded as in
dqn.py) given fleetrl's exploration draws (one uniform pair a step from numpy's global RNG) and its fused Adam. Both
then take the same actions, updates and losses, bit for bit, unless something else differs; the first step where
they part is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_MARKER = "DQN_VS_CLEANRL_RESULT "
ENV_ID = "CartPole-v1"
STEPS = 500_000  # CleanRL's dqn.py default --total-timesteps
LEARNING_STARTS = 10_000  # and its --learning-starts
LAST = (20, 100)  # episodes averaged for a run's score (the first is the tested one)
SIDES = ("cleanrl", "fleetrl", "fleetrl-orthogonal", "cleanrl-numpy-draws", "cleanrl-fused-adam")
EXACT_LIMIT = 1_000_000  # splits enumerated for an exact test; more are sampled
SAMPLED_SPLITS = 200_000
WINDOW = 50_000  # steps per point of the learning curves


# ============================================================================ one run, in its own process
def orthogonal_q_network() -> None:
    """Make fleetrl's QNetwork start as it did before issue 22: CleanRL's PPO init, not its dqn.py's."""
    from torch import nn

    from fleetrl.algos import dqn
    from fleetrl.nets import layer_init

    default_init = dqn.QNetwork.__init__

    def init(self, obs_shape, num_actions):
        default_init(self, obs_shape, num_actions)
        linears = [m for m in self.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        for layer in linears:
            layer_init(layer, std=1.0 if layer is linears[-1] else math.sqrt(2))  # and zero biases

    dqn.QNetwork.__init__ = init


def run_one(side: str, seed: int, steps: int) -> list[float]:
    """The episode returns of one run of ``side``."""
    import torch

    torch.set_num_threads(1)
    if side.startswith("cleanrl"):
        sys.path.insert(0, HERE)
        import plain_offpolicy

        return plain_offpolicy.plain_dqn(ENV_ID, steps, LEARNING_STARTS, seed=seed, numpy_draws=side == "cleanrl-numpy-draws",
                                         fused_adam=side == "cleanrl-fused-adam").episode_returns
    from fleetrl.algos import dqn

    if side == "fleetrl-orthogonal":
        orthogonal_q_network()
    with tempfile.TemporaryDirectory() as runs:
        args = dqn.Args(env_id=ENV_ID, seed=seed, total_timesteps=steps, torch_threads=1, cuda=False, env_backend="sync",
                        run_dir=os.path.join(runs, "run"), progress=False)
        return dqn.train(args).episode_returns


def launch(side: str, seed: int, opts: argparse.Namespace) -> dict:
    path = os.path.join(opts.results, f"{side}-{seed}-{opts.steps}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    cmd = ["nice", "-n", "19", sys.executable, __file__, "--run-one", side, "--seed", str(seed), "--steps", str(opts.steps)]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        return {"side": side, "seed": seed, "error": proc.stderr.strip().splitlines()[-5:]}
    result = {"side": side, "seed": seed, "steps": opts.steps, "minutes": (time.perf_counter() - started) / 60,
              "returns": json.loads(lines[-1][len(RESULT_MARKER):])}
    os.makedirs(opts.results, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f)
    return result


# ============================================================================ statistics
def midranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of their ranks."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def permutation_tests(a: list[float], b: list[float], rng_seed: int = 0) -> dict[str, float]:
    """Two-sided permutation p-values of the Mann-Whitney U of ``a`` (midranks) and of mean(a) - mean(b)."""
    pooled = np.asarray(a + b, dtype=np.float64)
    n, k = len(pooled), len(a)
    ranks = midranks(pooled)
    if math.comb(n, k) <= EXACT_LIMIT:
        splits = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
    else:
        rng = np.random.default_rng(rng_seed)
        splits = np.argsort(rng.random((SAMPLED_SPLITS, n)), axis=1)[:, :k]
    rank_sums = ranks[splits].sum(1)
    u = rank_sums - k * (k + 1) / 2
    u_null = k * (n - k) / 2
    sums = pooled[splits].sum(1)
    diffs = sums / k - (pooled.sum() - sums) / (n - k)
    u_obs = ranks[:k].sum() - k * (k + 1) / 2
    diff_obs = float(np.mean(a) - np.mean(b))
    tolerance = 1e-9  # the observed split is one of the splits: compare with a margin for rounding
    return {"u": float(u_obs), "u_p": float(np.mean(np.abs(u - u_null) >= abs(u_obs - u_null) - tolerance)),
            "mean_diff": diff_obs, "mean_p": float(np.mean(np.abs(diffs) >= abs(diff_obs) - tolerance)),
            "exact": math.comb(n, k) <= EXACT_LIMIT}


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def score(returns: list[float], last: int) -> float:
    return float(np.mean(returns[-last:]))


def window_means(returns: list[float], steps: int) -> list[float]:
    """The mean return of the episodes that ended in each WINDOW steps (a CartPole episode's return is its length, so
    the episodes' ends are the running sum of the returns)."""
    r = np.asarray(returns, dtype=np.float64)
    ends = np.cumsum(r)
    return [float(r[(ends > lo) & (ends <= lo + WINDOW)].mean()) for lo in range(0, steps, WINDOW)]


# ============================================================================ lockstep
def lockstep(opts: argparse.Namespace) -> None:
    """Run both loops on one seed with the same init and draws; print where their actions and losses first differ."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    import plain_offpolicy

    fleetrl = fleetrl_trace(opts.seed, opts.steps, opts.learning_starts)
    cleanrl = plain_offpolicy.Trace()
    plain_offpolicy.plain_dqn(ENV_ID, opts.steps, opts.learning_starts, seed=opts.seed, numpy_draws=True, fused_adam=True,
                              trace=cleanrl)
    print(f"lockstep, {ENV_ID}, seed {opts.seed}, {opts.steps:,} steps, learning from step {opts.learning_starts:,}:")
    for name in ("actions", "update_steps", "target_steps", "losses"):
        mine, theirs = np.asarray(getattr(fleetrl, name)), np.asarray(getattr(cleanrl, name))
        same = len(mine) == len(theirs) and np.array_equal(mine, theirs)
        first = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
        print(f"  {name:13s} fleetrl {len(mine):7,} cleanrl {len(theirs):7,}: "
              + ("identical" if same else f"first differ at index {first}"))
        if name == "actions" and first is not None:
            q_mine, q_theirs = fleetrl.q_values.get(first), cleanrl.q_values.get(first)
            print(f"    at step {first:,} fleetrl acts {mine[first]} on Q {q_mine}, cleanrl {theirs[first]} on Q {q_theirs}")


def fleetrl_trace(seed: int, steps: int, learning_starts: int):
    """fleetrl's DQN run, its actions, update and target steps and losses recorded at the engine calls it makes."""
    import plain_offpolicy

    from fleetrl.algos import dqn

    trace, host_forward = plain_offpolicy.Trace(), dqn.host_forward

    def recording_host_forward(module, device):
        forward = host_forward(module, device)

        def q_values_of(obs):
            q_values = forward(obs)
            trace.q_values[len(trace.actions)] = q_values[0].tolist()  # the step about to be taken
            return q_values
        return q_values_of

    dqn.host_forward = recording_host_forward
    try:
        with plain_offpolicy.recording_dqn_loop(trace), tempfile.TemporaryDirectory() as runs:
            dqn.train(dqn.Args(env_id=ENV_ID, seed=seed, total_timesteps=steps, learning_starts=learning_starts, torch_threads=1,
                               cuda=False, env_backend="sync", progress=False, run_dir=os.path.join(runs, "run")))
    finally:
        dqn.host_forward = host_forward
    return trace


# ============================================================================ the table
def parse_seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def table(results: list[dict], sides: list[str], seeds: list[int], opts: argparse.Namespace) -> str:
    by = {(r["side"], r["seed"]): r for r in results}
    lines = [f"Command: `python benchmarks/{os.path.basename(__file__)} {' '.join(sys.argv[1:])}`; {ENV_ID}, "
             f"{opts.steps:,} steps, CleanRL's dqn.py defaults. Mean return of the last {LAST[0]} episodes of each run "
             f"(last {LAST[1]} in brackets).", "",
             "| seed | " + " | ".join(sides) + " |", "| --- | " + " | ".join("---" for _ in sides) + " |"]
    for seed in seeds:
        cells = []
        for side in sides:
            r = by[(side, seed)]
            cells.append("FAILED: " + " / ".join(r["error"]) if "error" in r else
                         f"{score(r['returns'], LAST[0]):.1f} ({score(r['returns'], LAST[1]):.1f})")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    scores = {side: [score(by[(side, s)]["returns"], LAST[0]) for s in seeds if "returns" in by[(side, s)]] for side in sides}
    lines.append("| mean | " + " | ".join(f"{np.mean(scores[s]):.1f}" for s in sides) + " |")
    lines.append("| median | " + " | ".join(f"{np.median(scores[s]):.1f}" for s in sides) + " |")
    lines.append(f"| runs at 475 or more | " + " | ".join(f"{sum(x >= 475 for x in scores[s])} of {len(scores[s])}" for s in sides) + " |")
    lines += ["", f"Two-sided permutation tests against {sides[0]}:", ""]
    for side in sides[1:]:
        for last in LAST:
            ours = [score(by[(side, s)]["returns"], last) for s in seeds if "returns" in by[(side, s)]]
            theirs = [score(by[(sides[0], s)]["returns"], last) for s in seeds if "returns" in by[(sides[0], s)]]
            t = permutation_tests(ours, theirs)
            kind = "exact" if t["exact"] else f"{SAMPLED_SPLITS:,} random splits"
            lines.append(f"- {side}, last {last} episodes: Mann-Whitney U = {t['u']:.1f}, p = {p_text(t['u_p'])}; "
                         f"difference of means {t['mean_diff']:+.1f}, p = {p_text(t['mean_p'])} ({kind}).")
    curves = {side: [window_means(by[(side, s)]["returns"], opts.steps) for s in seeds if "returns" in by[(side, s)]]
              for side in sides}
    lines += ["", f"Learning curves: the mean return of the episodes ending in each {WINDOW // 1000}k steps, averaged over "
              f"the seeds; p: the Mann-Whitney test of the seeds' window means against {sides[0]}.", "",
              "| steps | " + " | ".join(sides) + " |", "| --- | " + " | ".join("---" for _ in sides) + " |"]
    for w, lo in enumerate(range(0, opts.steps, WINDOW)):
        cells = [f"{np.mean([c[w] for c in curves[sides[0]]]):.0f}"]
        for side in sides[1:]:
            t = permutation_tests([c[w] for c in curves[side]], [c[w] for c in curves[sides[0]]])
            cells.append(f"{np.mean([c[w] for c in curves[side]]):.0f} (p {p_text(t['u_p'])})")
        lines.append(f"| {lo // 1000}-{(lo + WINDOW) // 1000}k | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,3,5-8")
    parser.add_argument("--sides", default="cleanrl,fleetrl", help=f"from {', '.join(SIDES)}; the first is the reference")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (each one torch thread, niced)")
    parser.add_argument("--results", default=os.path.join(ROOT, "runs", "dqn_vs_cleanrl"), help="one JSON per run, reused")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--lockstep", action="store_true", help="trace both loops on one seed (--seed) instead")
    parser.add_argument("--learning-starts", type=int, default=LEARNING_STARTS, help="for --lockstep")
    parser.add_argument("--seed", type=int, default=1, help="for --lockstep")
    parser.add_argument("--run-one", choices=SIDES, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.run_one:
        print(RESULT_MARKER + json.dumps(run_one(opts.run_one, opts.seed, opts.steps)), flush=True)
        return
    if opts.lockstep:
        return lockstep(opts)

    sides, seeds = opts.sides.split(","), parse_seeds(opts.seeds)
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"unknown side(s) {sorted(unknown)}: choose from {', '.join(SIDES)}")
    jobs = [(side, seed) for seed in seeds for side in sides]
    with ThreadPoolExecutor(opts.parallel) as pool:
        results = list(pool.map(lambda job: launch(*job, opts), jobs))
    text = table(results, sides, seeds, opts)
    print(text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
