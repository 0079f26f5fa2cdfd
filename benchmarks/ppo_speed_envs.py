"""The benchmark envs, registered on import for fleetrl's custom-env form (benchmarks/ on PYTHONPATH, which bench.py
sets for its children): ``fleetrl train ppo --env-id ppo_speed_envs:BusyWait200us-v0 --env-backend async ...``

- ``BusyWait200us-v0``: each step burns 200 us of CPU (a simulator written in Python).
- ``Sleep200us-v0``: each step sleeps 200 us (waiting on a remote simulator: no CPU used).
- ``Sleep5ms-v0``: each step sleeps 5 ms (a simulator or server that answers in a few milliseconds; issue 21's env).
- ``Straggler-v0``: busy-wait envs where one env of every 8 is 10x slower (2 ms). Which one is decided at its
  first seeded reset: fleetrl seeds env i with ``seed + i``, so exactly one of 8 consecutive envs has a seed
  divisible by 8, whatever the base seed, and in whichever worker process it was built.
- ``SocketSim-v0``: each step is a round trip over loopback TCP to a simulator server (``python
  benchmarks/ppo_speed_envs.py`` serves; :func:`running_server` starts and stops one around a benchmark), which
  forks a process per connection and computes about 200 us a step (a busy loop); the env itself only waits.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import struct
import subprocess
import sys
import time
from typing import Any, Iterator

import gymnasium as gym
import numpy as np

STEP_US = 200.0
SLOW_FACTOR = 10.0
EPISODE_LENGTH = 500  # episodes truncate here, so resets are part of every measurement
OBS_DIM = 8
PORT_VAR = "FLEETRL_SOCKET_SIM_PORT"
REQUEST = struct.Struct("<cq")  # b"r" + seed (-1: none) | b"s" + action
REPLY = struct.Struct(f"<{OBS_DIM}fd??")  # observation, reward, terminated, truncated


def busy_wait(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class SlowEnv(gym.Env):
    """Vector observations, two actions; each step costs ``step_us`` by busy-waiting or by sleeping."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step_us: float = STEP_US, sleep: bool = False, slow_one_in: int | None = None):
        self.step_us, self.sleep, self.slow_one_in = step_us, sleep, slow_one_in
        self._t = 0
        self._obs = np.zeros(OBS_DIM, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None and self.slow_one_in and seed % self.slow_one_in == 0:
            self.step_us = STEP_US * SLOW_FACTOR
        self._t = 0
        self._obs = self.np_random.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
        return self._obs, {}

    def step(self, action):
        if self.sleep:
            time.sleep(self.step_us * 1e-6)
        else:
            busy_wait(self.step_us)
        self._t += 1
        # something learnable (act on the sign of the first feature), so the update is not degenerate
        reward = 1.0 if int(action) == int(self._obs[0] > 0) else 0.0
        self._obs = self.np_random.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
        return self._obs, reward, False, self._t >= EPISODE_LENGTH, {}


gym.register("BusyWait200us-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US})
gym.register("Sleep200us-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US, "sleep": True})
gym.register("Sleep5ms-v0", entry_point=SlowEnv, kwargs={"step_us": 5000.0, "sleep": True})
gym.register("Straggler-v0", entry_point=SlowEnv, kwargs={"step_us": STEP_US, "slow_one_in": 8})


class SimulatorHandler(socketserver.BaseRequestHandler):
    """One client's simulator: a seeded random walk whose reward is for acting on the sign of the first feature."""

    def handle(self) -> None:
        conn = self.request
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rng, obs, t = np.random.default_rng(), np.zeros(OBS_DIM, np.float32), 0
        while True:
            request = _recv_exactly(conn, REQUEST.size)
            if request is None:
                return
            op, value = REQUEST.unpack(request)
            reward, terminated, truncated = 0.0, False, False
            if op == b"r":
                rng, t = np.random.default_rng(None if value < 0 else value), 0
            else:
                busy_wait(STEP_US)  # the simulator's own computation
                reward = 1.0 if int(value) == int(obs[0] > 0) else 0.0
                t += 1
                truncated = t >= EPISODE_LENGTH
            obs = rng.uniform(-1.0, 1.0, OBS_DIM).astype(np.float32)
            conn.sendall(REPLY.pack(*obs.tolist(), reward, terminated, truncated))


def _recv_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class SocketSimEnv(gym.Env):
    """The client: an env whose every step is a round trip to the simulator server on ``127.0.0.1:$FLEETRL_SOCKET_SIM_PORT``."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, port: int | None = None):
        port = port or int(os.environ.get(PORT_VAR, "0"))
        if not port:
            raise RuntimeError(f"SocketSim-v0 needs its server: start one with `python benchmarks/ppo_speed_envs.py` and set {PORT_VAR}.")
        self._conn = socket.create_connection(("127.0.0.1", port))
        self._conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _ask(self, op: bytes, value: int) -> tuple:
        self._conn.sendall(REQUEST.pack(op, value))
        reply = _recv_exactly(self._conn, REPLY.size)
        if reply is None:
            raise ConnectionError("the simulator server closed the connection")
        *obs, reward, terminated, truncated = REPLY.unpack(reply)
        return np.asarray(obs, np.float32), reward, terminated, truncated

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        obs, *_ = self._ask(b"r", -1 if seed is None else int(seed))
        return obs, {}

    def step(self, action):
        obs, reward, terminated, truncated = self._ask(b"s", int(action))
        return obs, reward, terminated, truncated, {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()


gym.register("SocketSim-v0", entry_point=SocketSimEnv)


class _Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    max_children = 4096  # one process per connection; the default 40 would refuse a larger benchmark


@contextlib.contextmanager
def running_server() -> Iterator[int]:
    """Start the simulator server in a process of its own (and its own process group); yield its port, with
    ``FLEETRL_SOCKET_SIM_PORT`` set for the runs started meanwhile; stop it and every per-client process after."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline().split()[-1])
        before = os.environ.get(PORT_VAR)
        os.environ[PORT_VAR] = str(port)
        try:
            yield port
        finally:
            if before is None:
                os.environ.pop(PORT_VAR, None)
            else:
                os.environ[PORT_VAR] = before
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def main() -> None:
    with _Server(("127.0.0.1", 0), SimulatorHandler) as server:
        print(f"socket simulator listening on port {server.server_address[1]}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()


if __name__ == "__main__":
    main()
