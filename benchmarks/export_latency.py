"""Exported policy latency (issue 47): microseconds for one batch-1 action of a PPO policy under ONNX Runtime (the
`fleetrl export` file), fleetrl's own eval path, torch eager and TorchScript, for the MLP (CartPole-v1) and the Nature
CNN (BreakoutNoFrameskip-v4): `python benchmarks/export_latency.py [--repeats N]`.

Each model is a real checkpoint from a short `fleetrl train ppo` run (the weights do not change the time), exported to
both formats. Every path acts on the same real observations (the eval policy's own episode), one observation a call:
- ONNX Runtime: ``session.run`` on the numpy observation, under each session setting in ORT_SETTINGS;
- fleetrl eval: the ``act`` that ``policy_from_checkpoint`` returns (numpy in, numpy out), as `fleetrl eval` plays;
- torch eager: the network's ``act(x, True)`` under ``torch.inference_mode``, a tensor in;
- TorchScript: the `--format torchscript` file under ``torch.jit.load``, a tensor in, under ``torch.inference_mode``.
A repeat times every path in turn (bench.alternate), each many calls after a warm-up; tables give medians of the
repeats. The torch paths run at `fleetrl eval`'s torch threads (runtime.set_torch_threads(None)), then at one thread.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort
import torch
from bench import alternate, fmt, host_line, median_us, run_process, table

from fleetrl import evaluate, export, runtime
from fleetrl.algos import eval_code
from fleetrl.envs import make_vector_env
from fleetrl.envs.registry import env_family
from fleetrl.nets import network_input


@dataclass(frozen=True)
class Model:
    name: str
    env_id: str
    train_flags: tuple[str, ...]  # a short run: a real checkpoint; its weights do not change the time
    calls: int  # calls a repeat: 0.1-0.2 s of the slowest path on a 2-core EPYC


MODELS = [
    Model("MLP (CartPole-v1)", "CartPole-v1", ("--total-timesteps", "4096"), 2000),
    Model("Nature CNN (Breakout, 4x84x84 uint8)", "BreakoutNoFrameskip-v4",
          ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "32"), 200),
]
OPT_LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
# (intra-op threads, graph optimisation): 0 threads is ONNX Runtime's default (one a physical core); "all" its default level
ORT_SETTINGS = [(threads, level) for threads in (0, 1) for level in OPT_LEVELS]


def ort_label(threads: int, level: str) -> str:
    return f"ORT {'default' if threads == 0 else threads} thread{'s' if threads != 1 else ''}, opt {level}"


def ort_session(path: Path, threads: int, level: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = OPT_LEVELS[level]
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cycling(fn: Callable, inputs: list) -> Callable[[], object]:
    """``fn`` on the next of ``inputs`` at each call, so no path times one observation held in cache."""
    it = itertools.cycle(inputs)
    return lambda: fn(next(it))


def prepare(model: Model, folder: Path, observations: int) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """Train, export both ways, and return each path as a no-argument call (cycling over real observations)."""
    run = folder / model.env_id
    run_process([sys.executable, "-m", "fleetrl", "train", "ppo", "--env-id", model.env_id, *model.train_flags, "--seed", "1",
                 "--run-dir", str(run), "--no-progress"])
    files = {kind: folder / f"{model.env_id}{suffix}" for kind, suffix in export.FORMATS.items()}
    for kind, out in files.items():
        export.export(export.ExportArgs(checkpoint=str(run), format=kind, out=str(out), force=True))

    # fleetrl eval's policy on fleetrl eval's env (fleetrl/evaluate.py), and observations from its own episode
    state, path = evaluate.load(str(run))
    algo = eval_code.for_checkpoint(state, str(path), None)
    train_args = state["args"]
    envs = make_vector_env(model.env_id, 1, "sync", training=False, sticky_actions=train_args.get("sticky_actions"),
                           frame_stack=train_args.get("frame_stack"), family=env_family(model.env_id))
    try:
        act = algo.policy_from_checkpoint(state, envs, deterministic=True)
        obs, _ = envs.reset(seed=12345)
        seen = []
        for _ in range(observations):
            seen.append(np.array(obs))  # a copy: a vector env may reuse its buffer
            obs, *_ = envs.step(act(obs))
    finally:
        envs.close()

    # the network takes what eval hands it (fleetrl/policy.py); the exported graphs take the raw observation
    network, inputs, tensors = act.network, [torch.as_tensor(network_input(o)) for o in seen], [torch.as_tensor(o) for o in seen]
    scripted = torch.jit.load(str(files["torchscript"]))
    sessions = {ort_label(t, lv): ort_session(files["onnx"], t, lv) for t, lv in ORT_SETTINGS}

    def eager(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return network.act(x, True)

    def torchscript(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return scripted(x)

    # every path must play the same actions, or the table compares different work
    expected = np.concatenate([act(o) for o in seen])
    for name, got in [("torch eager", [eager(x).numpy() for x in inputs]),
                      ("TorchScript", [torchscript(x).numpy() for x in tensors]),
                      *((label, [s.run(None, {"obs": o})[0] for o in seen]) for label, s in sessions.items())]:
        if not np.array_equal(np.concatenate(got), expected):
            raise SystemExit(f"{model.name}: {name} does not play fleetrl eval's actions on the same observations.")

    paths = {label: cycling(lambda o, s=s: s.run(None, {"obs": o}), seen) for label, s in sessions.items()}
    paths |= {"fleetrl eval": cycling(act, seen), "torch eager": cycling(eager, inputs),
              "TorchScript": cycling(torchscript, tensors)}
    return paths, list(sessions)


def side_by_side(rounds: list[dict[str, float]], value: Callable[[dict[str, float]], float], spec: str = ",.1f",
                 unit: str = "") -> str:
    """One cell: ``value`` of each round's medians, in the rounds' order ("62.1 / 61.7")."""
    return " / ".join(format(value(medians), spec) + unit for medians in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="repeats of every path (medians are of these)")
    parser.add_argument("--observations", type=int, default=256, help="real observations each path cycles through")
    parser.add_argument("--calls-scale", type=float, default=1.0, help="multiply each model's calls a repeat (0.1: a quick look)")
    opts = parser.parse_args()

    load_at_start = os.getloadavg()[0]  # host_line's is the load at the end; other work on the cores changes the times
    eval_threads = runtime.set_torch_threads(None)
    rounds = [eval_threads] + ([1] if eval_threads != 1 else [])  # torch's threads: fleetrl eval's, then one
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="export_latency_") as folder:
        for model in MODELS:
            paths, ort_labels = prepare(model, Path(folder), opts.observations)
            calls = max(1, int(model.calls * opts.calls_scale))
            for threads in rounds:
                torch.set_num_threads(threads)
                print(f"{model.name}, torch threads {threads}: {calls} calls a repeat", file=sys.stderr)
                results[model.name, threads] = alternate(paths, opts.repeats, lambda name, _: median_us(paths[name], calls, 1),
                                                            lambda name, us: f"{us:,.1f} µs")
    print(host_line())
    print(f"load average at the start {load_at_start:.2f}; torch {torch.__version__}, onnxruntime {ort.__version__}; "
          f"medians of {opts.repeats} repeats, µs per action, batch 1\n")

    rows, detail = [], []
    for model in MODELS:
        pooled = {label: statistics.median(v for (m, _), runs in results.items() if m == model.name for v in runs[label])
                  for label in ort_labels}
        best = min(pooled, key=pooled.get)  # ONNX Runtime's time does not depend on torch's threads: chosen over both rounds
        detail.append([model.name, *(fmt(pooled[label], ",.1f") for label in ort_labels)])
        medians = [{name: statistics.median(runs) for name, runs in results[model.name, threads].items()} for threads in rounds]
        rows.append([model.name, side_by_side(medians, lambda m: m[best]), best.removeprefix("ORT "),
                     *(side_by_side(medians, lambda m, path=path: m[path]) for path in ("fleetrl eval", "torch eager", "TorchScript")),
                     f"**{side_by_side(medians, lambda m: m['torch eager'] / m[best], '.1f', 'x')}**"])
    print(f"Each cell: the round with torch at {' / '.join(map(str, rounds))} threads ({eval_threads}: "
          f"fleetrl eval's setting); ONNX Runtime ran in the same rounds, at its setting's threads.\n")
    print(table(["model", "ONNX Runtime", "its setting", "fleetrl eval (act)", "torch eager", "TorchScript",
                 "eager / ONNX Runtime"], rows))
    print("\nONNX Runtime's settings (medians over both rounds' repeats, µs):\n")
    print(table(["model", *(label.removeprefix("ORT ") for label in ort_labels)], detail))


if __name__ == "__main__":
    main()
