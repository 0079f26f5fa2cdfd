"""`fleetrl preflight`: the three checks to run before a long training run, and what they mean for the flags.

    fleetrl preflight                                   # CartPole-v1
    fleetrl preflight --env-id BreakoutNoFrameskip-v4 --json

1. CPU: the cores this process may use (``os.cpu_count``, the affinity mask and a cgroup quota: fleetrl/cores.py,
   the count every thread plan uses).
   Fewer than 8 is a warning: the env backends that step in parallel (async worker processes,
   ale/EnvPool threads) have fewer cores to spread over, and the rule of thumb of 2-4 envs per core
   gives a small ``--num-envs``.
2. GPU: the CUDA GPUs NVML sees (name, memory), the driver version (older than 450.80.02 fails),
   torch's version and CUDA build, ``torch.cuda.is_available()`` and NCCL. No GPU is a note: a CPU
   machine is a valid setup.
3. Throughput: a quick ``fleetrl bench-env`` of ``--env-id`` (every backend that can run it, the
   recommended number of envs, one run of about ``--seconds`` each) and the backend ``auto`` picks.

It also lists the installed extras and recommends ``--num-envs``, a backend and a batch size.
Exit code: 0 when nothing failed (warnings and notes included), 1 when a check failed (a driver
that is too old, an env that cannot be built or stepped).
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass

from fleetrl import config
from fleetrl.cores import cores
from fleetrl.errors import EXTRAS, FleetError

RECOMMENDED_CORES = 8
MIN_DRIVER = "450.80.02"
MIN_BATCH_PER_GPU = 512
ENVS_PER_CORE = (2, 4)
MAX_MEASURED_ENVS = 64  # keeps the quick measurement quick on big machines
SLOWER_THAN_FASTEST = 0.8  # auto's pick measured below this share of the fastest: say so

# the modules behind each extra of pyproject.toml (EXTRAS in fleetrl/errors.py has the pip names)
EXTRA_MODULES = {
    "atari": ("ale_py", "cv2"),
    "mujoco": ("mujoco", "imageio"),
    "envpool": ("envpool",),
    "tune": ("optuna",),
    "track": ("wandb",),
}
# not a fleetrl extra: --capture-video writes MP4 through imageio's ffmpeg plugin
VIDEO_MODULES = ("imageio", "imageio_ffmpeg")

LEVELS = ("ok", "note", "warn", "fail")  # in rising severity


class PreflightFailed(FleetError):
    """A check failed: the report was printed; the CLI adds the one-line summary and exits 1."""

    exit_code = 1


@dataclass
class PreflightArgs:
    env_id: str = "CartPole-v1"
    """the environment whose throughput is measured (the one you plan to train on)"""
    seconds: float = 1.0
    """stepping time per backend in the throughput measurement"""
    json: bool = False
    """print the report as one JSON object"""


# ---- 1. CPU ------------------------------------------------------------------------------------


def check_cpu() -> dict:
    found = cores()  # the same count every thread plan uses (fleetrl/cores.py)
    count, affinity, quota, usable = found.machine, found.affinity, found.quota, found.usable
    low, high = ENVS_PER_CORE[0] * usable, ENVS_PER_CORE[1] * usable
    limits = f"{usable} usable core(s)"
    if usable != count:
        limits += f" of the {count} os.cpu_count reports (affinity mask {affinity}" + (f", cgroup quota {quota:g}" if quota else "") + ")"
    if usable < RECOMMENDED_CORES:
        status = "warn"
        message = (
            f"{limits}, fewer than the {RECOMMENDED_CORES} recommended. Use --num-envs {low}-{high} (2-4x cores); "
            f"fewer cores limit how many envs the async (worker processes) and native ale/envpool (threads) backends step in parallel."
        )
    else:
        status = "ok"
        message = f"{limits}: use --num-envs {low}-{high} (2-4x cores)."
    return {
        "status": status,
        "message": message,
        "cpu_count": count,
        "affinity": affinity,
        "cgroup_quota": quota,
        "usable": usable,
        "recommended_min": RECOMMENDED_CORES,
        "num_envs_range": [low, high],
    }


# ---- 2. GPU ------------------------------------------------------------------------------------


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> dict:
    """What NVML says: {"nvml": "ok" | why not, "driver": version or None, "gpus": [{index, name, memory_mb}]}."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "nvidia-ml-py (pynvml) is not installed", "driver": None, "gpus": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA driver here
        return {"nvml": f"no NVIDIA driver ({exc})", "driver": None, "gpus": []}
    try:
        from fleetrl.monitor.resources import visible_gpu_handles

        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i, handle in enumerate(visible_gpu_handles(pynvml)):
            gpu = {"index": i, "name": None, "memory_mb": None}
            try:
                gpu["name"] = _text(pynvml.nvmlDeviceGetName(handle))
                gpu["memory_mb"] = round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20)
            except Exception:
                pass
            gpus.append(gpu)
        return {"nvml": "ok", "driver": driver, "gpus": gpus}
    except Exception as exc:
        return {"nvml": f"NVML failed ({exc})", "driver": None, "gpus": []}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def check_gpu() -> dict:
    from fleetrl.monitor.resources import gpu_driver_ok

    import torch

    report = nvml_gpus()
    report.update(
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=bool(torch.cuda.is_available()),
        nccl_available=bool(torch.distributed.is_available() and torch.distributed.is_nccl_available()),
        min_driver=MIN_DRIVER,
        driver_ok=None,
    )
    gpus, driver = report["gpus"], report["driver"]
    names = ", ".join(f"{g['name']} ({g['memory_mb'] / 1024:.0f} GiB)" if g["memory_mb"] else str(g["name"]) for g in gpus)
    problems = []
    if driver is not None:
        try:
            report["driver_ok"] = gpu_driver_ok(driver, MIN_DRIVER)
        except ValueError:
            report["driver_ok"] = None
            problems.append(("warn", f"cannot read the driver version {driver!r}"))
        if report["driver_ok"] is False:
            problems.append(("fail", f"NVIDIA driver {driver} is older than {MIN_DRIVER}, the oldest that CUDA 11 and NCCL need: update the driver"))
    build = f"torch {report['torch']} (" + (f"CUDA {report['torch_cuda']}" if report["torch_cuda"] else "CPU build") + ")"
    if not gpus and not report["cuda_available"]:
        why = report["nvml"] if report["nvml"] != "ok" else f"NVML lists no GPU, driver {driver}"
        messages = [f"no CUDA GPU ({why}): training runs on the CPU, a valid setup; {build}"] + [m for _, m in problems]
        status = max(["note", *(level for level, _ in problems)], key=LEVELS.index)
        return {**report, "status": status, "message": "; ".join(messages) + "."}
    if report["torch_cuda"] is None:
        problems.append(("warn", "torch is a CPU build, so training will not use the GPU: install the torch build for your CUDA (README, 'On a GPU machine')"))
    elif not report["cuda_available"]:
        problems.append(("warn", f"torch {report['torch']} (CUDA {report['torch_cuda']}) cannot use the GPU: torch.cuda.is_available() is False (driver too old for this CUDA build, or CUDA_VISIBLE_DEVICES hides the GPUs)"))
    if not report["nccl_available"] and report["torch_cuda"] is not None:
        problems.append(("warn", "torch has no NCCL: multi-GPU torchrun would all-reduce with gloo, much slower"))
    status = max(["ok", *(level for level, _ in problems)], key=LEVELS.index)
    summary = f"{len(gpus)} GPU(s): {names}; driver {driver}" if gpus else "torch sees a CUDA device that NVML does not list"
    summary += f"; {build}, cuda available: {report['cuda_available']}, NCCL: {report['nccl_available']}"
    return {**report, "status": status, "message": "; ".join([summary] + [m for _, m in problems]) + "."}


# ---- 3. Throughput -----------------------------------------------------------------------------


def candidate_backends(env_id: str, family) -> tuple[list[str], dict[str, str]]:
    """The backends that can run this env here, and why the others are left out."""
    from fleetrl.envs.native import native_backend_support

    native = native_backend_support(env_id, family.name)
    backends = [] if family.name == "procgen" else ["sync", "async"]
    left_out = {}
    for name in ("ale", "envpool"):
        if native.get(name):
            backends.append(name)
        elif name == "envpool" or family.name == "atari":
            left_out[name] = "not installed, or does not provide this env"
    return backends, left_out


def check_throughput(env_id: str, num_envs: int, seconds: float) -> dict:
    from fleetrl.envs import env_family
    from fleetrl.tools.bench_env import BenchEnvArgs, bench_env

    base = {"env_id": env_id, "num_envs": num_envs, "seconds": seconds}
    try:
        family = env_family(env_id)
        backends, left_out = candidate_backends(env_id, family)
        with warnings.catch_warnings():  # e.g. EnvPool's float64 Box bounds: noise in a short report
            warnings.simplefilter("ignore")
            bench = bench_env(BenchEnvArgs(env_id=env_id, backends=",".join(backends), num_envs=str(num_envs), seconds=seconds, repeats=1), quiet=True)
    except FleetError as exc:
        return {**base, "status": "fail", "message": f"{env_id} cannot be measured: {exc}"}
    except Exception as exc:  # an env that crashes on construction or stepping
        return {**base, "status": "fail", "message": f"{env_id} could not be built or stepped: {type(exc).__name__}: {exc}"}
    skipped = {**left_out, **bench["skipped"]}
    results = {m["backend"]: round(m["steps_per_s"]) for m in bench["results"]}
    auto = bench["auto"][str(num_envs)]
    fastest = bench["fastest"]["backend"] if bench["fastest"] else None
    if not results:
        return {**base, "family": bench["family"], "status": "fail", "steps_per_s": {}, "skipped": skipped, "auto": auto,
                "message": f"no backend could run {env_id}: " + "; ".join(f"{b}: {why}" for b, why in skipped.items())}
    parts = ", ".join(f"{b} {sps:,}" for b, sps in results.items())
    message = f"{env_id} ({bench['family']}), {num_envs} envs: env steps/s {parts}; fastest {fastest}; auto picks {auto['backend']} ({auto['reason']})"
    return {
        **base,
        "family": bench["family"],
        "status": "ok",
        "message": message,
        "steps_per_s": results,
        "frames_per_s": {m["backend"]: round(m["frames_per_s"]) for m in bench["results"]},
        "fastest": fastest,
        "auto": auto,
        "skipped": skipped,
    }


# ---- extras and recommendations ----------------------------------------------------------------


def _importable(module: str) -> str | None:
    """None when ``module`` imports, else why not."""
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
        return None
    except Exception as exc:  # installed but broken (a missing system library, a version clash)
        return f"{type(exc).__name__}: {exc}"


def check_extras() -> dict:
    extras = {}
    for extra, modules in {**EXTRA_MODULES, "video": VIDEO_MODULES}.items():
        missing = {m: why for m in modules if (why := _importable(m)) is not None}
        pip = f"pip install 'fleetrl[{extra}]'" if extra in EXTRAS else "pip install " + " ".join(m.replace("_", "-") for m in modules)
        extras[extra] = {"installed": not missing, "missing": missing, "install": None if not missing else pip}
    extras["video"]["note"] = "--capture-video; MuJoCo without a display also needs MUJOCO_GL=egl (or osmesa)"
    return extras


def recommend(cpu: dict, gpu: dict, throughput: dict) -> dict:
    low, high = cpu["num_envs_range"]
    num_envs = throughput["num_envs"]
    gpus = len(gpu["gpus"]) if gpu.get("cuda_available") else 0
    learners = max(1, gpus)
    # --num-envs is global under torchrun: each GPU's batch is num_envs * num_steps / GPUs
    num_steps = 2 ** math.ceil(math.log2(math.ceil(MIN_BATCH_PER_GPU * learners / num_envs)))
    recs = {
        "num_envs": num_envs,
        "num_envs_range": [low, high],
        "num_envs_reason": f"2-4 envs per core on {cpu['usable']} core(s)",
        "min_num_steps": num_steps,
        "batch_reason": f"num_envs x num_steps per GPU >= {MIN_BATCH_PER_GPU}: {num_envs} x {num_steps}"
        + (f" / {gpus} GPUs (--num-envs is global under torchrun)" if gpus > 1 else "")
        + f" = {num_envs * num_steps // learners}",
    }
    auto = throughput.get("auto")
    if auto:
        recs["backend"] = "auto"
        recs["backend_reason"] = f"auto picks {auto['backend']}: {auto['reason']}"
        steps = throughput.get("steps_per_s", {})
        fastest = throughput.get("fastest")
        picked = steps.get(auto["backend"])
        if fastest and fastest != auto["backend"] and (picked is None or picked < SLOWER_THAN_FASTEST * steps[fastest]):
            measured = f"{picked:,}" if picked is not None else "not measured"
            recs["backend_reason"] += (
                f". Measured here, {fastest} was fastest ({steps[fastest]:,} steps/s against {measured} for {auto['backend']}): "
                f"try --env-backend {fastest}, or `fleetrl bench-env --env-id {throughput['env_id']}` for a longer comparison"
            )
    if gpus > 1:
        recs["launch"] = f"torchrun --standalone --nproc_per_node={gpus} -m fleetrl train ...  (one process per GPU)"
    return recs


# ---- the command -------------------------------------------------------------------------------


def preflight(args: PreflightArgs) -> dict:
    """Run the checks, print the report (JSON or text) and return it; raise PreflightFailed if one failed."""
    config.check_ranges(args, {"seconds": config.positive("stepping time per backend, in seconds")})
    started = time.perf_counter()
    cpu = check_cpu()
    gpu = check_gpu()
    extras = check_extras()
    num_envs = min(MAX_MEASURED_ENVS, cpu["num_envs_range"][0])
    throughput = check_throughput(args.env_id, num_envs, args.seconds)
    recommendations = recommend(cpu, gpu, throughput)
    sections = {"cpu": cpu, "gpu": gpu, "throughput": throughput}
    level = max((s["status"] for s in sections.values()), key=LEVELS.index)
    failed = [f"{name}: {s['message']}" for name, s in sections.items() if s["status"] == "fail"]
    status = {
        "level": level,
        "exit_code": 1 if failed else 0,
        "failed": failed,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    report = {**sections, "extras": extras, "recommendations": recommendations, "status": status}
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        _print_report(report)
    if failed:
        if args.json:  # stdout holds the JSON; stderr gets the whole reason
            raise PreflightFailed("preflight failed: " + " | ".join(failed))
        names = ", ".join(name for name, s in sections.items() if s["status"] == "fail")
        raise PreflightFailed(f"preflight failed: {names} (see the FAIL line above).")
    return report


def _print_report(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(soft_wrap=True, highlight=False)
    style = {"ok": "green", "note": "cyan", "warn": "yellow", "fail": "bold red"}

    def line(level: str, title: str, text: str) -> None:
        console.print(f"[{style[level]}]{level.upper():>4}[/] {title}: {escape(text)}")

    console.print(f"fleetrl preflight ({report['status']['wall_s']:.1f} s)")
    for name, title in (("cpu", "CPU"), ("gpu", "GPU"), ("throughput", "throughput")):
        line(report[name]["status"], title, report[name]["message"])
    extras = report["extras"]
    have = [e for e, v in extras.items() if v["installed"]]
    lack = [f"{e} ({v['install']})" for e, v in extras.items() if not v["installed"]]
    console.print("extras: installed " + escape(", ".join(have) or "none") + ("; missing " + escape(", ".join(lack)) if lack else ""))
    recs = report["recommendations"]
    console.print("recommended:")
    console.print(escape(f"  --num-envs {recs['num_envs']}  ({recs['num_envs_reason']}: {recs['num_envs_range'][0]}-{recs['num_envs_range'][1]})"))
    if "backend" in recs:
        console.print(escape(f"  --env-backend {recs['backend']}  ({recs['backend_reason']})"))
    console.print(escape(f"  --num-steps {recs['min_num_steps']} or more  ({recs['batch_reason']})"))
    if "launch" in recs:
        console.print(escape(f"  {recs['launch']}"))
    status = report["status"]
    console.print(f"result: [{style[status['level']]}]{status['level']}[/] (exit {status['exit_code']})")
    sys.stdout.flush()
