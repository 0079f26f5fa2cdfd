"""A run whose tool is gone (fleetrl/parent_watch.py) gets SIGTERM, checkpoints and stops; the kill that follows a run
that does not stop waits for a checkpoint that is still being written, so a large one (--save-buffer) is never cut."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import fleetrl_env
from fleetrl import checkpoint
from fleetrl.parent_watch import PARENT_PID_ENV

# `fleetrl train` on a slow disk (8 ms a write of up to 8 KiB, each piece in the file as it goes: a DQN checkpoint of
# CartPole with its replay buffer, some 270 writes, takes over 2 s however fast the host, twice the kill's delay; at 20 ms
# it took 5.4 s), watched with a kill 1 s after the SIGTERM instead of 30 s
SLOW_DISK_TRAIN = [sys.executable, "-c", """import sys, time
from fleetrl import checkpoint, parent_watch
parent_watch.KILL_AFTER_S = 1.0
write = checkpoint._HashingWriter.write

def slow_write(self, data):
    view = memoryview(data).cast("B")
    for i in range(0, len(view), 8192):
        write(self, view[i:i + 8192])
        self.f.flush()
        time.sleep(0.008)
    return len(view)

checkpoint._HashingWriter.write = slow_write
from fleetrl.cli import main
main(sys.argv[1:])
""", "train", "dqn"]


@pytest.mark.timeout(180)
def test_a_run_whose_tool_is_gone_finishes_the_checkpoint_it_is_writing_before_any_kill(tmp_path):
    tool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    run_dir = tmp_path / "run"
    run = subprocess.Popen([*SLOW_DISK_TRAIN, "--env-id", "CartPole-v1", "--total-timesteps", "10000000", "--learning-starts", "1000",
                            "--save-buffer", "--checkpoint-every", "100000", "--run-dir", str(run_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**fleetrl_env(), PARENT_PID_ENV: str(tool.pid)})
    try:
        seen = []
        for line in run.stdout:  # training has begun once the first progress line is out
            seen.append(line)
            if line.startswith("step "):
                break
        tool.kill()  # the tool is gone: the run gets SIGTERM, and checkpoints on the slow disk for longer than the kill's 1 s
        tool.wait()
        out = "".join(seen) + run.communicate(timeout=150)[0]
    finally:
        for proc in (tool, run):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert run.returncode == 143, out[-3000:]  # stopped by its SIGTERM, after the checkpoint; not SIGKILLed (-9)
    assert "it is let finish while it makes progress" in out and "stopped by SIGTERM" in out, out[-3000:]
    state = checkpoint.load_checkpoint(run_dir)  # verified against its manifest, its replay shard too
    assert state["global_step"] > 0
