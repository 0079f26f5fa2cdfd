"""The GPU path on a real GPU: CUDA training, two ranks sharing one GPU, NVML in preflight and the resource log.

Marked `gpu`: these run wherever torch sees CUDA (`pytest -m gpu` runs only them) and skip elsewhere.
"""

import json
import subprocess
import sys

import pytest
import torch

from fleetrl.monitor.tbread import read_scalars

from conftest import fleetrl_env, run_fleetrl
from test_flags import run_probed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = ["-m", "fleetrl", "train", "ppo", "--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "64", "--cuda"]


def test_cuda_ppo_trains_on_the_gpu_and_logs_plausible_gpu_resources(tmp_path):
    probes = run_probed(tmp_path, cuda=True)
    # the env steps in the training process: once the agent exists, that process holds CUDA memory (its weights)
    assert probes[-1][2] > 0, probes
    run_dir = tmp_path / "run"
    util = [p.value for p in read_scalars(run_dir, "resources/gpu_util")]
    mem = [p.value for p in read_scalars(run_dir, "resources/gpu_mem_mb")]
    assert util and all(0 <= u <= 100 for u in util), util
    total_mb = torch.cuda.get_device_properties(0).total_memory / 2**20
    assert mem and all(0 < m <= total_mb for m in mem), (mem, total_mb)  # the process's own memory: its CUDA context at least


@pytest.mark.slow
def test_two_ranks_sharing_one_gpu_with_gloo_end_with_replicas_in_sync(tmp_path):
    env = {**fleetrl_env(), "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node=2", *TRAIN, "--total-timesteps", "2048",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replicas in sync: 2 ranks hold bit-identical parameters" in proc.stdout


def test_nccl_for_two_ranks_sharing_one_gpu_is_refused_with_the_fix(tmp_path):
    env = {**fleetrl_env(), "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node=2", *TRAIN, "--total-timesteps", "512", "--dist-backend", "nccl",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "--nproc_per_node=1" in output and "gloo" in output, output[-3000:]


def test_preflight_with_real_nvml_lists_the_gpu_and_exits_0():
    pytest.importorskip("pynvml")
    proc = run_fleetrl("preflight", "--json", "--seconds", "0.5", timeout=120)
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["gpu"]
    assert gpu["cuda_available"] and gpu["gpus"], gpu
    name = torch.cuda.get_device_name(0)
    assert any(g["name"] in name or name in g["name"] for g in gpu["gpus"]), (gpu["gpus"], name)
    assert all(g["memory_mb"] > 1024 for g in gpu["gpus"])
