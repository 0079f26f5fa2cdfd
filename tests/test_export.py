"""`fleetrl export` plays as `fleetrl eval` does, for every algorithm family: the ONNX graph under ONNX Runtime and the
TorchScript file under torch.jit (in a process that never imports fleetrl) give eval's deterministic action at every step
of the same seeded episodes, carry a recurrent state, and hold the metadata a player needs; bad input is one paragraph."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import fleetrl
from fleetrl import checkpoint, evaluate, runtime
from fleetrl.algos import eval_code
from fleetrl.envs import make_vector_env
from fleetrl.envs.registry import MULTIAGENT_FAMILIES, env_family
from fleetrl.envs.vector import episode_stats
from fleetrl.export import FORMATS, read_metadata
from fleetrl.nets import network_input

from conftest import fleetrl_env, run_fleetrl_in_process

pytestmark = [pytest.mark.needs("onnx", "export"), pytest.mark.needs("onnxruntime", "export")]

SEED = 12345  # `fleetrl eval`'s default --seed
CONTINUOUS_TOLERANCE = 1e-5  # issue 47: continuous actions at most this far apart at every step
RETURN_TOLERANCE = 0.01  # and each episode's return, played by the exported policy alone, within 1%
HEAD_SCALE = 200.0  # PPO's policy head, scaled after training (spread_policy_head)
TRAINING = ["--env-backend", "sync", "--no-progress", "--no-cuda"]
# a few updates each: trained weights, not the initial ones, in seconds (the parity does not need a good policy)
ON_POLICY = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--precision", "fp32", "--total-timesteps", "512"]
OFF_POLICY = ["--num-envs", "2", "--learning-starts", "200", "--batch-size", "32", "--total-timesteps", "600"]
# two iterations of 100 steps of each env: the second one learns (a budget is whole iterations)
CONTINUOUS_OFF_POLICY = ["--num-envs", "2", "--learning-starts", "200", "--batch-size", "32", "--total-timesteps", "400"]


@dataclass(frozen=True)
class Family:
    """One algorithm family's tiny training run (`fleetrl train ALGO --env-id ENV FLAGS`) and how long its parity is
    played: whole episodes until ``min_steps`` steps (continuous: issue 47 asks for 1,000)."""

    algo: str
    env_id: str
    flags: tuple[str, ...]
    continuous: bool = False
    min_steps: int = 400
    random_head: bool = False  # a head of random weights: a tiny run's policy may play one action in every state


FAMILIES = {
    "ppo": Family("ppo", "CartPole-v1", (*ON_POLICY,)),
    # --normalize: the frozen observation statistics must be inside the graph
    "ppo_continuous": Family("ppo", "Pendulum-v1", (*ON_POLICY, "--update-epochs", "2", "--normalize", "True"), continuous=True,
                             min_steps=1000),
    "ppo_lstm": Family("ppo_lstm", "CartPole-v1", (*ON_POLICY, "--update-epochs", "2")),
    # its state is the episode's memory and step: the graph must carry both, and zero them where an episode starts
    "ppo_trxl": Family("ppo_trxl", "ProofofMemory-v0", ("--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
                                                        "--trxl-num-layers", "1", "--trxl-num-heads", "2", "--trxl-dim", "32",
                                                        "--total-timesteps", "512"), random_head=True),
    "ppg": Family("ppg", "CartPole-v1", (*ON_POLICY, "--n-iteration", "2", "--e-auxiliary", "1", "--num-aux-rollouts", "2")),
    "pqn": Family("pqn", "CartPole-v1", (*ON_POLICY,)),
    "dqn": Family("dqn", "CartPole-v1", (*OFF_POLICY, "--buffer-size", "1000")),
    # an update every step: with C51's default of one in ten, 600 steps leave a policy that pushes right in every state
    "c51": Family("c51", "CartPole-v1", (*OFF_POLICY, "--buffer-size", "1000", "--train-frequency", "1", "--learning-rate", "1e-3")),
    "rainbow": Family("rainbow", "CartPole-v1", (*OFF_POLICY, "--buffer-size", "1000")),
    "sac_discrete": Family("sac_discrete", "CartPole-v1", (*OFF_POLICY, "--buffer-size", "1000")),
    "sac": Family("sac", "Pendulum-v1", (*CONTINUOUS_OFF_POLICY,), continuous=True, min_steps=1000),
    "td3": Family("td3", "Pendulum-v1", (*CONTINUOUS_OFF_POLICY,), continuous=True, min_steps=1000),
    "ddpg": Family("ddpg", "Pendulum-v1", (*CONTINUOUS_OFF_POLICY,), continuous=True, min_steps=1000),
    # one game of three agents, a row each, sharing PPO's parameters (25-step games)
    "multiagent_ppo": Family("ppo", "mpe2.simple_spread_v3", ("--num-envs", "6", "--num-steps", "32", "--num-minibatches", "2",
                                                              "--total-timesteps", "384")),
}
MARKS = {"multiagent_ppo": [pytest.mark.needs("mpe2", "multiagent")]}
FAMILY_PARAMS = [pytest.param(name, marks=MARKS.get(name, ())) for name in FAMILIES]


@dataclass
class Recording:
    """The episodes `fleetrl eval`'s policy played: per step the batch of observations it was given (a row, or a row per
    agent), the rows that began an episode, and its actions; and each episode's return."""

    obs: list[np.ndarray] = field(default_factory=list)
    starts: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)


class Lab:
    """The module's checkpoints, exported files and recorded episodes, each made once, when a test first asks."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._checkpoints: dict[str, Path] = {}
        self._exported: dict[tuple, Path] = {}
        self._recordings: dict[str, Recording] = {}

    def checkpoint(self, name: str) -> Path:
        if name not in self._checkpoints:
            family, run_dir = FAMILIES[name], self.folder / name
            trained = run_fleetrl_in_process("train", family.algo, "--env-id", family.env_id, *family.flags, *TRAINING,
                                             "--run-dir", str(run_dir))
            assert trained.returncode == 0, trained.stderr[-3000:]
            spread_policy_head(run_dir, family.random_head)
            self._checkpoints[name] = checkpoint.list_checkpoints(run_dir)[-1]
            # the whole budget ran: past --learning-starts, so the weights are trained ones, not the seed's initial ones
            total = family.flags[family.flags.index("--total-timesteps") + 1]
            assert self._checkpoints[name].stem == f"ckpt_{int(total):012d}", (self._checkpoints[name], total)
        return self._checkpoints[name]

    def exported(self, name: str, fmt: str = "onnx", *flags: str) -> Path:
        key = (name, fmt, flags)
        if key not in self._exported:
            out = self.folder / "exported" / ("_".join([name, *(flag.lstrip("-") for flag in flags)]) + FORMATS[fmt])
            done = run_fleetrl_in_process("export", str(self.checkpoint(name)), "--format", fmt, "--out", str(out), *flags)
            assert done.returncode == 0, done.stderr[-3000:]
            self._exported[key] = out
        return self._exported[key]

    def recording(self, name: str) -> Recording:
        """Eval's policy and the ONNX graph, stepped together on eval's env: the same observation to both, the env stepped
        with eval's action; each step's actions compared (discrete: equal; continuous: within CONTINUOUS_TOLERANCE)."""
        if name not in self._recordings:
            family, onnx_player = FAMILIES[name], OnnxPlayer(self.exported(name))
            recording = Recording()

            def both(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
                expected, got = policy(obs, starts), onnx_player(obs, starts)
                step = len(recording.actions)
                if family.continuous:
                    assert got.shape == expected.shape and got.dtype == expected.dtype, (got, expected)
                    gap = float(np.max(np.abs(got.astype(np.float64) - expected)))
                    assert gap <= CONTINUOUS_TOLERANCE, f"{name} step {step}: ONNX {got} and eval {expected} are {gap:.3g} apart"
                else:
                    assert np.array_equal(got, expected), f"{name} step {step}: ONNX plays {got}, eval {expected}"
                recording.obs.append(obs.copy())
                recording.starts.append(starts.copy())
                recording.actions.append(expected)
                return expected

            envs, policy = eval_env_and_policy(self.checkpoint(name))
            try:
                recording.returns = play(envs, both, family.min_steps)
            finally:
                envs.close()
            self._recordings[name] = recording
        return self._recordings[name]


def spread_policy_head(run_dir: Path, random_head: bool = False) -> None:
    """PPO's agents (PPO, PPO-LSTM, PPO-TrXL, PPG) start their policy head at 0.01 of its layers' scale (CleanRL's init), and a few
    updates leave its logits near ties and its Gaussian means near 0, where an export that lost a step could still agree
    with eval. Scaled HEAD_SCALE times and saved again as the run's checkpoint, its argmax has margins and its means pass
    the action bounds, so eval's clip acts too."""
    state = checkpoint.load_checkpoint(run_dir)
    layers = {key.rsplit(".", 1)[0] for key in state.get("model", {}) if key.startswith(("actor.", "actor_branches."))}
    if not layers:
        return
    head = max(layers, key=lambda layer: int(layer.split(".")[1]) if "." in layer else 0)  # actor.4 of actor.0-4, or actor
    for tensor in ("weight", "bias"):
        state["model"][f"{head}.{tensor}"] *= HEAD_SCALE
    if random_head:  # the features decide, not a bias that a few updates pushed towards one action
        weight = state["model"][f"{head}.weight"]
        weight += torch.randn(weight.shape, generator=torch.Generator().manual_seed(SEED))
        state["model"][f"{head}.bias"].zero_()
    checkpoint.save_checkpoint(state, run_dir, keep=1)


def eval_env_and_policy(source: Path):
    """`fleetrl eval`'s env and deterministic policy for the checkpoint ``source``, built as fleetrl/evaluate.py builds them."""
    state, path = evaluate.load(str(source))
    env_id = state["args"]["env_id"]
    runtime.seed_everything(SEED, True)
    algo = eval_code.for_checkpoint(state, str(path), None)
    family = env_family(env_id)
    agents = family.agents if family.name in MULTIAGENT_FAMILIES else 0
    envs = make_vector_env(env_id, max(agents, 1), "sync", training=False, sticky_actions=state["args"].get("sticky_actions"),
                           frame_stack=state["args"].get("frame_stack"), family=family)
    return envs, algo.policy_from_checkpoint(state, envs, True)


def play(envs, choose, min_steps: int) -> list[float]:
    """Whole episodes from one reset with ``SEED`` (the env's autoreset goes on, as `fleetrl eval`'s does) until at
    least ``min_steps`` steps; ``choose(obs, starts)`` gives the actions. Each episode's return (a game: each agent's)."""
    obs, _ = envs.reset(seed=SEED)
    starts = np.ones(envs.num_envs, bool)
    returns, steps = [], 0
    while steps < min_steps or not starts.all():
        obs, _, terminated, truncated, info = envs.step(choose(obs, starts))
        starts = terminated | truncated
        returns += [episode[0] for episode in episode_stats(info)]
        steps += 1
    return returns


class OnnxPlayer:
    """An exported ONNX file under ONNX Runtime, ``(obs, starts) -> action``; a recurrent graph's state_out is carried to
    its next call, starting from zeros, as the metadata says."""

    def __init__(self, path: Path):
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        recurrent = read_metadata(path)["recurrent"]
        self.state_shape = recurrent["state_shape"] if recurrent else None
        self.state = None

    def __call__(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        if self.state_shape is None:
            return self.session.run(["action"], {"obs": obs})[0]
        if self.state is None:
            self.state = np.zeros((len(obs), *self.state_shape), np.float32)
        action, self.state = self.session.run(["action", "state_out"], {"obs": obs, "state": self.state, "starts": starts})
        return action


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    return Lab(tmp_path_factory.mktemp("export"))


# ------------------------------------------------------------------------------------------ ONNX parity with eval
@pytest.mark.parametrize("name", FAMILY_PARAMS)
def test_onnx_plays_evals_action_at_every_step_of_seeded_episodes(lab, name):
    family, recording = FAMILIES[name], lab.recording(name)  # each step's parity is asserted as it is played
    steps = len(recording.actions)
    assert steps >= family.min_steps and recording.returns, (steps, recording.returns)
    if family.continuous:
        # the exported policy alone, on its own env with the same seed: every episode's return within 1% of eval's
        envs, _ = eval_env_and_policy(lab.checkpoint(name))
        try:
            alone = play(envs, OnnxPlayer(lab.exported(name)), family.min_steps)
        finally:
            envs.close()
        assert len(alone) == len(recording.returns)
        np.testing.assert_allclose(alone, recording.returns, rtol=RETURN_TOLERANCE)
    else:
        # a policy that played one action throughout would agree with a graph that ignored its input
        assert len(np.unique(np.concatenate(recording.actions))) > 1, f"{name} played one action only"


def test_the_frozen_normalisation_and_the_clip_are_inside_the_graph(lab):
    # the Pendulum policy's parity above is not parity by chance: without its frozen statistics it acts otherwise, and
    # eval clipped some of its actions to the bounds
    recording = lab.recording("ppo_continuous")
    assert read_metadata(lab.exported("ppo_continuous"))["observation_normalization"] == "inside the graph (frozen)"
    envs, policy = eval_env_and_policy(lab.checkpoint("ppo_continuous"))
    envs.close()
    space = envs.single_action_space
    obs, actions = np.concatenate(recording.obs), np.concatenate(recording.actions)
    with torch.inference_mode():
        raw = policy.network.act(torch.as_tensor(network_input(obs)), True).numpy().clip(space.low, space.high)
    assert np.max(np.abs(raw - actions)) > 100 * CONTINUOUS_TOLERANCE
    at_bounds = (actions == space.low) | (actions == space.high)
    assert at_bounds.any() and not at_bounds.all(), "some actions, not all, were clipped"


@pytest.mark.parametrize(("name", "extras"), [("ppo", ("logits", "value")), ("dqn", ("q_values",))])
def test_extras_are_what_the_network_computes(lab, name, extras):
    import onnxruntime

    obs = np.concatenate(lab.recording(name).obs)
    session = onnxruntime.InferenceSession(str(lab.exported(name, "onnx", "--extras")), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["action", *extras]
    action, *got = session.run(None, {"obs": obs})
    envs, policy = eval_env_and_policy(lab.checkpoint(name))
    envs.close()
    with torch.inference_mode():
        out = policy.network(torch.as_tensor(network_input(obs)))
    expected = [out[0], out[1].reshape(-1)] if name == "ppo" else [out]  # PPO's agent: (logits, value); DQN's: Q-values
    for extra, g, e in zip(extras, got, expected):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-5, rtol=1e-5, err_msg=extra)
    assert np.array_equal(action, got[0].argmax(-1)), "the action is the argmax of the logits or Q-values beside it"
    assert np.array_equal(action, policy(obs))


# ------------------------------------------------------------------------------------------ metadata
def space_from(description: dict) -> gym.Space:
    """The gymnasium space a metadata description names (its "inf" and "-inf" bounds read back)."""
    if description["type"] == "Discrete":
        return gym.spaces.Discrete(description["n"], start=description["start"])
    assert description["type"] == "Box", description

    def bound(value):
        return np.broadcast_to(np.asarray(value, dtype=object).astype(description["dtype"]), description["shape"])
    return gym.spaces.Box(bound(description["low"]), bound(description["high"]), description["shape"], description["dtype"])


@pytest.mark.parametrize("name", FAMILY_PARAMS)
def test_metadata_names_the_checkpoint_the_env_and_the_spaces(lab, name):
    family, path = FAMILIES[name], lab.checkpoint(name)
    meta = read_metadata(lab.exported(name))
    assert meta["algo"] == family.algo and meta["env_id"] == family.env_id and meta["fleetrl_version"] == fleetrl.__version__
    assert meta["checkpoint_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["global_step"] == int(path.stem.split("_")[1])
    envs, _ = eval_env_and_policy(path)
    envs.close()
    assert space_from(meta["observation_space"]) == envs.single_observation_space
    assert space_from(meta["action_space"]) == envs.single_action_space
    assert meta["evaluation"]["deterministic"] is True
    if name == "multiagent_ppo":
        agents = ["agent_0", "agent_1", "agent_2"]
        assert meta["multiagent"]["agents"] == agents and meta["preprocessing"]["kind"] == "pettingzoo"
        assert meta["preprocessing"]["agents"] == agents
    else:
        assert meta["multiagent"] is None
        assert meta["preprocessing"] == {"kind": "gymnasium", "gymnasium_id": family.env_id, "module": None,
                                         "flatten_observation": False}
    import onnxruntime

    inputs = onnxruntime.InferenceSession(str(lab.exported(name)), providers=["CPUExecutionProvider"]).get_inputs()
    if name in ("ppo_lstm", "ppo_trxl"):  # the state's shape and its zeros are in the metadata, and the graph takes that shape
        assert [i.name for i in inputs] == ["obs", "state", "starts"]
        assert meta["recurrent"]["initial_state"] == "zeros" and inputs[1].shape[1:] == meta["recurrent"]["state_shape"]
    else:
        assert [i.name for i in inputs] == ["obs"] and meta["recurrent"] is None


# ------------------------------------------------------------------------------------------ TorchScript without fleetrl
# Run with `python -c`, never importing fleetrl: each case's file acts on the recorded observations, all in one batch
# (eval's were one row, or a game's rows, at a time), or a recurrent file step by step, carrying its own state from zeros;
# its actions and metadata are written back for the test to compare.
TORCHSCRIPT_PLAYER = """
import json, sys
import numpy as np, torch
cases, out = json.loads(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
metadata, actions = {}, {}
for name, (model_path, recording_path) in cases.items():
    files = {"fleetrl.json": ""}
    model = torch.jit.load(model_path, _extra_files=files)
    meta = metadata[name] = json.loads(files["fleetrl.json"])
    recording, state, played = np.load(recording_path), None, []
    obs = torch.as_tensor(recording["obs"])
    with torch.no_grad():
        if not meta["recurrent"]:
            actions[name] = model(obs.flatten(0, 1)).unflatten(0, obs.shape[:2]).numpy()
            continue
        for step_obs, starts in zip(obs, torch.as_tensor(recording["starts"])):
            state = torch.zeros((len(step_obs), *meta["recurrent"]["state_shape"])) if state is None else state
            action, state = model(step_obs, state, starts)
            played.append(action.numpy())
    actions[name] = np.stack(played)
np.savez(out + "/actions.npz", **actions)
with open(out + "/metadata.json", "w") as f:
    json.dump(metadata, f)
imported = sorted(m for m in sys.modules if m == "fleetrl" or m.startswith("fleetrl."))
assert not imported, imported
"""


def test_torchscript_plays_evals_actions_in_a_process_without_fleetrl(lab, tmp_path):
    names = [name for name in FAMILIES if name != "multiagent_ppo" or _imports("mpe2")]
    cases = {}
    for name in names:
        recording = lab.recording(name)
        np.savez(tmp_path / f"{name}.npz", obs=np.stack(recording.obs), starts=np.stack(recording.starts))
        cases[name] = (str(lab.exported(name, "torchscript")), str(tmp_path / f"{name}.npz"))
    proc = subprocess.run([sys.executable, "-c", TORCHSCRIPT_PLAYER, json.dumps(cases), str(tmp_path)], capture_output=True,
                          text=True, timeout=240, env=fleetrl_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    played, metadata = np.load(tmp_path / "actions.npz"), json.loads((tmp_path / "metadata.json").read_text())
    for name in names:
        expected = np.stack(lab.recording(name).actions)
        if FAMILIES[name].continuous:
            np.testing.assert_allclose(played[name], expected, atol=CONTINUOUS_TOLERANCE, rtol=0, err_msg=name)
        else:
            assert np.array_equal(played[name], expected), name
        assert metadata[name] == read_metadata(lab.exported(name)), f"{name}: TorchScript's metadata is ONNX's"


def _imports(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ------------------------------------------------------------------------------------------ bad input
NO_EXPORT_PATH = '''"""A user's PPO whose policy_from_checkpoint returns a plain function, which fleetrl export cannot see into."""
from fleetrl.algos import ppo
from fleetrl.algos.ppo import Args, train  # noqa: F401


def policy_from_checkpoint(state, envs, deterministic=True):
    act = ppo.policy_from_checkpoint(state, envs, deterministic)
    return lambda obs, starts=None: act(obs, starts)
'''
# a network whose "deterministic" action is not: its traced graph cannot reproduce it, and the file is refused after it
# was written to its temporary name
NOISY = '''"""A user's PPO whose network adds noise to its deterministic action."""
from fleetrl.algos import ppo
from fleetrl.algos.ppo import Args, train  # noqa: F401
from fleetrl.policy import policy_fn
import torch


class Noisy(torch.nn.Module):
    def __init__(self, agent):
        super().__init__()
        self.agent = agent

    def act(self, x, deterministic):
        action = self.agent.act(x, deterministic)
        return action + torch.rand_like(action)


def policy_from_checkpoint(state, envs, deterministic=True):
    act = ppo.policy_from_checkpoint(state, envs, deterministic)
    return policy_fn(Noisy(act.network), envs, deterministic, obs_rms=act.obs_rms)
'''


def export_refused(*args: str, needles: tuple[str, ...] = ()) -> str:
    """`fleetrl export ARGS` (the CLI, in this process) exits non-zero with one paragraph, naming each of ``needles``;
    the paragraph."""
    proc = run_fleetrl_in_process("export", *args)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    # the error is the last thing said: one paragraph (a warning may come before it)
    assert proc.stderr.count("fleetrl: error: ") == 1, proc.stderr
    paragraph = proc.stderr[proc.stderr.index("fleetrl: error: "):].strip()
    assert "\n" not in paragraph, paragraph
    for needle in needles:
        assert needle in paragraph, (needle, paragraph)
    return paragraph


def no_temporary_files(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert not left, f"the export left {left} in {folder}"


def test_bad_input_is_one_paragraph_and_writes_nothing_half_done(lab, tmp_path, monkeypatch):
    import onnxruntime

    source = lab.checkpoint("ppo_continuous")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "policy.onnx"

    # a checkpoint that does not verify: a copy beside its manifest, a byte flipped
    damaged = tmp_path / "checkpoints" / source.name
    damaged.parent.mkdir()
    shutil.copy(source.with_suffix(".json"), damaged.with_suffix(".json"))
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    export_refused(str(damaged), "--out", str(out), needles=(str(damaged), "corrupt"))

    export_refused(str(source), "--format", "tflite", "--out", str(out), needles=("tflite", "onnx", "torchscript"))

    (tmp_path / "plain_policy.py").write_text(NO_EXPORT_PATH)
    export_refused(str(source), "--algo-file", str(tmp_path / "plain_policy.py"), "--out", str(out),
                   needles=("plain_policy.py", "has no export path", "policy_fn(network, envs, deterministic"))

    (tmp_path / "noisy.py").write_text(NOISY)
    export_refused(str(source), "--algo-file", str(tmp_path / "noisy.py"), "--out", str(out),
                   needles=("does not reproduce its policy", "not written"))
    assert not out.exists()
    no_temporary_files(folder)

    for missing in ("onnx", "onnxruntime"):  # as if the extra were not installed: its import fails in this process
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, missing, None)
            export_refused(str(source), "--out", str(out), needles=("pip install 'fleetrl[export]'",))
    assert not out.exists()

    # an existing file is kept without --force, and replaced with it
    out.write_bytes(b"the user's own file")
    export_refused(str(source), "--out", str(out), needles=(str(out), "--force"))
    assert out.read_bytes() == b"the user's own file"
    forced = run_fleetrl_in_process("export", str(source), "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert [o.name for o in onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"]).get_outputs()] == ["action"]
    assert sorted(p.name for p in folder.iterdir()) == ["policy.onnx"]
