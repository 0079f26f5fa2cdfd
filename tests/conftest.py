"""Shared test helpers: run the real CLI in a subprocess, and find the test env module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


def fleetrl_env(threads: int = 1) -> dict[str, str]:
    """Environment for a fleetrl subprocess: the tests folder importable (custom envs), fixed threads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONFAULTHANDLER"] = "1"  # a worker that aborts (SIGABRT, SIGSEGV) prints its Python stacks into the test output
    return env


def run_fleetrl(*args: str, cwd: str | Path | None = None, timeout: float = 600, threads: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetrl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=fleetrl_env(threads)
    )


def start_fleetrl(*args: str, cwd: str | Path | None = None, threads: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetrl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=fleetrl_env(threads)
    )
