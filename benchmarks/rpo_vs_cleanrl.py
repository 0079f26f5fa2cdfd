"""A user's file against CleanRL's (issue 34): examples/rpo.py (made by `fleetrl new rpo --from ppo`, 28 lines changed)
against CleanRL's own rpo_continuous_action.py (benchmarks/cleanrl/, gymnasium 1.x's three changes) on one MuJoCo env, at
equal steps: learning over seeds (`fleetrl compare`: rliable intervals and P(fleetrl > CleanRL)) and speed.

    python benchmarks/rpo_vs_cleanrl.py --seeds 1-8 --steps 32768 --cpu 1 --out runs/rpo_vs_cleanrl
    python benchmarks/rpo_vs_cleanrl.py --seeds 1-2 --steps 4096 --out runs/rpo_check      # a check, not a measurement

Both run with their defaults (CleanRL's rpo_continuous_action.py's, which fleetrl's copy takes) and one seed each turn,
one process at a time under ``taskset -c CPU`` with one torch thread, the two sides alternating (the first side swaps
from seed to seed), so a busy machine slows both alike. Each run's wall time and CPU time (its rusage: what it used of a
core shared with others) give steps per second of the whole process, start-up included; the in-loop figure is the
last ``charts/SPS`` each logged. SPS columns are medians over the runs. A finished run is kept (OUT/results/) and not
rerun by a second call. Then `fleetrl compare OUT/fleetrl OUT/cleanrl` reads both sides' TensorBoard logs: a run's score
is the mean of its last 10 ``charts/episodic_return`` points, which both log once per finished episode.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = {  # side: (its command, the experiment name in its run folders)
    "fleetrl": ([sys.executable, str(ROOT / "examples" / "rpo.py"), "--no-progress"], "rpo"),
    "cleanrl": ([sys.executable, str(HERE / "cleanrl" / "rpo_continuous_action.py"), "--no-cuda"], "rpo_continuous_action"),
}
LABELS = {"fleetrl": "fleetrl examples/rpo.py", "cleanrl": "CleanRL rpo_continuous_action.py"}


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return [(s.step, s.value) for s in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def last_scalar(run: Path, tag: str) -> list[float]:
    return [value for _, value in scalars(run, tag)]


def step_reaching(run: Path, bar: float) -> float:
    """The step at which the mean of the last 10 episodes first reached ``bar`` (inf: never)."""
    points = scalars(run, "charts/episodic_return")
    values = np.array([v for _, v in points])
    for i in range(10, len(points) + 1):
        if values[i - 10 : i].mean() >= bar:
            return points[i - 1][0]
    return float("inf")


def run_one(side: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One run in a fresh folder; its run folder is moved to OUT/SIDE/ once it finished."""
    result_file = out / "results" / f"{side}_{seed}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    work = out / "work" / f"{side}_{seed}"
    shutil.rmtree(work, ignore_errors=True)  # what an interrupted call left
    work.mkdir(parents=True)
    command, exp_name = SIDES[side]
    command = ["taskset", "-c", str(args.cpu), *command, "--env-id", args.env_id, "--seed", str(seed), "--total-timesteps", str(args.steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(work / "output.log", "w") as log:
        proc = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{side} seed {seed} failed ({shlex.join(command)}); its output: {work / 'output.log'}")
    (run,) = (work / "runs").iterdir()
    assert f"__{exp_name}__{seed}__" in run.name, run.name
    (out / side).mkdir(exist_ok=True)
    shutil.move(str(run), out / side / run.name)
    returns = last_scalar(out / side / run.name, "charts/episodic_return")
    result = {"side": side, "seed": seed, "steps": args.steps, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
              "loop_sps": last_scalar(out / side / run.name, "charts/SPS")[-1], "score": float(np.mean(returns[-10:])),
              "episodes": len(returns), "command": shlex.join(command)}
    result_file.parent.mkdir(exist_ok=True)
    result_file.write_text(json.dumps(result))
    shutil.rmtree(work)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="InvertedPendulum-v5")
    parser.add_argument("--steps", type=int, default=32768, help="steps per run (16 iterations of CleanRL's 2048)")
    parser.add_argument("--seeds", default="1-8", help="FIRST-LAST")
    parser.add_argument("--cpu", type=int, default=1, help="the core every run is pinned to")
    parser.add_argument("--out", default="runs/rpo_vs_cleanrl")
    parser.add_argument("--bar", type=float, default=950, help="a return whose first step (mean of 10 episodes) the table gives")
    parser.add_argument("--score-bounds", default="InvertedPendulum-v5=0,1000", help="for fleetrl compare (its return's range)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    for i, seed in enumerate(seeds_of(args.seeds)):
        for side in (list(SIDES) if i % 2 else list(SIDES)[::-1]):  # alternating, the first side swapping each seed
            r = run_one(side, seed, args, out)
            results[side].append(r)
            print(f"{side} seed {seed}: score {r['score']:.1f} ({r['episodes']} episodes), wall {r['wall_s']:.1f} s, "
                  f"CPU {r['cpu_s']:.1f} s, in-loop SPS {r['loop_sps']:.0f}", flush=True)

    def median(side: str, f) -> float:
        return float(np.median([f(r) for r in results[side]]))

    speeds = {  # column: steps per second of a run
        "SPS (wall)": lambda r: r["steps"] / r["wall_s"], "SPS (CPU time)": lambda r: r["steps"] / r["cpu_s"], "SPS (in-loop)": lambda r: r["loop_sps"]}
    print(f"\n{args.env_id}, {args.steps} steps a run, seeds {args.seeds}, taskset -c {args.cpu}, one torch thread, one run at a time\n")
    print(f"| side | runs | final return, mean ± std | median step reaching {args.bar:g} | " + " | ".join(f"median {c}" for c in speeds) + " |")
    print("| --- " * (4 + len(speeds)) + "|")
    for side in SIDES:
        scores = [r["score"] for r in results[side]]
        reached = [step_reaching(next((out / side).glob(f"*__{SIDES[side][1]}__{r['seed']}__*")), args.bar) for r in results[side]]
        cells = [f"{median(side, f):,.0f}" for f in speeds.values()]
        print(f"| {LABELS[side]} | {len(scores)} | {np.mean(scores):.1f} ± {np.std(scores):.1f} | {np.median(reached):,.0f} "
              f"({sum(np.isfinite(reached))} of {len(reached)} reached) | " + " | ".join(cells) + " |")
    ratios = [f"{median('fleetrl', f) / median('cleanrl', f):.2f}x" for f in speeds.values()]
    print("| fleetrl / CleanRL | | | | " + " | ".join(ratios) + " |\n")

    compare = [sys.executable, "-m", "fleetrl", "compare", str(out / "fleetrl"), str(out / "cleanrl"), "--labels", LABELS["fleetrl"],
               LABELS["cleanrl"], "--out", str(out / "compare"), "--score-bounds", args.score_bounds]
    print(f"$ {shlex.join(compare)}", flush=True)
    subprocess.run(compare, check=True)


if __name__ == "__main__":
    main()
