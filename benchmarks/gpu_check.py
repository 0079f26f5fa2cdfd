"""The GPU path, checked and timed in one go: PPO Breakout on one GPU, within about 8 minutes on a 16-core machine.

    python benchmarks/gpu_check.py [--budget-s 480] [--iterations 8] [--markdown FILE]
    python benchmarks/gpu_check.py --cpu-smoke      # the same code paths on the CPU, tiny, to check the script itself

Each row is its own `fleetrl train ppo` process (fresh compile caches, fresh CUDA context), with EnvPool and CleanRL's
Atari defaults except --num-envs. SPS is the median of charts/SPS_window over the iterations after the first two
(compile and cuDNN autotuning land in those); GPU utilisation is the median of resources/gpu_util over the run.
Rows: 64 and 32 envs; compile on and off; bf16 on and off; 1 against 2 processes sharing the GPU (torchrun, gloo).
Rows that would overrun --budget-s are skipped and say so, so the script always ends in time.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench import add_flags, host_line, med, table, train

WARMUP_ITERATIONS = 2  # compile, cuDNN benchmark and allocator warm-up happen here
ROWS = [  # name, processes, global envs, extra flags
    ("64 envs, fp32", 1, 64, ["--precision", "fp32"]),
    ("32 envs, fp32", 1, 32, ["--precision", "fp32"]),
    ("64 envs, bf16", 1, 64, ["--precision", "bf16"]),
    ("64 envs, fp32, compile", 1, 64, ["--precision", "fp32", "--compile"]),
    ("64 envs, bf16, compile", 1, 64, ["--precision", "bf16", "--compile"]),
    ("64 envs, auto (defaults)", 1, 64, []),
    ("2 processes x 32 envs, fp32", 2, 64, ["--precision", "fp32"]),
]


def run_row(processes: int, envs: int, flags: list[str], args: argparse.Namespace, timeout: float) -> dict:
    r = train(["ppo", "--env-id", args.env_id, "--env-backend", args.backend, "--num-envs", str(envs), "--num-steps", str(args.num_steps),
               "--total-timesteps", str(args.iterations * envs * args.num_steps), "--checkpoint-every", "100000",
               "--cuda" if not args.cpu_smoke else "--no-cuda", *flags], ("charts/SPS_window", "resources/gpu_util"), timeout=timeout,
              launcher=["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else None)
    if "failed" in r:
        return {"status": "FAILED", "wall_s": r["wall"], "error": (r["stderr"] or r["stdout"]).strip().splitlines()[-5:]}
    chosen = [line for line in r["stdout"].splitlines() if line.startswith(("precision:", "env backend:", "compile:"))]
    return {"status": "ok", "wall_s": r["wall"], "sps": med(r["charts/SPS_window"][WARMUP_ITERATIONS:]) or float("nan"),
            "gpu_util": med(r["resources/gpu_util"]) or float("nan"), "chosen": chosen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", help="also write the table to this file")
    add_flags(parser, env_id="BreakoutNoFrameskip-v4", backend="envpool", num_steps=128, iterations=8,
              budget_s=(480.0, "stop starting rows once this much time is spent"),
              cpu_smoke=(False, "run every row tiny on the CPU (checks the script)"))
    args = parser.parse_args()
    rows = ROWS
    if args.cpu_smoke:
        args.iterations, args.num_steps, args.backend = WARMUP_ITERATIONS + 1, 16, "ale"
        rows = [(name, p, max(2, e // 16), flags) for name, p, e, flags in ROWS]
    elif not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU here: run this on a GPU machine, or pass --cpu-smoke to check the script on the CPU.")

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.cpu_smoke else "CPU"
    header = (f"# GPU check: {args.env_id}, {args.backend}, {args.num_steps} steps per env per iteration\n"
              f"device: {device}; torch {torch.__version__}; CUDA {torch.version.cuda}; {host_line()}\n")
    print(header, flush=True)
    lines, results, start = [], {}, time.perf_counter()
    for name, processes, envs, flags in rows:
        left = args.budget_s - (time.perf_counter() - start)
        r = run_row(processes, envs, flags, args, timeout=left) if left >= 30 else {"status": f"skipped (out of the {args.budget_s:.0f} s budget)"}
        results[name] = r
        lines.append([name, f"{r['sps']:,.0f}", f"{r['gpu_util']:.0f}", f"{r['wall_s']:.0f}", "; ".join(r["chosen"])] if r["status"] == "ok" else
                     [name, r["status"], "", f"{r.get('wall_s', 0):.0f}", " / ".join(r.get("error", []))[-300:]])
        print("| " + " | ".join(lines[-1]) + " |", flush=True)
    text = header + "\n" + table(["configuration", "SPS (median after warm-up)", "GPU util % (median)", "wall s", "chosen at start"], lines) + "\n"
    print("\n" + text)
    print(json.dumps(results, default=str))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
