"""What the benchmark scripts share: one way to alternate sides, to run a side in its own (pinned) process,
to run `fleetrl train` and read its scalars, and to print a markdown table. Not run on its own."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARKER = "BENCH_RESULT "  # a child's one line of JSON on stdout
# this checkout's fleetrl, the benchmark envs, and CleanRL's files (their loops: `from loops import ppo`)
sys.path[:0] = [p for p in (HERE, ROOT, os.path.join(HERE, "cleanrl")) if p not in sys.path]


def env_with_path(tree: str = ROOT, **extra: str) -> dict[str, str]:
    """The environment for a child: ``tree``'s fleetrl and its benchmarks/ first on PYTHONPATH (the benchmark envs)."""
    path = os.pathsep.join(p for p in (tree, os.path.join(tree, "benchmarks"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def host_line() -> str:
    flags = ""
    model = platform.processor() or "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        info = open("/proc/cpuinfo").read()
        model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), model)
        flags = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in info)
    return (f"Host: {model}, {os.cpu_count()} cores, flags: {flags or 'no avx512'}; Python {platform.python_version()}; "
            f"load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process, its finished children and its live descendants."""
    import psutil

    total = sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue  # it ended between listing and reading
    return total


def alternate(names: Iterable[str], repeats: int, run: Callable[[str, int], Any], say: Callable[[str, Any], str] = lambda n, r: "") -> dict[str, list]:
    """Every side once per repeat, the order reversed on odd repeats (A B, B A, ...), so drift and load hit all alike."""
    names = list(names)
    out: dict[str, list] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in (names if repeat % 2 == 0 else names[::-1]):
            out[name].append(run(name, repeat))
            print(f"[{repeat + 1}/{repeats}] {name}: {say(name, out[name][-1])}", file=sys.stderr, flush=True)
    return out


def med(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def median_us(fn, calls: int, repeats: int, clock=time.perf_counter) -> float:
    """The median over ``repeats`` of ``calls`` calls' microseconds a call, after a short warm-up."""
    for _ in range(min(calls, 50)):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - start) / calls * 1e6)
    return statistics.median(times)


def add_flags(parser: argparse.ArgumentParser, **flags: Any) -> argparse.ArgumentParser:
    """A ``--name`` flag for each keyword (``_`` becomes ``-``), typed as its default: ``name=default`` or
    ``name=(default, "help")``; a ``False`` default makes a switch."""
    for name, value in flags.items():
        default, text = value if isinstance(value, tuple) else (value, None)
        kind = {"action": "store_true"} if default is False else {"type": type(default), "default": default}
        parser.add_argument("--" + name.replace("_", "-"), help=text, **kind)
    return parser


def seed_list(text: str) -> tuple[int, ...]:
    """``1-3`` or ``1,4,5``."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return tuple(seeds)


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def run_process(argv: list[str], *, cpus: str | None = None, env: dict[str, str] | None = None, cwd: str | None = None,
                timeout: float | None = None, check: bool = True) -> dict[str, Any]:
    """``argv`` in its own process group (a timeout ends its workers too), pinned with ``taskset -c CPUS`` if given:
    its output, exit code, wall seconds, the CPU seconds of its whole tree, and the JSON it printed after MARKER."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen([*(["taskset", "-c", cpus] if cpus else []), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or env_with_path(), cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in out.splitlines() if line.startswith(MARKER)]
    result = {"stdout": out, "stderr": err, "rc": proc.returncode, "wall": time.perf_counter() - started,
              "cpu": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
              "result": json.loads(lines[-1][len(MARKER):]) if lines else None}
    if check and proc.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)[:300]}` failed (exit code {proc.returncode}):\n{(err or out)[-3000:]}")
    return result


def emit(result: Any) -> None:
    """A child's result, for ``run_process``."""
    print(MARKER + json.dumps(result), flush=True)


def train(argv: list[str], tags: Iterable[str] = ("charts/SPS", "charts/SPS_window"), *, launcher: list[str] | None = None,
          tree: str = ROOT, **kw: Any) -> dict[str, Any]:
    """`fleetrl train ARGV` (from ``tree``'s checkout; under ``launcher``, e.g. torchrun's) in a fresh process: every
    point's value of each tag in ``tags``, and run_process's wall and CPU seconds."""
    from fleetrl.monitor.tbread import read_scalars

    with tempfile.TemporaryDirectory(prefix="bench_") as run_dir:
        done = run_process([sys.executable, *(launcher or []), "-m", "fleetrl", "train", *argv, "--run-dir", run_dir, "--no-progress"],
                           env=kw.pop("env", None) or env_with_path(tree), cwd=kw.pop("cwd", None) or run_dir, check=False, **kw)
        if done["rc"] != 0:
            return {**done, "failed": (done["stderr"] or done["stdout"]).strip().splitlines()[-1:]}
        return {**done, **{tag: [p.value for p in read_scalars(run_dir, tag)] for tag in tags}}
