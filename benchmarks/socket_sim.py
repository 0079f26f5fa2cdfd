"""A simulator in a server process, and the env that talks to it over a loopback TCP socket (issue 21's realistic env).

    python benchmarks/socket_sim.py                       # start a server, print its port, serve until Ctrl-C
    FLEETRL_SOCKET_SIM_PORT=PORT fleetrl train ppo --env-id socket_sim:SocketSim-v0 ...   (benchmarks/ on PYTHONPATH)

Each env opens its own connection; the server forks a process per connection (as a simulator with one instance per
client does). A step sends the action, the server computes for about ``COMPUTE_US`` (a busy loop: a physics step
written in Python) and replies with the observation, reward and flags. The env itself computes almost nothing: its
step waits on the socket. Episodes are truncated at ``EPISODE_LENGTH`` steps, on the server.

:func:`running_server` starts and stops the server with the benchmark that uses it.
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

PORT_VAR = "FLEETRL_SOCKET_SIM_PORT"
COMPUTE_US = 200.0
EPISODE_LENGTH = 500
OBS_DIM = 8
REQUEST = struct.Struct("<cq")  # b"r" + seed (-1: none) | b"s" + action
REPLY = struct.Struct(f"<{OBS_DIM}fd??")  # observation, reward, terminated, truncated


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
                end = time.perf_counter() + COMPUTE_US * 1e-6
                while time.perf_counter() < end:  # the simulator's own computation
                    pass
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
            raise RuntimeError(f"SocketSim-v0 needs its server: start one with `python benchmarks/socket_sim.py` and set {PORT_VAR}.")
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
