"""The resource sampler: CPU and memory of the whole process tree, its own cost; the driver-version check."""

import subprocess
import sys
import time
import types

import psutil
import pytest

from fleetrl.monitor.resources import CPU_KEYS, GPU_KEYS, ResourceSampler, gpu_driver_ok

BURN_S = 4.0
# a grandchild of the test process burns one core; its parent (our child) only waits for it
BURN = f"import time\nend = time.time() + {BURN_S}\nwhile time.time() < end: pass\n"
WAITER = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"


@pytest.mark.serial  # real time and real load: run alone (Makefile)
def test_sampler_counts_the_cpu_and_memory_of_descendant_processes():
    child = subprocess.Popen([sys.executable, "-c", WAITER])
    try:
        with ResourceSampler(interval=0.25) as sampler:
            deadline = time.time() + BURN_S - 0.5
            while time.time() < deadline and sampler.latest()["resources/cpu_percent"] < 30:
                time.sleep(0.1)
            sample = sampler.latest()
            sampled = set(sampler._procs)
            grandchildren = {p.pid for p in psutil.Process(child.pid).children()}
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True) + [psutil.Process(child.pid)]:
            proc.kill()  # the burner first: it would otherwise spin on, orphaned, into the next test
        child.wait()
    assert grandchildren and child.pid in sampled and grandchildren <= sampled, (sampled, child.pid, grandchildren)
    # the test process and the waiting child are idle: a busy core can only be the grandchild's
    assert sample["resources/cpu_percent"] > 30, sample
    assert sample["resources/rss_mb"] > 0
    assert sample["resources/system_cpu_percent"] > 0
    assert set(CPU_KEYS) <= set(sample) <= set(CPU_KEYS) | set(GPU_KEYS)


def test_sampler_counts_its_samples_and_their_cpu_cost():
    # how small that cost is, is a speed figure of the machine: not asserted here
    with ResourceSampler(interval=0.05) as sampler:
        time.sleep(0.5)
    assert sampler.samples >= 5
    assert 0 < sampler.sample_cpu_s < 0.5, "the sampler's own CPU time, measured"


def test_context_manager_stops_the_thread_and_latest_has_memory_at_once():
    sampler = ResourceSampler(interval=10.0)
    with sampler:
        assert sampler.latest()["resources/rss_mb"] > 0  # the first sample is taken in start()
        thread = sampler._thread
        assert thread.is_alive()
    assert not thread.is_alive()
    with pytest.raises(ValueError):
        ResourceSampler(interval=0)


def test_gpu_keys_are_absent_without_nvml_or_a_gpu_and_no_warning(recwarn, capsys):
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    except Exception:
        pass
    with ResourceSampler(interval=10.0) as sampler:
        sample = sampler.latest()
    assert not set(GPU_KEYS) & set(sample)
    assert not recwarn.list and capsys.readouterr() == ("", "")


def test_gpu_driver_ok_compares_dotted_versions_as_numbers():
    assert gpu_driver_ok("450.80.02")
    assert not gpu_driver_ok("450.80.01")
    assert gpu_driver_ok("535.104.05")
    assert gpu_driver_ok("470")
    assert not gpu_driver_ok("418.67")
    assert gpu_driver_ok("450.100.1")  # 100 > 80 as numbers, though "100" < "80" as text
    assert gpu_driver_ok("525.60.13", minimum="525.60.13")
    with pytest.raises(ValueError):
        gpu_driver_ok("unknown")


class FakeNVML:
    """Stands in for pynvml on a machine without a GPU: two boards, the second without a power reading."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.shut_down = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= 2:
            raise self.NVMLError("invalid index")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise self.NVMLError("unknown uuid")

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=[40, 80][handle])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=[1024, 3072][handle] * 1024 * 1024)

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle == 1:
            raise self.NVMLError("not supported")
        return 250_000  # milliwatts


def test_gpu_readings_are_averaged_or_summed_over_the_visible_gpus(monkeypatch):
    # no GPU on the test machines: a stand-in NVML checks the keys, units and CUDA_VISIBLE_DEVICES
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with ResourceSampler(interval=10.0) as sampler:
        sample = sampler.latest()
    assert sample["resources/gpu_util"] == 60.0 and sample["resources/gpu_mem_mb"] == 4096.0
    assert sample["resources/gpu_power_w"] == 250.0  # the board without a power reading is left out
    assert fake.shut_down

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at the first invalid entry
    with ResourceSampler(interval=10.0) as sampler:
        sample = sampler.latest()
    assert sample["resources/gpu_util"] == 80.0 and "resources/gpu_power_w" not in sample
