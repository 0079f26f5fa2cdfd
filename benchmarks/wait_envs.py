"""Envs that wait, env-only (issue 21): throughput and memory of the async backend's stepping plans against gymnasium's
AsyncVectorEnv, and threads against processes. Random actions, no network, `fleetrl bench-env`'s measurement.

    python benchmarks/wait_envs.py                      # the 5 ms env at 32, 64 and 128 envs; the socket simulator at 16
    python benchmarks/wait_envs.py --repeats 1 --seconds 2
    python benchmarks/wait_envs.py --quick --repeats 7  # the 128-against-32 ratio and the memory, nothing else

Rows, alternating within each repeat (A B A B ...), medians of ``--repeats``:
  * ``async (planned)``: what a training run gets with its defaults (the plan from a measured step);
  * ``async W x T``: W worker processes of T stepping threads each, set by hand (threads against processes);
  * ``gym-async``: gymnasium's AsyncVectorEnv, a process per env (what a plain CleanRL loop uses).
RSS is the whole process tree's resident memory while it steps: this process, the env workers and, for the socket
simulator, its server's processes (one per connection). Targets: at 128 envs the planned rate >= 3.2x its rate at 32
envs (4x is the ideal), and the tree's RSS <= 3 GB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's fleetrl, whichever one the venv installed

SLEEP_ENV, SOCKET_ENV = "ppo_speed_envs:Sleep5ms-v0", "socket_sim:SocketSim-v0"


@dataclass(frozen=True)
class Row:
    env_id: str
    num_envs: int
    backend: str  # async or gym-async
    workers: int | None = None  # None: planned
    threads: int | None = None

    @property
    def name(self) -> str:
        if self.backend != "async":
            return self.backend
        return "async (planned)" if self.workers is None else f"async {self.workers} x {self.threads}"


def rows_for(env_id: str, counts: list[int], hand: dict[int, list[tuple[int, int]]]) -> list[Row]:
    out = []
    for n in counts:
        out.append(Row(env_id, n, "async"))
        out += [Row(env_id, n, "async", w, t) for w, t in hand.get(n, [])]
        out.append(Row(env_id, n, "gym-async"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="stepping time per measurement")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables to FILE")
    parser.add_argument("--quick", action="store_true",
                        help="only the planned rows and gym-async of the 5 ms env at 32 and 128 envs (the ratio and memory targets)")
    opts = parser.parse_args()

    import ppo_speed_envs  # noqa: F401  (registers the sleeping envs)
    from socket_sim import running_server

    from fleetrl.cores import cores
    from fleetrl.envs import env_family
    from fleetrl.envs.stepping import SteppingPlan, plan_stepping
    from fleetrl.tools.bench_env import measure

    hand = {64: [(2, 32), (4, 16), (64, 1)], 128: [(2, 64), (8, 16)]}  # threads against processes, set by hand
    if opts.quick:
        rows = rows_for(SLEEP_ENV, [32, 128], {})
    else:
        rows = rows_for(SLEEP_ENV, [32, 64, 128], hand) + rows_for(SOCKET_ENV, [16], {16: [(2, 8), (16, 1)]})
    results: dict[Row, list[tuple[float, float, float]]] = {r: [] for r in rows}
    plans: dict[Row, SteppingPlan] = {}
    with running_server():
        for row in rows:
            if row.backend == "async":
                plans[row] = plan_stepping(row.env_id, env_family(row.env_id), row.num_envs, cores().usable, workers=row.workers,
                                           threads=row.threads)
        for repeat in range(opts.repeats):
            for row in rows:
                plan = plans.get(row)
                results[row].append(measure(row.env_id, row.backend, row.num_envs, opts.seconds, stepping=plan))
                print(f"[{repeat + 1}/{opts.repeats}] {row.env_id} x{row.num_envs} {row.name}: {results[row][-1][0]:,.0f} steps/s",
                      file=sys.stderr, flush=True)

    median = {r: tuple(statistics.median(m[i] for m in results[r]) for i in range(3)) for r in rows}
    lines = ["## Envs that wait, env-only (benchmarks/wait_envs.py)", "",
             f"Host: {platform.processor() or platform.machine()}, {cores().describe()}; "
             f"`python benchmarks/wait_envs.py {' '.join(sys.argv[1:])}`; medians of {opts.repeats}, {opts.seconds:g} s each.", ""]
    for env_id, title in ((SLEEP_ENV, "a pure-Python env whose step sleeps 5 ms"),
                          (SOCKET_ENV, "the socket simulator (loopback TCP, ~0.2 ms of server compute a step)")):
        if not any(r.env_id == env_id for r in rows):
            continue
        lines += [f"### {env_id}: {title}", "", "| envs | backend | workers x threads | env steps/s | vs gym-async | CPU % | tree RSS MB | runs |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in (r for r in rows if r.env_id == env_id):
            gym_rate = median[Row(env_id, row.num_envs, "gym-async")][0]
            rate, cpu, rss = median[row]
            plan = plans.get(row)
            shape = f"{plan.workers} x {plan.threads}" if plan else "a process per env"
            runs = ", ".join(f"{m[0]:,.0f}" for m in results[row])
            lines.append(f"| {row.num_envs} | {row.name} | {shape} | {rate:,.0f} | {rate / gym_rate:.2f}x | {cpu:.0f} | {rss:,.0f} | {runs} |")
        lines.append("")
    at = {n: median[Row(SLEEP_ENV, n, "async")] for n in (32, 128)}
    ratio = at[128][0] / at[32][0]
    lines += [f"- Target: the planned rate at 128 envs >= 3.2x the rate at 32: **{ratio:.2f}x** "
              f"({at[128][0]:,.0f} against {at[32][0]:,.0f} steps/s), {'met' if ratio >= 3.2 else 'NOT met'}.",
              f"- Target: the tree's RSS at 128 sleeping envs <= 3 GB: **{at[128][2] / 1024:.2f} GB**, "
              f"{'met' if at[128][2] <= 3 * 1024 else 'NOT met'} (gym-async: "
              f"{median[Row(SLEEP_ENV, 128, 'gym-async')][2] / 1024:.2f} GB).", ""]
    text = "\n".join(lines)
    print("\n" + text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
