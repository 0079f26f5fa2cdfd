"""`fleetrl preflight`: CPU, GPU and throughput checks, their exit codes and the JSON report."""

from __future__ import annotations

import json
import sys
import types

from conftest import run_fleetrl, run_fleetrl_in_process
from fleetrl.tools import preflight


def test_json_report_on_a_cpu_machine_is_a_note_and_exit_0():
    proc = run_fleetrl("preflight", "--json", "--seconds", "0.5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {"cpu", "gpu", "throughput", "extras", "recommendations", "status"} <= set(report)
    cpu, gpu, throughput = report["cpu"], report["gpu"], report["throughput"]
    assert cpu["usable"] >= 1 and cpu["cpu_count"] >= 1
    assert cpu["status"] == ("warn" if cpu["usable"] < 8 else "ok")
    if not gpu["gpus"] and not gpu["cuda_available"]:  # this test machine: no GPU is a note, not a failure
        assert gpu["status"] == "note"
    assert gpu["torch"] and "nccl_available" in gpu
    assert throughput["status"] == "ok" and throughput["env_id"] == "CartPole-v1"
    assert throughput["steps_per_s"]["sync"] > 0
    assert throughput["auto"]["backend"] in throughput["steps_per_s"]
    recs = report["recommendations"]
    low, high = recs["num_envs_range"]
    assert (low, high) == (2 * cpu["usable"], 4 * cpu["usable"]) and recs["num_envs"] == low
    assert recs["num_envs"] * recs["min_num_steps"] >= 512
    assert report["extras"]["atari"]["installed"]  # the dev setup installs the atari extra
    assert report["status"]["exit_code"] == 0 and report["status"]["wall_s"] > 0  # how fast depends on the machine: not asserted


def test_unknown_env_id_fails_cleanly_with_exit_1():
    proc = run_fleetrl_in_process("preflight", "--env-id", "CartPol-v1")  # the command's own process: the test above
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "FAIL throughput" in proc.stdout and "Unknown --env-id 'CartPol-v1'" in proc.stdout and "CartPole-v1" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("fleetrl: error: preflight failed: throughput")


def fake_nvml(driver: str, gpus: list[tuple[str, int]]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlSystemGetDriverVersion = lambda: driver
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: gpus[h][0]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=gpus[h][1] * 2**30)
    return nvml


def test_an_old_driver_fails_the_gpu_check(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("418.67", [("Tesla V100", 16)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = preflight.check_gpu()
    assert gpu["status"] == "fail" and gpu["driver_ok"] is False
    assert "418.67 is older than 450.80.02" in gpu["message"]
    assert gpu["gpus"] == [{"index": 0, "name": "Tesla V100", "memory_mb": 16 * 1024}]


def test_gpus_with_a_good_driver_and_the_batch_per_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("535.104.05", [("NVIDIA H100", 80), ("NVIDIA H100", 80)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = preflight.check_gpu()
    assert gpu["driver_ok"] is True and len(gpu["gpus"]) == 2
    assert gpu["status"] != "fail"  # here only a warning, as this test's torch cannot use the (fake) GPUs
    gpu["cuda_available"] = True
    cpu = {"usable": 16, "num_envs_range": [32, 64]}
    recs = preflight.recommend(cpu, gpu, {"num_envs": 32, "env_id": "CartPole-v1"})
    assert recs["min_num_steps"] == 32  # 32 envs x 32 steps / 2 GPUs = 512 per GPU
    assert "--nproc_per_node=2" in recs["launch"]

