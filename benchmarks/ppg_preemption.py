"""How long PPG takes from SIGTERM to exit at Procgen's defaults, and how large the checkpoint it writes is, by where in
the auxiliary phase the signal lands (a checkpoint mid-phase holds the rollouts stored so far in the phase, and a stop
writes them only up to --stop-rollouts-gb, 1 GB by default: above it, the run stops at once and resumes from its last
checkpoint, at a phase's end).

    python benchmarks/ppg_preemption.py                        # StarpilotEasy-v0, SIGTERM in iterations 1, 4 and 31 of the phase
    python benchmarks/ppg_preemption.py --at 31 --stop-rollouts-gb 100     # what writing a whole phase's rollouts costs

Each row is one run of PPG's training loop in its own process, at ppg_procgen.py's Procgen defaults (64 envs x 256 steps,
--n-iteration 32: a phase keeps 2,048 rollouts of 256 frames of 64x64x3 bytes, 6.4 GB), on EnvPool's Procgen. The
process sends itself SIGTERM right after the policy update of the phase's iteration --at, so the time measured is
what the signal costs on top of the iteration it interrupts: the checkpoint (with the phase's stored rollouts) and
the exit. The iteration itself is not timed: a signal that lands at a random moment also waits for the rest of its
iteration, one update of the IMPALA CNN, which takes about a second on a GPU. Here the network is a small stand-in (the
IMPALA CNN's 16,384-sample update takes minutes on two CPU cores, and the checkpoint's rollouts are the env's frames
whatever the network); everything else is the real run: fleetrl's PPO loop with PPG's auxiliary phase, Run's signal
handling, the checkpoint writer (atomic, checksummed, fsynced) and the exit code 143.

Columns: the stored rollouts' GB, SIGTERM to exit (wall seconds, from the signal to the process's end as its parent sees
it), what the stop wrote (the checkpoint's bytes on disk, every file of it; none where it stopped at once: the run then
resumes from the phase's start, here the run's) and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE)]  # this checkout's fleetrl

SIGNALLED = "signalled_at"  # the file in the run folder where the child writes when it sent itself SIGTERM


def child(env_id: str, at: int, run_dir: str, stop_rollouts_gb: float) -> None:
    """PPG's training loop at Procgen's defaults, with a small network, that sends itself SIGTERM after the update of
    iteration ``at``; exits as ``fleetrl train`` does (143 after the checkpoint)."""
    import torch
    from torch import nn

    from fleetrl.algos import ppg, ppo
    from fleetrl.errors import exit_on_error

    class Frames(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.avg_pool2d(x.float() / 255.0, 8).flatten(1)  # 3x8x8: cheap, and the rollouts are the same

    class SmallAgent(ppg.Agent):
        def __init__(self, obs_shape, action_space, impala: bool = False):
            nn.Module.__init__(self)
            self.continuous = False
            self.trunk = nn.Sequential(Frames(), nn.Linear(obs_shape[0] * (obs_shape[1] // 8) * (obs_shape[2] // 8), 32), nn.ReLU())
            self.actor, self.critic, self.aux_critic = nn.Linear(32, int(action_space.n)), nn.Linear(32, 1), nn.Linear(32, 1)
            self.compute_dtype = torch.float32

    class SignalAfter(ppg.AuxiliaryPhase):
        def after_update(self, iteration: int, batch: dict) -> dict:
            stats = super().after_update(iteration, batch)
            if iteration == at:
                Path(run_dir, SIGNALLED).write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's would: caught, the run checkpoints and stops
            return stats

    phase_steps = 64 * 256 * 32
    args = ppg.Args(env_id=env_id, total_timesteps=2 * phase_steps, run_dir=run_dir, cuda=False, progress=False,
                    precision="fp32", seed=1, stop_rollouts_gb=stop_rollouts_gb)
    exit_on_error(lambda: ppo.train(args, None, algo="ppg", family_defaults=ppg.FAMILY_DEFAULTS, validate=ppg.validate,
                                    agent_type=SmallAgent, adam_eps=1e-8, extension=SignalAfter))


def checkpoint_bytes(run_dir: str) -> int:
    """Every file of the newest checkpoint (the .pt, its manifest and its shards); 0 if there is none."""
    from fleetrl import checkpoint

    found = checkpoint.list_checkpoints(run_dir)
    return sum(p.stat().st_size for p in found[-1].parent.glob(f"{found[-1].stem}.*")) if found else 0


def measure(env_id: str, at: int, run_dir: str, stop_rollouts_gb: float) -> tuple[float, int, int]:
    """SIGTERM-to-exit seconds, checkpoint bytes and peak RSS bytes of one run signalled in iteration ``at``."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(at), "--env-id", env_id, "--run-dir", run_dir,
                             "--stop-rollouts-gb", str(stop_rollouts_gb)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    ended = time.time()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read()
    proc.stderr.close()
    if proc.returncode != 128 + signal.SIGTERM or not Path(run_dir, SIGNALLED).exists():
        raise SystemExit(f"the run signalled in iteration {at} ended with {proc.returncode}, not 143 after its checkpoint:\n{stderr[-3000:]}")
    signalled = float(Path(run_dir, SIGNALLED).read_text())
    return ended - signalled, checkpoint_bytes(run_dir), usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="StarpilotEasy-v0", help="an EnvPool Procgen env")
    parser.add_argument("--at", default="1,4,31", help="the iterations of the phase (1-31) in which SIGTERM lands, comma-separated")
    parser.add_argument("--stop-rollouts-gb", type=float, default=1.0, help="PPG's flag: the most stored rollouts a stop writes")
    parser.add_argument("--keep-run-dir", default=None, help="keep the runs here (ROOT/at_K) instead of a temporary folder")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child is not None:
        child(opts.env_id, opts.child, opts.run_dir, opts.stop_rollouts_gb)
        return
    at = [int(a) for a in opts.at.split(",")]
    if any(not 1 <= a <= 31 for a in at):
        parser.error(f"--at {opts.at}: each must be an iteration of the phase before its last (the auxiliary phase), 1 to 31")
    rows = []
    with tempfile.TemporaryDirectory(dir=opts.keep_run_dir and os.path.dirname(os.path.abspath(opts.keep_run_dir))) as tmp:
        root = opts.keep_run_dir or tmp
        for a in at:
            seconds, size, rss = measure(opts.env_id, a, os.path.join(root, f"at_{a}"), opts.stop_rollouts_gb)
            rows.append((a, seconds, size, rss))
            print(f"  SIGTERM in iteration {a}: {seconds:.1f} s, checkpoint {size / 1e9:.2f} GB, peak RSS {rss / 2**30:.1f} GiB", flush=True)
    frames_gb = 256 * 64 * 3 * 64 * 64 / 1e9  # an iteration's rollouts
    print(f"\nPPG on {opts.env_id}, Procgen's defaults (64 envs x 256 steps, --n-iteration 32), --stop-rollouts-gb "
          f"{opts.stop_rollouts_gb:g}, SIGTERM after the update of the phase's iteration K; {os.cpu_count()} CPUs")
    print("| SIGTERM in iteration | rollouts stored | SIGTERM to exit (s) | checkpoint written | peak RSS |")
    print("|---:|---:|---:|---:|---:|")
    for a, seconds, size, rss in rows:
        written = f"{size / 1e9:.2f} GB" if size else "none: resumes from the phase's start"
        print(f"| {a} of 32 | {a * 64:,} ({a * frames_gb:.1f} GB) | {seconds:.1f} | {written} | {rss / 2**30:.1f} GiB |")


if __name__ == "__main__":
    main()
