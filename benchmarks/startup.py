"""What a process start costs: importing torch, importing torch._dynamo, and a whole 512-step CartPole run, with and
without torch._dynamo (which torch's own optimizers import on their first call; fleetrl/optim.py's do not).

    python benchmarks/startup.py --repeats 5     # about a minute

Every row is its own fresh process, the rows alternate within each repeat, and the table gives medians of the wall
time and of the CPU time (user + system, from the child's rusage). A tune study, a benchmark grid, torchrun's ranks
and the test suite all pay the start once per process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

RUN = ["train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "512", "--no-cuda", "--no-progress"]
MAIN = "import sys; from fleetrl.cli import main; main(sys.argv[1:])"
ROWS = {
    "python -c 'import torch'": ["-c", "import torch"],
    "python -c 'import torch, torch._dynamo'": ["-c", "import torch, torch._dynamo"],
    "fleetrl train ppo, 512 CartPole steps": ["-c", MAIN, *RUN],
    "the same run, torch._dynamo imported first (as torch.optim.Adam did)": ["-c", "import torch._dynamo; " + MAIN, *RUN],
}


def timed(argv: list[str], run_dir: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    args = [*argv, "--run-dir", run_dir] if "train" in argv else argv
    subprocess.run([sys.executable, *args], check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        timed(ROWS["fleetrl train ppo, 512 CartPole steps"], os.path.join(tmp, "warm"))  # caches: pyc files, measured precision
        for r in range(repeats):
            for name, argv in ROWS.items():
                results[name].append(timed(argv, os.path.join(tmp, f"{r}-{len(results[name])}-{abs(hash(name))}")))
    print(f"medians of {repeats} fresh processes, alternating\n")
    print("| process | wall s | CPU s | wall s, every run |")
    print("| --- | --- | --- | --- |")
    for name, runs in results.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"| {name} | {statistics.median(walls):.2f} | {statistics.median(cpus):.2f} | {', '.join(f'{w:.2f}' for w in walls)} |")


if __name__ == "__main__":
    main()
