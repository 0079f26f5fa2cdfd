"""examples/play_exported.py plays a policy that `fleetrl export` wrote without fleetrl or torch, and prints what
`fleetrl eval --json` prints for its checkpoint: CartPole PPO, PPO-LSTM on CartPoleNoVel-v1, Pendulum PPO (normalised
observations), Breakout PPO (fleetrl's Atari frames, rebuilt bit for bit), PPO on mpe2.simple_spread_v3 (a row per
agent) and PPO on a custom id with Dict observations (flattened)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fleetrl_env, run_fleetrl_here

# every case is trained by one fixture, so the module needs every extra they play
pytestmark = [pytest.mark.needs("onnx", "export"), pytest.mark.needs("onnxruntime", "export"), pytest.mark.needs("ale_py", "atari"),
              pytest.mark.needs("cv2", "atari"), pytest.mark.needs("mpe2", "multiagent")]
ROOT = Path(__file__).resolve().parent.parent
PLAYER = ROOT / "examples" / "play_exported.py"
BREAKOUT = "BreakoutNoFrameskip-v4"
SPREAD = "mpe2.simple_spread_v3"
DICT_OBS = "fleetrl_test_envs:DictObs-v0"
SEED = 7
# name: (the training command, episodes played); each trains for seconds: the policies need not be good, only fleetrl's
CASES = {
    "cartpole": (["ppo", "--env-id", "CartPole-v1", "--total-timesteps", "2048"], 3),
    "lstm": (["ppo_lstm", "--env-id", "CartPoleNoVel-v1", "--total-timesteps", "512", "--num-envs", "4", "--num-steps", "32",
              "--update-epochs", "2"], 3),
    "pendulum": (["ppo", "--env-id", "Pendulum-v1", "--total-timesteps", "1024", "--num-envs", "2", "--num-steps", "512",
                  "--update-epochs", "2", "--num-minibatches", "2"], 2),
    "breakout": (["ppo", "--env-id", BREAKOUT, "--total-timesteps", "16", "--num-envs", "1", "--num-steps", "16",
                  "--update-epochs", "1", "--num-minibatches", "1", "--memory-format", "contiguous"], 1),
    "spread": (["ppo", "--env-id", SPREAD, "--total-timesteps", "1536", "--num-envs", "6", "--num-steps", "128"], 2),
    # a custom id (its module imported only when named: export, eval and the player each take --env-id) with a Dict
    # observation, flattened for the network
    "dict_obs": (["ppo", "--env-id", DICT_OBS, "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64"], 2),
}
TRAIN_FLAGS = ["--env-backend", "sync", "--torch-threads", "1", "--precision", "fp32", "--no-progress"]  # fp32: no measuring
# One process plays every case (a process start costs seconds): the player's main() per case, each one's exit status,
# output and error lines kept, then what it imported. The results go to a file: ALE writes its banner on the terminal.
DRIVER = """
import contextlib, io, json, runpy, sys
player = runpy.run_path(sys.argv[1])
results = {}
for name, argv in json.loads(sys.argv[3]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = player["main"](argv)
        except SystemExit as exc:
            code = exc.code
    results[name] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
results["modules"] = sorted(sys.modules)
open(sys.argv[2], "w").write(json.dumps(results))
"""


def player_module():
    """examples/play_exported.py imported in this process (for what needs fleetrl beside it: the frames' comparison)."""
    spec = importlib.util.spec_from_file_location("play_exported", PLAYER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def metadata(model: Path) -> dict:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return json.loads(session.get_modelmeta().custom_metadata_map["fleetrl"])


def fleetrl_ok(*args: str) -> str:
    proc = run_fleetrl_here(*args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """Each case trained and exported in this process: name -> (its checkpoint, its .onnx file)."""
    folder = tmp_path_factory.mktemp("export-player")
    made = {}
    for name, (train, _) in CASES.items():
        fleetrl_ok("train", *train, "--run-dir", str(folder / name), *TRAIN_FLAGS)
        checkpoint = str(next((folder / name / "checkpoints").glob("ckpt_*.pt")))
        fleetrl_ok("export", checkpoint, "--out", str(folder / f"{name}.onnx"), *env_flags(name))
        made[name] = (checkpoint, folder / f"{name}.onnx")
    return made


def env_flags(name: str) -> list[str]:
    """--env-id for a case whose env id names a module, which fleetrl and the player import only when told."""
    return ["--env-id", DICT_OBS] if name == "dict_obs" else []


def with_metadata(source: Path, target: Path, change) -> str:
    """A copy of an exported file whose fleetrl metadata is ``change(metadata)`` (None: none at all)."""
    import onnx

    model = onnx.load(str(source))
    meta = json.loads({p.key: p.value for p in model.metadata_props}["fleetrl"])
    del model.metadata_props[:]
    changed = change(meta)
    if changed is not None:
        model.metadata_props.add(key="fleetrl", value=json.dumps(changed))
    onnx.save(model, str(target))
    return str(target)


def text_file(path: Path) -> str:
    path.write_text("not a model")
    return str(path)


def procgen(meta: dict) -> dict:
    return {**meta, "env_id": "CoinrunEasy-v0", "family": "procgen", "preprocessing": {"kind": "envpool", "task_id": "CoinrunEasy-v0"}}


def image_game(meta: dict) -> dict:
    return {**meta, "env_id": "pettingzoo.atari.pong_v3", "family": "multiagent-image",
            "preprocessing": {**meta["preprocessing"], "module": "pettingzoo.atari.pong_v3", "image": True}}


def custom_module(meta: dict) -> dict:
    return {**meta, "env_id": "my_envs:Balance-v0", "preprocessing": {**meta["preprocessing"], "module": "my_envs",
                                                                       "gymnasium_id": "Balance-v0"}}


# bad input: (the model, made from the CartPole one; what its one line must say)
BAD = {
    "missing": (lambda source, folder: str(folder / "nothing.onnx"), "no such file"),
    "not_onnx": (lambda source, folder: text_file(folder / "notes.onnx"), "ONNX Runtime cannot load it as a model"),
    "no_metadata": (lambda source, folder: with_metadata(source, folder / "bare.onnx", lambda meta: None), "has no fleetrl metadata"),
    "procgen": (lambda source, folder: with_metadata(source, folder / "procgen.onnx", procgen), "is a Procgen env"),
    "image_game": (lambda source, folder: with_metadata(source, folder / "image.onnx", image_game), "PettingZoo image game"),
    "custom_module": (lambda source, folder: with_metadata(source, folder / "custom.onnx", custom_module),
                      "name it yourself with --env-id my_envs:Balance-v0"),
}


@pytest.fixture(scope="module")
def played(models, tmp_path_factory) -> dict:
    """Every case, the --env-id and summary runs and the bad inputs, played in one process without fleetrl."""
    folder = tmp_path_factory.mktemp("export-player-runs")
    runs = {name: [str(models[name][1]), "--episodes", str(episodes), "--seed", str(SEED), "--json", *env_flags(name)]
            for name, (_, episodes) in CASES.items()}
    runs["cartpole_v0"] = [str(models["cartpole"][1]), "--env-id", "CartPole-v0", "--episodes", "2", "--seed", str(SEED), "--json"]
    runs["summary"] = [str(models["spread"][1]), "--episodes", "1", "--seed", str(SEED)]
    runs.update({f"bad_{name}": [make(models["cartpole"][1], folder), "--episodes", "1"] for name, (make, _) in BAD.items()})
    results = folder / "results.json"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(PLAYER), str(results), json.dumps(runs)], capture_output=True,
                          text=True, timeout=300, env=fleetrl_env())  # the tests' folder importable: fleetrl_test_envs
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(results.read_text())


def test_the_player_imports_neither_torch_nor_fleetrl(played):
    assert "onnxruntime" in played["modules"] and "ale_py" in played["modules"] and "mpe2" in played["modules"], "it played"
    assert "torch" not in played["modules"]
    assert [m for m in played["modules"] if m == "fleetrl" or m.startswith("fleetrl.")] == []


def eval_json(checkpoint: str, episodes: int, *flags: str) -> str:
    out = fleetrl_ok("eval", checkpoint, "--json", "--episodes", str(episodes), "--seed", str(SEED), *flags)
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["cartpole", "lstm", "breakout", "spread", "dict_obs"])
def test_a_discrete_policy_prints_evals_json_exactly(name, models, played):
    run = played[name]
    assert run["code"] == 0, run["err"]
    assert run["out"].strip() == eval_json(models[name][0], CASES[name][1], *env_flags(name))
    result = json.loads(run["out"])
    assert result["episodes"] == CASES[name][1]
    meta = metadata(models[name][1])
    assert (meta["recurrent"] is not None) == (name == "lstm") and (meta["preprocessing"]["kind"] == "atari") == (name == "breakout")
    if name == "dict_obs":
        assert meta["preprocessing"]["flatten_observation"] is True
    if name == "spread":  # every agent a row, the policy plays them all
        assert list(result["agent_returns"]) == ["agent_0", "agent_1", "agent_2"] and result["opponent"] == "self"
        assert len(result["returns"]) == 3 * CASES[name][1]


def test_a_continuous_policy_with_normalised_observations_returns_within_one_percent(models, played):
    run = played["pendulum"]
    assert run["code"] == 0, run["err"]
    assert metadata(models["pendulum"][1])["observation_normalization"], "the frozen statistics are in the graph"
    ours, theirs = json.loads(run["out"]), json.loads(eval_json(models["pendulum"][0], CASES["pendulum"][1]))
    for key in ("checkpoint", "env_id", "global_step", "episodes", "mean_length"):
        assert ours[key] == theirs[key], key
    assert len(ours["returns"]) == len(theirs["returns"]) == CASES["pendulum"][1]
    np.testing.assert_allclose(ours["returns"], theirs["returns"], rtol=0.01)
    np.testing.assert_allclose(ours["mean_return"], theirs["mean_return"], rtol=0.01)


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
def test_env_id_plays_another_env_as_eval_does(models, played):
    run = played["cartpole_v0"]
    assert run["code"] == 0, run["err"]
    assert json.loads(run["out"])["env_id"] == "CartPole-v0"
    assert run["out"].strip() == eval_json(models["cartpole"][0], 2, "--env-id", "CartPole-v0")


def test_without_json_it_prints_evals_lines(models, played):
    run = played["summary"]
    assert run["code"] == 0, run["err"]
    lines = run["out"].strip().splitlines()
    expected = fleetrl_ok("eval", models["spread"][0], "--episodes", "1", "--seed", str(SEED)).strip().splitlines()[-2:]
    assert lines == expected


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_refused_in_one_line_with_exit_2(name, played):
    run = played[f"bad_{name}"]
    assert run["code"] == 2 and run["out"] == "", run
    assert len(run["err"].strip().splitlines()) == 1 and "Traceback" not in run["err"], run["err"]
    assert BAD[name][1] in run["err"], run["err"]


def test_atari_frames_are_fleetrls_bit_for_bit(models):
    """The player's Atari chain, built from the metadata alone, against eval's env (fleetrl's EnvFactory), on the same
    seed and random actions through lost lives, ended games and unseeded resets: every frame, reward and flag equal."""
    from fleetrl.envs.registry import EnvFactory

    steps = metadata(models["breakout"][1])["preprocessing"]
    ours, theirs = player_module().atari_env(BREAKOUT, steps), EnvFactory(BREAKOUT, "atari", training=False)()
    try:
        (a, _), (b, _) = ours.reset(seed=SEED), theirs.reset(seed=SEED)
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape == (4, 84, 84) and np.array_equal(a, b)
        # 260 random actions of this generator: a point at step 52, two games over by step 255
        actions = np.random.default_rng(6).integers(ours.action_space.n, size=260)
        lives, games, scored = set(), 0, False
        for action in actions:
            a, *rest_a = ours.step(int(action))
            b, *rest_b = theirs.step(np.int64(action))
            assert np.array_equal(a, b) and rest_a[:3] == rest_b[:3]
            assert rest_a[3].get("episode") == rest_b[3].get("episode")
            lives.add(ours.unwrapped.ale.lives())
            scored |= rest_a[0] > 0
            if rest_a[1] or rest_a[2]:
                games += 1
                (a, _), (b, _) = ours.reset(), theirs.reset()
                assert np.array_equal(a, b)
        assert games >= 2 and len(lives) >= 3 and scored, (games, lives)  # through lost lives, points and games' ends
    finally:
        ours.close()
        theirs.close()
