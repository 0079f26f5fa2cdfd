"""PettingZoo games as rows of the vector (fleetrl/envs/multiagent.py) and parameter-shared PPO on them."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from conftest import killed_on_exit, require_module, run_fleetrl_here, run_fleetrl_in_process, start_fleetrl_group, wait_for_checkpoint
from fleetrl import checkpoint
from fleetrl.algos.ppo import Agent, gae, rollout
from fleetrl.envs import make_vector_env
from fleetrl.envs.vector import episode_stats
from fleetrl.errors import FleetError
from fleetrl.monitor.tbread import read_scalars
from fleetrl.monitor.timing import PhaseTimer
from fleetrl.sampling.sampler import Sampler

require_module("pettingzoo")

COORDINATE = "fleetrl_test_games.coordinate"  # tests/fleetrl_test_games/
LEAVE_EARLY = "fleetrl_test_games.leave_early"


def agent_of_rows(obs: np.ndarray) -> np.ndarray:
    """The coordination game's observation says which agent sees it (one-hot at 3 + k)."""
    return obs[:, 3:5].argmax(1)


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_rows_are_agents_game_by_game_and_stay_so_after_resets(backend):
    envs = make_vector_env(COORDINATE, 6, backend)
    try:
        assert (envs.num_envs, envs.num_games, envs.agent_rows) == (6, 3, 2)
        assert envs.single_observation_space.shape == (5,) and envs.single_action_space.n == 3
        obs, _ = envs.reset(seed=3)
        expected = np.tile([0, 1], 3)  # row g*2+k is agent k of game g
        assert (agent_of_rows(obs) == expected).all()
        assert (obs[0::2, :3] == obs[1::2, :3]).all(), "both agents of a game see its cue"
        for _ in range(25):  # through two game ends (10 steps each) and their resets
            obs, reward, terminated, truncated, info = envs.step(np.zeros(6, np.int64))
            assert (agent_of_rows(obs) == expected).all()
            assert (reward[0::2] == reward[1::2]).all(), "a shared team reward"
    finally:
        envs.close()


def test_rows_keep_their_agents_after_a_worker_restart():
    envs = make_vector_env(COORDINATE, 4, "async", env_workers=2)
    try:
        envs.reset(seed=1)
        envs.step(np.zeros(4, np.int64))
        victim = envs.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        obs, reward, terminated, truncated, info = envs.step(np.zeros(4, np.int64))
        assert envs.worker_restarts == 1 and envs.worker_pids[1] != victim
        assert (agent_of_rows(obs) == [0, 1, 0, 1]).all()
        assert truncated[2:].all() and not truncated[:2].any(), "the restarted worker's game is cut for both its agents"
        obs, *_ = envs.step(np.zeros(4, np.int64))
        assert (agent_of_rows(obs) == [0, 1, 0, 1]).all()
    finally:
        envs.close()


@pytest.mark.parametrize("backend, options", [("sync", {}), ("async", {}), ("async", {"env_workers": 1, "env_threads": 2})],
                         ids=["sync", "async", "async-stepping-threads"])
def test_an_agent_that_leaves_early_is_masked_and_its_episode_is_its_own(backend, options):
    envs = make_vector_env(LEAVE_EARLY, 4, backend, **options)  # rows: stayer, quitter, stayer, quitter
    try:
        envs.reset(seed=0)
        lives, episodes, flags = [], [], []
        for _ in range(9):
            obs, reward, terminated, truncated, info = envs.step(np.zeros(4, np.int64))
            lives.append(info.get("live", np.ones(4, bool)).copy())
            flags.append((terminated.copy(), truncated.copy()))
            episodes += episode_stats(info, "agent")
            if "_final_obs" in info:
                assert (info["_final_obs"] == (terminated | truncated)).all()
        quitter = [live[1] for live in lives]
        # the quitter leaves on the game's step 3 and comes back when the game restarts after step 8
        assert quitter == [True, True, False, False, False, False, False, True, True]
        assert all(live[0] for live in lives), "the stayer plays every step"
        assert flags[2][0][1] and not flags[2][1][1], "the quitter's last transition is terminated"
        assert not any(flags[t][0][1] or flags[t][1][1] for t in range(3, 7)), "no flags while it is gone"
        assert flags[7][1][0] and not flags[7][0][1], "the game's time limit truncates the stayer only"
        assert sorted(set(episodes)) == [(3.0, 3, 1), (8.0, 8, 0)], "each agent's own return and length"
    finally:
        envs.close()


def test_sampler_stores_no_transition_for_a_gone_agent_and_gae_does_not_cross_its_gap():
    envs = make_vector_env(LEAVE_EARLY, 2, "sync")
    torch.manual_seed(0)
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    sampler = Sampler(envs, agent, 16, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer())
    try:
        b = sampler.collect()
    finally:
        sampler.close()
    quitter = b.live[:, 1]
    # game steps 1..8 then 1..8 again: the quitter acts on steps 1-3 of each game
    assert quitter.tolist() == [True] * 3 + [False] * 5 + [True] * 3 + [False] * 5
    assert b.live[:, 0].all()
    assert b.terminated[2, 1] and b.terminated[10, 1]
    advantages = gae(b, 0.99, 0.95)
    # the quitter's last live step: its own reward and value only, nothing from the steps after the gap
    assert advantages[2, 1] == pytest.approx(b.rewards[2, 1] - b.values[2, 1], abs=1e-6)
    assert (b.rewards[~b.live] == 0).all()


def test_normalisation_statistics_leave_out_the_rows_of_a_gone_agent():
    """--normalize through the sampler: the blank rows of the quitter's gaps are not observations or transitions. Every
    live observation of the game has a 1.0 in column 2 (blank rows are zeros), and the reward statistics merge one
    return per live transition."""
    from fleetrl.sampling.normalize import ObsNormalizer, RewardNormalizer

    envs = make_vector_env(LEAVE_EARLY, 2, "sync")
    torch.manual_seed(0)
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    obs_norm, reward_norm = ObsNormalizer(envs.single_observation_space.shape), RewardNormalizer(2, 0.99)
    sampler = Sampler(envs, agent, 16, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(),
                      obs_norm=obs_norm, reward_norm=reward_norm)
    try:
        b = sampler.collect()
    finally:
        sampler.close()
    assert not b.live.all(), "the quitter's gaps are in the rollout"
    assert obs_norm.rms.mean[2] == pytest.approx(1.0, abs=1e-5) and obs_norm.rms.var[2] == pytest.approx(0.0, abs=1e-4)
    # observations: the 2 at reset, and each step's live next ones (the last step's game ended and restarted: 2)
    assert obs_norm.rms.count == pytest.approx(1e-4 + b.live.sum() + 2)
    assert reward_norm.rms.count == pytest.approx(1e-4 + b.live.sum())


@pytest.mark.slow
def test_parameter_shared_ppo_learns_the_coordination_game_and_plays_it_greedily(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", "ppo", "--env-id", COORDINATE, "--total-timesteps", "20000", "--learning-rate", "3e-3", "--num-envs",
                          "8", "--num-steps", "64", "--seed", "1", "--torch-threads", "1", "--env-backend", "sync", "--run-dir", str(run_dir),
                          "--no-progress")
    assert trained.returncode == 0, trained.stderr[-3000:]
    returns = [p.value for p in read_scalars(str(run_dir), "charts/episodic_return")]
    assert np.mean(returns[:40]) < 2.5, "a random team wins about 1 step in 9"
    assert np.mean(returns[-40:]) > 8.5, "one network plays both roles"
    for player in (0, 1):  # CleanRL's per-player charts
        assert read_scalars(str(run_dir), f"charts/episodic_return-player{player}")
    out = run_fleetrl_here("eval", str(run_dir), "--env-id", COORDINATE, "--episodes", "4", "--json").stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["episodes"] == 4 and result["mean_return"] == 10.0
    assert result["agent_returns"] == {"player_0": [10.0] * 4, "player_1": [10.0] * 4}
    out = run_fleetrl_here("eval", str(run_dir), "--env-id", COORDINATE, "--episodes", "20", "--opponent", "random", "--json").stdout
    against_random = json.loads(out.strip().splitlines()[-1])
    assert 1.0 < against_random["mean_return"] < 6.0, "a random partner plays its role a third of the time"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigterm_checkpoints_and_the_resumed_run_ends_bit_identical(tmp_path, monkeypatch):
    # 32 steps an iteration are 4 whole games of 8 steps, so each checkpoint falls between games, and a resumed run's
    # fresh games are the ones an uninterrupted run plays next. The uninterrupted run and the resume run in this process
    # (1 torch thread, as the stopped process) at full speed; only the stopped process's steps sleep 5 ms each, so that the
    # SIGTERM lands mid-run (a game's outcome never depends on the sleep). The signal is the real one
    tiny = ["train", "ppo", "--env-id", LEAVE_EARLY, "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--seed", "3",
            "--torch-threads", "1", "--env-backend", "sync", "--no-progress", "--total-timesteps", str(12 * 128), "--checkpoint-every", "1"]
    whole = run_fleetrl_here(*tiny, "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    monkeypatch.setenv("LEAVE_EARLY_STEP_S", "0.005")
    proc = start_fleetrl_group(*tiny, "--run-dir", str(tmp_path / "part"))
    monkeypatch.delenv("LEAVE_EARLY_STEP_S")
    with killed_on_exit(proc):
        wait_for_checkpoint(proc, tmp_path / "part", min_step=2 * 128)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    stopped = checkpoint.load_checkpoint(tmp_path / "part")
    assert 2 * 128 <= stopped["global_step"] < 12 * 128
    resumed = run_fleetrl_here(*tiny, "--run-dir", str(tmp_path / "part"), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = checkpoint.load_checkpoint(tmp_path / "whole"), checkpoint.load_checkpoint(tmp_path / "part")
    assert first["global_step"] == second["global_step"] == 12 * 128
    for key in first["model"]:
        assert torch.equal(first["model"][key], second["model"][key]), key
    quitter = [p.value for p in read_scalars(str(tmp_path / "part"), "charts/episodic_length-player1")]
    assert set(quitter) == {3.0}, "the quitter's episodes are its own 3 steps"


@pytest.mark.parametrize("argv, words", [
    (["--env-id", "fleetrl_test_games.no_such_game"], ["cannot import", "parallel_env"]),
    (["--env-id", "fleetrl_test_games.turns"], ["aec_to_parallel", "turn"]),
    (["--env-id", "fleetrl_test_games.mismatched"], ["different action spaces", "Discrete(3)", "Discrete(4)"]),
    (["--env-id", COORDINATE, "--num-envs", "3"], ["multiple of 2", "whole games"]),
    (["--env-id", COORDINATE, "--env-backend", "envpool"], ["sync and async"]),
])
def test_bad_multiagent_input_is_one_clear_error(argv, words, tmp_path):
    result = run_fleetrl_here("train", "ppo", *argv, "--total-timesteps", "4096", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def builtins_without_agent_rows() -> list[str]:
    import importlib

    from fleetrl.algos import ALGOS

    return [a for a in ALGOS if importlib.import_module(f"fleetrl.algos.{a}").AGENT_ROWS is not True]


def test_only_ppo_declares_that_it_trains_agent_rows():
    """Each built-in says in a line whether the live mask reaches its buffers, losses and normalisers; today PPO's does."""
    from fleetrl.algos import ALGOS

    assert sorted(set(ALGOS) - set(builtins_without_agent_rows())) == ["ppo"]


@pytest.mark.parametrize("algo", builtins_without_agent_rows())
def test_an_algorithm_that_does_not_train_agent_rows_refuses_a_game_in_one_paragraph(tmp_path, algo):
    """In this process (fleetrl.cli.main), before anything starts; the paragraph names the algorithms that do."""
    result = run_fleetrl_in_process("train", algo, "--env-id", COORDINATE, "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip()
    assert f"`fleetrl train {algo}` does not train PettingZoo games" in message and "\n" not in message, message
    assert "Train this game with `fleetrl train ppo`" in message and "fleetrl new my_ppo --from ppo" in message, message
    assert not (tmp_path / "r").exists(), "refused before the run folder is made"


def test_the_refusal_names_every_algorithm_that_declares_agent_rows(monkeypatch):
    """The list is read from the algorithms' own lines, not written into the message."""
    from fleetrl import config
    from fleetrl.algos import dqn, ppg

    monkeypatch.setattr(dqn, "AGENT_ROWS", True)
    with pytest.raises(FleetError, match="Train this game with `fleetrl train ppo` or `fleetrl train dqn`"):
        ppg.train(ppg.Args(env_id=COORDINATE))
    monkeypatch.setattr(ppg, "AGENT_ROWS", True)
    config.check_agent_rows(COORDINATE, "multiagent", "ppg", "fleetrl train ppg")  # declared: not refused


def test_a_users_file_trains_a_game_only_if_it_says_so(tmp_path):
    """A copy of PPO says AGENT_ROWS = True (it is PPO's file); a copy of DQN says False; a file that says nothing is
    refused: silence must not let blank rows into a loss."""
    from fleetrl.tools.new import template

    for name, algo, edit in [("rows_dqn", "dqn", None), ("rows_silent", "ppo", "AGENT_ROWS = True")]:
        text = template(algo, name)
        if edit:
            assert text.count(f"\n{edit}") == 1
            text = text.replace(f"\n{edit}", "\n# (no declaration)")
        (tmp_path / f"{name}.py").write_text(text)
        result = run_fleetrl_in_process("train", f"./{name}.py", "--env-id", COORDINATE, "--run-dir", str(tmp_path / name), cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"`fleetrl train ./{name}.py` does not train PettingZoo games" in result.stderr, result.stderr
        assert "`fleetrl train ppo`" in result.stderr
    (tmp_path / "rows_ppo.py").write_text(template("ppo", "rows_ppo"))
    result = run_fleetrl_in_process("train", "./rows_ppo.py", "--env-id", COORDINATE, "--num-envs", "3", "--run-dir",
                                    str(tmp_path / "ppo"), cwd=tmp_path)
    assert result.returncode == 2 and "multiple of 2" in result.stderr, result.stderr  # past the check: to the games' count


def test_observations_of_different_lengths_are_padded():
    envs = make_vector_env("fleetrl_test_games.padded", 2, "sync")
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 5) and (obs[1, 3:] == 0).all()
    finally:
        envs.close()


def test_a_missing_pettingzoo_module_is_named():
    with pytest.raises(FleetError, match="cannot import"):
        make_vector_env("fleetrl_test_games.nothing_here", 2, "sync")


def test_a_missing_rom_is_one_paragraph_that_says_where_ale_py_keeps_them(tmp_path, monkeypatch):
    # an ale-py without ROMs, for real: PettingZoo is pointed at an empty folder and raises its own missing-ROM error
    from fleetrl.envs import multiagent

    empty = tmp_path / "roms"
    empty.mkdir()
    monkeypatch.setattr(multiagent, "ale_rom_folder", lambda: str(empty))
    with pytest.raises(FleetError) as err:
        multiagent.make_parallel_env("pettingzoo.atari.pong_v3")
    message = str(err.value)
    assert "ROM" in message and str(empty) in message and "ale-py" in message and "\n" not in message


def supersuit_pong():
    """CleanRL's ppo_pettingzoo_ma_atari.py's chain, SuperSuit's wrappers on one game (its vector wrappers no longer run)."""
    import ale_py
    import supersuit as ss
    from pettingzoo.atari import pong_v3

    env = pong_v3.parallel_env(auto_rom_install_path=os.path.dirname(ale_py.__file__))
    env = ss.max_observation_v0(env, 2)
    env = ss.frame_skip_v0(env, 4)
    env = ss.clip_reward_v0(env, lower_bound=-1, upper_bound=1)
    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, x_size=84, y_size=84)
    env = ss.frame_stack_v1(env, 4)
    return ss.agent_indicator_v0(env, type_only=False)


def test_pong_frames_match_cleanrls_supersuit_chain_frame_for_frame():
    require_module("supersuit")
    require_module("ale_py")
    from fleetrl.envs.multiagent import GameEnv

    theirs, ours = supersuit_pong(), GameEnv("pettingzoo.atari.pong_v3", atari=True)
    try:
        their_obs, _ = theirs.reset(seed=5)
        our_obs, _ = ours.reset(seed=5)
        rng = np.random.default_rng(0)
        scored = 0
        for t in range(300):  # a recorded action sequence: the same random actions on both
            for k, agent in enumerate(ours.agents):  # SuperSuit's frames are channels last
                assert np.array_equal(their_obs[agent].transpose(2, 0, 1), our_obs[k]), f"step {t}, {agent}"
            actions = rng.integers(6, size=2)
            their_obs, their_reward, terminated, truncated, _ = theirs.step(dict(zip(ours.agents, actions)))
            our_obs, our_reward, our_terminated, our_truncated, _ = ours.step(actions)
            # the game's reward is clipped by the vector for learning, after it counts the score
            assert [their_reward[a] for a in ours.agents] == np.clip(our_reward, -1, 1).tolist(), f"step {t}"
            assert [terminated[a] for a in ours.agents] == our_terminated.tolist()
            scored += int(np.abs(our_reward).sum())
        assert scored > 0, "points were scored, so rewards were compared"
        assert our_obs[0][4:].max(axis=(1, 2)).tolist() == [255, 0] and our_obs[1][4:].max(axis=(1, 2)).tolist() == [0, 255]
    finally:
        theirs.close()
        ours.close()


def test_first_ready_batches_are_whole_games_and_each_agent_keeps_its_trajectory():
    envs = make_vector_env(LEAVE_EARLY, 8, "async", async_batch=4, env_workers=2)  # 4 games; batches of 2 games
    torch.manual_seed(0)
    agent = Agent(envs.single_observation_space.shape, envs.single_action_space)
    sampler = Sampler(envs, agent, 16, rollout=rollout, device=torch.device("cpu"), seed=0, env_seed=0, timer=PhaseTimer(), async_batch=4)
    try:
        b = sampler.collect()
    finally:
        sampler.close()
    assert b.env_ids.shape == (32, 4)
    assert (b.env_ids[:, 0::2] % 2 == 0).all() and (b.env_ids[:, 1::2] == b.env_ids[:, 0::2] + 1).all(), "whole games"
    for quitter in (1, 3, 5, 7):  # its transitions in arrival order follow its games: 3 steps in, 5 gone
        live = b.live[b.env_ids == quitter].tolist()
        assert live == ([True] * 3 + [False] * 5) * (len(live) // 8) + ([True] * 3 + [False] * 5)[: len(live) % 8]


@pytest.mark.slow
def test_an_mpe_game_trains_records_video_and_evaluates_per_agent(tmp_path):
    require_module("mpe2")
    run_dir = tmp_path / "run"
    trained = run_fleetrl_here("train", "ppo", "--env-id", "mpe2.simple_spread_v3", "--total-timesteps", "1536", "--capture-video",
                          "--run-dir", str(run_dir), "--no-progress")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert checkpoint.load_checkpoint(run_dir)["args"]["num_envs"] == 6, "PPO's 4 rows, rounded up to 2 games of 3"
    assert len(read_scalars(str(run_dir), "charts/episodic_return-player2")) > 0
    assert list((run_dir / "videos").glob("*.mp4"))
    out = run_fleetrl_here("eval", str(run_dir), "--episodes", "2", "--capture-video", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and set(result["agent_returns"]) == {"agent_0", "agent_1", "agent_2"}
    assert sorted(p.name for p in (run_dir / "videos_eval").glob("*.mp4")) == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_benchmark_plot_compare_and_tune_run_a_multiagent_game(tmp_path, child_env):
    """The tools in this process; the runs they start are real `fleetrl train` processes."""
    import shutil

    from optuna.trial import TrialState
    from test_tune import load, tune_args, write_space

    command = ["fleetrl", "train", "ppo", "--total-timesteps", "1024", "--num-envs", "4", "--num-steps", "64", "--env-backend", "sync"]
    out = tmp_path / "bench"
    # 100 bootstrap resamples (the least allowed), not 2,000: the intervals, not the game, were most of this test's own CPU
    bench = run_fleetrl_here("benchmark", "--env-ids", COORDINATE, "--num-seeds", "2", "--workers", "2", "--bootstrap-reps", "100", "--out",
                             str(out), "--", *command)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert f"| {COORDINATE} | return | 2 |" in bench.stdout and "IQM [95% CI]" in bench.stdout
    plot = run_fleetrl_here("plot", str(out), "-o", str(tmp_path / "curves.png"))
    assert plot.returncode == 0 and (tmp_path / "curves.png").stat().st_size > 0, plot.stderr[-3000:]
    shutil.copytree(out, tmp_path / "same")
    compare = run_fleetrl_here("compare", str(out), str(tmp_path / "same"), "--labels", "a", "b", "--bootstrap-reps", "100", "--out",
                               str(tmp_path / "compare"))
    assert compare.returncode == 0 and "| a | b | 0.500 [" in compare.stdout, compare.stdout + compare.stderr
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    space = write_space(tmp_path, "learning-rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n")
    # one trial (several at once are test_tune's); --parallel 2 gives it one thread, as a run beside another
    tune = run_fleetrl_here(*tune_args(tmp_path, "--trials", "1", "--parallel", "2", "--storage", storage, "--out", str(tmp_path / "tune"),
                                       space=space, command=command, env_ids=(COORDINATE,)))
    assert tune.returncode == 0, tune.stdout + tune.stderr
    (trial,) = load(storage).trials
    assert trial.state == TrialState.COMPLETE
    (run_dir,) = trial.user_attrs["run_dirs"]
    assert checkpoint.load_checkpoint(run_dir)["args"]["learning_rate"] == trial.params["learning-rate"], "the game's trainer got it"
