"""`fleetrl export`: a trained checkpoint as one ONNX or TorchScript graph that plays as `fleetrl eval` does.

The graph's input is the observation exactly as the env gives it (the preprocessing the env must apply, such as
Atari's frames, is named in the metadata); inside it are the steps `fleetrl eval` takes around the network
(fleetrl/policy.py: policy_fn): the frozen observation normalisation, Atari's scaling (the network's own), the
deterministic action (argmax, the Gaussian mean, the actor's output) and continuous actions clipped to the action space.
A recurrent policy takes and returns its state; `starts` marks the rows whose episode begins (their state is zeroed).
The metadata (docs/export.md) travels in the file: ONNX's ``metadata_props["fleetrl"]``, TorchScript's extra file
``fleetrl.json``; both are the same JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn

import fleetrl
from fleetrl import checkpoint, evaluate, files, runtime
from fleetrl.algos import eval_code
from fleetrl.envs import atari, make_vector_env
from fleetrl.envs.registry import MULTIAGENT_FAMILIES, env_family, env_id_for_checkpoint, split_custom_id
from fleetrl.errors import FleetError, require
from fleetrl.sampling.normalize import CLIP, EPSILON

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
METADATA_KEY = "fleetrl"  # ONNX metadata_props key; TorchScript's extra file is METADATA_KEY + ".json"
METADATA_VERSION = 1
OPSET = 17
TRACE_ROWS = 2  # rows of the example batch the graph is traced with (the batch axis stays free)


@dataclass
class ExportArgs:
    checkpoint: tyro.conf.Positional[str]
    """a checkpoint file, or a run folder (its newest checkpoint that verifies is used)"""
    format: str = "onnx"
    """onnx (ONNX Runtime, any language) or torchscript (torch.jit.load, libtorch in C++)"""
    out: str | None = None
    """the file to write [RUN/exported/ckpt_STEP.onnx, or .pt]"""
    force: bool = False
    """overwrite --out if it exists"""
    extras: bool = False
    """also output what the network computes on the way: logits or Q-values, and the value, where it has them"""
    env_id: str | None = None
    """the env the policy is exported for [the checkpoint's]; a custom id (`module:Env-v0`) is used only when given here"""
    algo_file: str | None = None
    """the algorithm's file or module whose network rebuilds the policy [the checkpoint's, as `fleetrl eval` chooses]"""


class ExportedPolicy(nn.Module):
    """The computation of ``policy_fn``'s ``act`` (fleetrl/policy.py) as one module: raw observations in, eval's
    deterministic actions out (and the state, for a recurrent network; the extras, when asked)."""

    def __init__(self, network: nn.Module, obs_space: gym.spaces.Box, action_space: gym.Space, obs_rms: dict | None,
                 extras: bool):
        super().__init__()
        self.network = network.eval()
        self.recurrent = getattr(network, "state_shape", None) is not None
        self.normalize = obs_rms is not None
        if obs_rms is not None:  # the frozen statistics, in float64 as ObsNormalizer computes with them
            self.register_buffer("obs_mean", torch.as_tensor(np.asarray(obs_rms["mean"], np.float64)))
            self.register_buffer("obs_std", torch.as_tensor(np.sqrt(np.asarray(obs_rms["var"], np.float64) + EPSILON)))
        # network_input: a batch of uint8 frames goes to the network as it is (the CNN scales it); the rest as float32
        self.frames = obs_space.dtype == np.uint8 and len(obs_space.shape) == 3
        self.box = isinstance(action_space, gym.spaces.Box)
        if self.box:
            self.register_buffer("low", torch.tensor(np.asarray(action_space.low, np.float32)))
            self.register_buffer("high", torch.tensor(np.asarray(action_space.high, np.float32)))
        self.extras = extras

    def network_input(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            return ((obs.double() - self.obs_mean) / self.obs_std).clamp(-CLIP, CLIP).float()
        return obs if self.frames else obs.float()

    def forward(self, obs: torch.Tensor, *state_and_starts: torch.Tensor):
        x = self.network_input(obs)
        if self.recurrent:
            state, starts = state_and_starts
            action, state = self.network.act(x, True, state, starts)
            outputs = [action, state]
        else:
            outputs = [self.network.act(x, True)]
        if self.box:
            outputs[0] = torch.minimum(torch.maximum(outputs[0].float(), self.low), self.high)  # np.clip's order
        if self.extras:
            outputs += list(network_extras(self.network, x, *state_and_starts).values())
        return tuple(outputs) if len(outputs) > 1 else outputs[0]


def network_extras(network: nn.Module, x: torch.Tensor, *state_and_starts: torch.Tensor) -> dict[str, torch.Tensor]:
    """``--extras``: what the network computes on the way to its action. A network of your own says it with an
    ``export_extras(x) -> dict[name, tensor]`` method; fleetrl's own are read by their kind:
    PPO's agents (PPO, PPG, PPO-RND, PPO-LSTM): ``logits`` (or the Gaussian's ``mean``) and ``value``;
    DQN, C51, Rainbow, PQN: ``q_values``; discrete SAC: ``logits``."""
    if hasattr(network, "export_extras"):
        return dict(network.export_extras(x, *state_and_starts))
    if hasattr(network, "actor_logstd") or hasattr(network, "critic"):  # the PPO family: forward -> (out, value[, state])
        out = network(x, *state_and_starts)
        return {("mean" if getattr(network, "continuous", False) else "logits"): out[0], "value": out[1].reshape(-1)}
    if hasattr(network, "q_values"):  # PQN
        return {"q_values": network.q_values(x)}
    if hasattr(network, "num_actions") or hasattr(network, "atoms"):  # DQN, C51, Rainbow: forward -> Q-values
        return {"q_values": network(x)}
    if hasattr(network, "get_action") and not hasattr(network, "action_scale"):  # discrete SAC: forward -> logits
        return {"logits": network(x)}
    return {}


def export(args: ExportArgs) -> Path:
    """Write the checkpoint's policy to ``args.out`` and return its path; refused in one paragraph where it cannot be."""
    if args.format not in FORMATS:
        raise FleetError(f"Unknown --format {args.format!r}: fleetrl exports to onnx (ONNX Runtime, any language) or torchscript "
                         f"(torch.jit.load, libtorch in C++). Pass --format onnx or --format torchscript.")
    state, path = evaluate.load(args.checkpoint)
    train_args = state["args"]
    out = Path(args.out) if args.out else (checkpoint.run_folder_of(path) or path.parent) / "exported" / (path.stem + FORMATS[args.format])
    if out.exists() and not args.force:
        raise FleetError(f"{out} exists, and fleetrl export does not overwrite a file unasked. Pass --force to replace it, or "
                         f"--out another path.")
    if args.format == "onnx":  # before any work: the writer and the runtime that checks what it wrote
        require("onnx", "export", "fleetrl export --format onnx")
        require("onnxruntime", "export", "fleetrl export --format onnx (the written file is checked under ONNX Runtime)")
    command = f"fleetrl export {shlex.quote(args.checkpoint)}"
    env_id = env_id_for_checkpoint(train_args["env_id"], args.env_id, str(path), command)
    runtime.set_torch_threads(None)
    algo = eval_code.for_checkpoint(state, str(path), args.algo_file)
    family = env_family(env_id)
    agents = family.agents if family.name in MULTIAGENT_FAMILIES else 0
    envs = make_vector_env(env_id, max(agents, 1), "sync", training=False, sticky_actions=train_args.get("sticky_actions"),
                           frame_stack=train_args.get("frame_stack"), family=family)
    try:
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        act = algo.policy_from_checkpoint(state, envs, deterministic=True)
        example, _ = envs.reset(seed=0)
    finally:
        envs.close()
    network = getattr(act, "network", None)
    if not isinstance(network, nn.Module):
        name = getattr(algo, "__file__", None) or algo.__name__
        raise FleetError(
            f"{name} has no export path: its policy_from_checkpoint returns a function that fleetrl cannot see into. Return "
            f"`fleetrl.policy.policy_fn(network, envs, deterministic, obs_rms=...)` from it, where network is an nn.Module "
            f"with act(x, deterministic) (fleetrl/policy.py), as every built-in and `fleetrl new`'s copies do; "
            f"docs/engine.md, \"Export\".")
    module = ExportedPolicy(network, obs_space, action_space, act.obs_rms, args.extras)
    example = np.concatenate([example] * math.ceil(TRACE_ROWS / len(example)))[:max(TRACE_ROWS, len(example))]
    inputs = (torch.as_tensor(example),)
    if module.recurrent:
        inputs += (torch.zeros((len(example), *network.state_shape)), torch.zeros(len(example), dtype=torch.bool))
    # checked on the traced batch and on one row: a batch size that tracing froze into the graph (a Python len() of a tensor,
    # which the warnings silenced below would name) gives outputs of another shape there
    checks = [inputs, tuple(t[:1] for t in inputs)]
    with torch.inference_mode():
        expected = [output for check in checks for output in _as_list(module(*check))]
    names = output_names(module, inputs)
    meta = metadata(state, path, str(algo.__name__), env_id, family, obs_space, action_space, module, names, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(out, suffix=FORMATS[args.format]) as temporary:  # renamed over out only if the check passes
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracing's warnings about Python branches: each is taken as eval takes it
            if args.format == "onnx":
                _write_onnx(module, inputs, names, meta, temporary)
                run = lambda *check: run_onnx(temporary, check)  # noqa: E731
            else:
                # frozen: the weights become constants and what the action does not use (a value head) is dropped
                traced = torch.jit.freeze(torch.jit.trace(module.eval(), inputs, check_trace=False))
                torch.jit.save(traced, str(temporary), _extra_files={f"{METADATA_KEY}.json": json.dumps(meta, allow_nan=False)})
                loaded = torch.jit.load(str(temporary))
                run = lambda *check: _as_list(loaded(*check))  # noqa: E731
            try:
                got, failed = [output for check in checks for output in run(*check)], ""
            except Exception as exc:  # noqa: BLE001 - e.g. a reshape to the traced batch size, which one row cannot fill
                got, failed = [], f"it fails on one row: {str(exc).strip().splitlines()[-1]}"
        worst = max((_gap(g, e) for g, e in zip(got, expected)), default=math.inf)
        if worst > 1e-4:
            how = failed or ("its outputs have other shapes" if math.isinf(worst) else f"its outputs are {worst:.3g} apart")
            raise FleetError(f"The exported graph of {path} does not reproduce its policy on the example observations ({how}), "
                             f"so it was not written. Report this with the checkpoint's algorithm ({meta['algo']}).")
    print(f"{out}: {meta['algo']} on {env_id} @ step {state['global_step']:,}, {args.format}; inputs "
          f"{', '.join(i['name'] for i in meta['inputs'])} -> outputs {', '.join(o['name'] for o in meta['outputs'])}")
    return out


def _as_list(outputs) -> list:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _gap(got, expected: torch.Tensor) -> float:
    """How far an output of the written graph is from the module's: infinite where the shapes differ."""
    got = np.asarray(got, np.float64)
    if got.shape != tuple(expected.shape):
        return math.inf
    return float(np.max(np.abs(got - expected.numpy().astype(np.float64)), initial=0.0))


def output_names(module: ExportedPolicy, inputs: tuple) -> list[str]:
    names = ["action"] + (["state_out"] if module.recurrent else [])
    if module.extras:
        with torch.inference_mode():
            names += list(network_extras(module.network, module.network_input(inputs[0]), *inputs[1:]))
    return names


def _write_onnx(module: ExportedPolicy, inputs: tuple, names: list[str], meta: dict, path: Path) -> None:
    onnx = require("onnx", "export", "fleetrl export --format onnx")
    input_names = [i["name"] for i in meta["inputs"]]
    batch = {0: "batch"}
    torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=OPSET, input_names=input_names, output_names=names,
                      dynamic_axes={name: batch for name in input_names + names})
    model = onnx.load(str(path))
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(meta, allow_nan=False))
    model.producer_name, model.producer_version = "fleetrl", fleetrl.__version__
    onnx.save(model, str(path))


def run_onnx(path: Path, inputs: tuple) -> list[np.ndarray]:
    ort = require("onnxruntime", "export", "Checking an exported ONNX file")
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a graph that fails raises, and export says so in its paragraph: no log line of its own
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})


def space_description(space: gym.Space) -> dict[str, Any]:
    """A JSON description of a Box or Discrete space (a bound that is the same everywhere is written once)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, gym.spaces.Box):
        def number(value: float):  # strict JSON has no infinity: "inf" and "-inf" stand for them
            return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")

        def bound(values: np.ndarray):
            flat = np.asarray(values, np.float64)
            if flat.size and np.all(flat == flat.flat[0]):
                return number(float(flat.flat[0]))
            return [number(float(v)) for v in flat.ravel()] if flat.ndim == 1 else np.vectorize(number, otypes=[object])(flat).tolist()
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype), "low": bound(space.low), "high": bound(space.high)}
    return {"type": type(space).__name__, "repr": str(space)}


def preprocessing(env_id: str, family, train_args: dict) -> dict[str, Any]:
    """What the env must do to its observations before the graph sees them, as `fleetrl eval` builds it
    (fleetrl/envs/registry.py: EnvFactory, evaluation: no training-only wrapper)."""
    module, name = split_custom_id(env_id)
    if family.name == "atari":
        sticky = train_args.get("sticky_actions")
        sticky = atari.default_sticky_actions(name) if sticky is None else float(sticky)
        env = atari.make_atari(name, False, sticky, None, int(train_args.get("frame_stack") or atari.FRAME_STACK))
        try:
            fire = "FIRE" in env.unwrapped.get_action_meanings()
        finally:
            env.close()
        return {"kind": "atari", "gymnasium_id": name, "obs_type": "grayscale", "full_action_space": False,
                "repeat_action_probability": sticky, "sticky_actions_flag": train_args.get("sticky_actions"), "max_num_frames_per_episode": atari.MAX_FRAMES_PER_EPISODE,
                "noop_max": atari.NOOP_MAX, "frame_skip": atari.FRAME_SKIP, "max_pool_last": 2, "fire_reset": fire,
                "fire_after_life_loss": fire, "life_loss_steps": list(atari.LIFE_LOSS_STEPS),
                "resize": {"size": atari.SCREEN_SIZE, "interpolation": "cv2.INTER_AREA"},
                "frame_stack": int(train_args.get("frame_stack") or atari.FRAME_STACK),
                "order": ["noop_reset", "max_and_skip", "episode_statistics", "fire_reset", "fire_after_life_loss", "resize",
                          "frame_stack"]}
    if family.name in MULTIAGENT_FAMILIES:
        return {"kind": "pettingzoo", "module": env_id, "agents": list(family.agent_names),
                "rows": "one per agent, in possible_agents' order; a row is zeros once its agent has left the game",
                "image": family.name == "multiagent-image",
                "note": "image games' frames (and Atari games' agent indicator channels) are fleetrl's "
                        "(fleetrl/envs/multiagent_image.py); docs/export.md"}
    if family.name == "procgen":
        return {"kind": "envpool", "task_id": name, "note": "EnvPool's Procgen frames, channels first"}
    return {"kind": "gymnasium", "gymnasium_id": name, "module": module, "flatten_observation": None}


def metadata(state: dict, path: Path, algo_module: str, env_id: str, family, obs_space, action_space,
             module: ExportedPolicy, outputs: list[str], inputs: tuple) -> dict[str, Any]:
    train_args = state["args"]
    steps = preprocessing(env_id, family, train_args)
    if steps["kind"] == "gymnasium":  # fleetrl flattens what is not a 1-D Box, as gymnasium's FlattenObservation does
        steps["flatten_observation"] = _flattened(steps["gymnasium_id"])
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    described_inputs = [{"name": "obs", "shape": ["batch", *obs_space.shape], "dtype": str(np.asarray(inputs[0]).dtype)}]
    if module.recurrent:
        described_inputs += [{"name": "state", "shape": ["batch", *module.network.state_shape], "dtype": "float32"},
                             {"name": "starts", "shape": ["batch"], "dtype": "bool"}]
    return {
        "format_version": METADATA_VERSION,
        "fleetrl_version": fleetrl.__version__,
        "algo": str(state.get("algo", "ppo")),
        "algo_module": algo_module,
        "env_id": env_id,
        "family": family.name,
        "global_step": int(state["global_step"]),
        "checkpoint": str(path),
        "checkpoint_sha256": sha,
        "observation_space": space_description(obs_space),
        "action_space": space_description(action_space),
        "inputs": described_inputs,
        "outputs": [{"name": name} for name in outputs],
        "recurrent": ({"state_shape": list(module.network.state_shape), "initial_state": "zeros",
                       "starts": "true where the row's episode begins: its state is zeroed first"} if module.recurrent else None),
        "multiagent": ({"agents": list(family.agent_names), "rows": "one per agent, in this order"}
                       if family.name in MULTIAGENT_FAMILIES else None),
        "observation_normalization": "inside the graph (frozen)" if module.normalize else None,
        "preprocessing": steps,
        "evaluation": {"deterministic": True, "seeding": "the first reset takes --seed, every later one none (the env's own "
                       "generator goes on), as `fleetrl eval`'s vector env does"},
    }


def _flattened(gym_id: str) -> bool:
    spec = gym.spec(gym_id)
    env = gym.make(spec)
    try:
        space = env.observation_space
        return not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1)
    finally:
        env.close()


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of an exported file (ONNX or TorchScript)."""
    path = Path(path)
    if path.suffix == ".onnx":
        onnx = require("onnx", "export", "Reading an ONNX file's metadata")
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        return json.loads(props[METADATA_KEY])
    files = {f"{METADATA_KEY}.json": ""}
    torch.jit.load(str(path), _extra_files=files)
    return json.loads(files[f"{METADATA_KEY}.json"])


def main(argv: list[str]) -> None:
    export(tyro.cli(ExportArgs, args=argv, prog="fleetrl export"))


if __name__ == "__main__":
    main(sys.argv[1:])
