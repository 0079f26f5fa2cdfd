"""The memory of DQN Atari's replay buffer, measured on a filled 1M-transition buffer (issue 13's target: at most 8 GB).

    python benchmarks/replay_memory.py                      # 1M transitions of BreakoutNoFrameskip-v4 (needs ~9 GB free)
    python benchmarks/replay_memory.py --capacity 100000    # a smaller check
    python benchmarks/replay_memory.py --markdown mem.md --backend ale

What it does:
1. Checks the memory available first, and refuses to start (exit code 2) when the buffer, the recorded frames and a
   margin would not fit.
2. Records a short real run: ``--source-steps`` steps (extended to the end of a game) of random actions in fleetrl's
   training env for DQN Atari (84x84 grayscale, stack 4, episodic life: an episode ends at every lost life, a game
   every few hundred steps), with its same-step autoreset and ``final_obs``.
3. Builds what a DQN Atari process holds: fleetrl's ``ReplayBuffer`` for ``--capacity`` transitions, the Q-network,
   its target and Adam (after one update, so Adam's state exists).
4. Fills the buffer with the recorded steps, cycled (each cycle starts at a new game, as the env does), until every
   slot and every frame of the frame rings has been written, so the whole buffer is resident, as in a long run.
5. Checks the buffer: the stacks it rebuilds for sampled transitions equal the recorded ones (obs, and next obs
   including the true final observation at episode ends), and counts the transitions that can still be sampled.
6. Prints a table: the process RSS (psutil) of the filled buffer, the buffer's ``required_bytes``, and what
   CleanRL's ``dqn_atari.py`` (SB3's buffer with ``optimize_memory_usage=True``) and SB3's default buffer (obs and
   next obs apart) take for the same transitions, from SB3's array shapes (not allocated here).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_BYTES = 8e9  # issue 13: a 1M-transition Atari buffer in at most 8 GB
MARGIN_BYTES = 2 << 30  # free memory kept beyond the buffer and the recorded frames: torch, the env, the networks
VERIFY_SAMPLES = 20_000
VERIFY_CHUNK = 1_000
EXTRA_FILL_CAP = 1.5  # never add more than this many times the capacity while waiting for the frame rings to wrap


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB ({n / 2**30:,.2f} GiB)"


def rss() -> int:
    return psutil.Process().memory_info().rss


def sb3_bytes(capacity: int, obs_shape: tuple[int, ...], optimize_memory_usage: bool) -> int:
    """SB3's ReplayBuffer arrays for a Discrete action space and uint8 observations, one env: observations,
    next_observations (unless optimize_memory_usage), actions int64 (N, 1, 1), rewards, dones, timeouts float32."""
    obs = capacity * int(np.prod(obs_shape))
    return obs * (1 if optimize_memory_usage else 2) + capacity * (8 + 4 + 4 + 4)


def record(env_id: str, backend: str, steps: int, seed: int):
    """Random actions for at least ``steps`` steps, to the end of a game: the observations (steps + 1 of them, each
    step's next obs is the next step's obs) and each step's actions, rewards, flags and final obs."""
    from fleetrl.envs import make_vector_env

    envs = make_vector_env(env_id, 1, backend, training=True)
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    observations, actions, rewards, terminated, truncated, finals = [obs], [], [], [], [], {}
    games = lives = 0
    while True:
        action = rng.integers(envs.single_action_space.n, size=1)
        next_obs, reward, term, trunc, info = envs.step(action)
        if info and "_final_obs" in info and info["_final_obs"][0]:
            finals[len(actions)] = np.array(info["final_obs"])
            lives += 1
        game_over = bool(info and "_episode" in info and info["_episode"][0])  # a whole game ended (not only a life)
        games += game_over
        observations.append(next_obs)
        actions.append(action)
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
        if len(actions) >= steps and (game_over or len(actions) >= 3 * steps):  # a game's end, or give up waiting
            break
    spaces = envs.single_observation_space, envs.single_action_space
    backend_used = getattr(envs, "backend", backend)
    envs.close()
    return dict(obs=np.stack(observations), actions=np.stack(actions), rewards=np.stack(rewards), terminated=np.stack(terminated),
                truncated=np.stack(truncated), finals=finals, games=games, episodes=lives, spaces=spaces, backend=backend_used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--backend", default="sync", help="fleetrl env backend for the recorded run (sync: fleetrl's gymnasium chain; ale)")
    parser.add_argument("--capacity", type=int, default=1_000_000, help="replay buffer transitions (DQN Atari's --buffer-size)")
    parser.add_argument("--source-steps", type=int, default=3_000, help="real env steps recorded, then cycled (extended to a game's end)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    opts = parser.parse_args()
    sys.path[:0] = [ROOT, HERE]

    import gymnasium as gym
    import torch

    from fleetrl.sampling import replay
    from ppo_speed import host_description  # the same host line as the speed benchmarks

    # 1. memory first: refuse rather than push the machine into swap or the OOM killer
    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(4)
    need = replay.required_bytes(opts.capacity, obs_space, action_space)
    source_bytes = int(opts.source_steps * 1.2) * int(np.prod(obs_space.shape))
    available = psutil.virtual_memory().available
    if need + source_bytes + MARGIN_BYTES > available:
        print(f"replay_memory: not enough free memory: the buffer needs {gb(need)}, the recorded frames about {gb(source_bytes)}, "
              f"plus {gb(MARGIN_BYTES)} of margin, and this machine has {gb(available)} available now. Free memory (stop other "
              f"runs) or lower --capacity.", file=sys.stderr)
        raise SystemExit(2)

    started = time.perf_counter()
    torch.manual_seed(opts.seed)
    np.random.seed(opts.seed)
    rss_start = rss()
    src = record(opts.env_id, opts.backend, opts.source_steps, opts.seed)
    if src["spaces"][0].shape != obs_space.shape or src["spaces"][0].dtype != np.uint8:
        raise SystemExit(f"replay_memory: {opts.env_id} gives {src['spaces'][0]}, expected {obs_space}")
    obs_space, action_space = src["spaces"]
    n = len(src["actions"])
    source_nbytes = sum(a.nbytes for k, a in src.items() if isinstance(a, np.ndarray)) + sum(a.nbytes for a in src["finals"].values())
    print(f"recorded {n:,} steps of {opts.env_id} ({src['backend']} backend): {src['games']} games, {src['episodes']} episodes "
          f"(lives), {source_nbytes / 1e6:,.0f} MB", file=sys.stderr, flush=True)

    # 3. what a DQN Atari process holds
    from fleetrl.algos.dqn import QNetwork

    q_network = QNetwork(obs_space.shape, int(action_space.n))
    target_network = QNetwork(obs_space.shape, int(action_space.n))
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-4, fused=True)
    rss_before_buffer = rss()
    rb = replay.ReplayBuffer(opts.capacity, 1, obs_space, action_space, "cpu")
    rss_empty = rss()

    # 4. fill: every slot, and every frame of the frame ring, written at least once
    fill_started = time.perf_counter()
    total = 0
    cap = int(opts.capacity * EXTRA_FILL_CAP)
    empty_info: dict = {}
    while total < opts.capacity or (rb.frame_stack and int(rb.written.min()) < rb.frames_per_env and total < cap):
        k = total % n
        info = {"final_obs": src["finals"][k], "_final_obs": np.ones(1, bool)} if k in src["finals"] else empty_info
        rb.add(src["obs"][k], src["obs"][k + 1], src["actions"][k], src["rewards"][k], src["terminated"][k], src["truncated"][k], info)
        total += 1
        if total % 100_000 == 0:
            rate = total / (time.perf_counter() - fill_started)
            print(f"  filled {total:,} ({rate:,.0f} adds/s; RSS {rss() / 1e9:.2f} GB)", file=sys.stderr, flush=True)
    fill_s = time.perf_counter() - fill_started
    rss_filled = rss()

    # a few DQN updates on sampled batches: Adam's state, and sampling timed
    batch_size, updates = 32, 50
    t0 = time.perf_counter()
    for _ in range(updates):
        data = rb.sample(batch_size)
    sample_ms = (time.perf_counter() - t0) / updates * 1e3
    for _ in range(3):
        data = rb.sample(batch_size)
        with torch.no_grad():
            target = data.rewards + 0.99 * target_network(data.next_obs).max(dim=1).values * (1 - data.dones)
        loss = torch.nn.functional.mse_loss(q_network(data.obs).gather(1, data.actions.long().view(-1, 1)).squeeze(1), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rss_final = rss()

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the check below gathers its own copies

    # 5. the rebuilt stacks equal the recorded ones (in chunks: a gathered batch of stacks is large)
    sampleable = len(rb.sampleable()) if rb.frame_stack else len(rb)
    obs_ok = next_ok = dones_ok = True
    ended_checked = 0
    for _ in range(VERIFY_SAMPLES // VERIFY_CHUNK):
        indices = rb.sample_indices(VERIFY_CHUNK)
        batch = rb.get(indices)
        last_add = indices + ((total - 1 - indices) // rb.capacity) * rb.capacity  # the add that wrote each slot last
        k = last_add % n
        expected_next = src["obs"][k + 1, 0]
        for row, kk in enumerate(k.tolist()):
            if kk in src["finals"]:
                expected_next[row] = src["finals"][kk][0]
                ended_checked += 1
        obs_ok &= np.array_equal(batch.obs.numpy(), src["obs"][k, 0])
        next_ok &= np.array_equal(batch.next_obs.numpy(), expected_next)
        dones_ok &= np.array_equal(batch.dones.numpy(), src["terminated"][k, 0].astype(np.float32))

    # 6. the table
    frames_per_add = rb.written.sum() / total if rb.frame_stack else 0.0
    cleanrl = sb3_bytes(opts.capacity, obs_space.shape, optimize_memory_usage=True)
    sb3 = sb3_bytes(opts.capacity, obs_space.shape, optimize_memory_usage=False)
    lines = [
        "## Replay memory, DQN Atari (benchmarks/replay_memory.py)", "",
        *[f"{line}  " for line in host_description()],
        f"Memory: {psutil.virtual_memory().total / 2**30:.1f} GiB; command: `python benchmarks/replay_memory.py "
        f"{' '.join(sys.argv[1:])}`; {time.perf_counter() - started:.0f} s.", "",
        f"{opts.capacity:,}-transition buffer of {opts.env_id} ({obs_space.shape} uint8 stacks), filled with {total:,} adds: "
        f"{n:,} recorded steps of random actions ({src['games']} games, {src['episodes']} episodes with episodic life), cycled.", "",
        "| what | bytes |",
        "| --- | --- |",
        f"| fleetrl `ReplayBuffer.required_bytes` | {gb(need)} |",
        f"| **process RSS, filled buffer** (the whole DQN Atari process: buffer, Q-network, target, Adam, torch, and the "
        f"recorded frames) | **{gb(rss_final)}** |",
        f"| RSS added by building and filling the buffer | {gb(rss_filled - rss_before_buffer)} |",
        f"| RSS before the buffer (torch, env run, networks, recorded frames) | {gb(rss_before_buffer)} |",
        f"| of which the recorded source frames (not part of a training run) | {gb(source_nbytes)} |",
        f"| peak RSS (ru_maxrss) up to here | {gb(peak)} |",
        f"| CleanRL `dqn_atari.py`: SB3 buffer, `optimize_memory_usage=True` (obs once, next obs = the next row) | {gb(cleanrl)} |",
        f"| SB3 `ReplayBuffer` default (obs and next obs apart) | {gb(sb3)} |",
        "",
        f"- Target: a filled {opts.capacity:,}-transition buffer in at most 8 GB"
        f"{'' if opts.capacity == 1_000_000 else ' (the target is for 1M; this run is smaller)'}. The buffer: {gb(rss_filled - rss_before_buffer)} "
        f"resident (required_bytes {gb(need)}): {'met' if max(need, rss_filled - rss_before_buffer) <= TARGET_BYTES else 'NOT met'}. "
        f"The whole process: {gb(rss_final)}, {'within' if rss_final <= TARGET_BYTES else 'over'} 8 GB (8e9 bytes), "
        f"{'within' if rss_final <= 8 * 2**30 else 'over'} 8 GiB; without the recorded frames, which a training run does not "
        f"hold, {gb(rss_final - source_nbytes)}. CleanRL's dqn_atari.py takes {cleanrl / rss_final:.1f}x this process's RSS, "
        f"SB3's default {sb3 / rss_final:.1f}x.",
        f"- Frames written per transition added: {frames_per_add:.3f} (new episodes store their first stack's distinct frames); "
        f"frame ring {rb.frames_per_env if rb.frame_stack else 0:,} frames per env for {rb.capacity:,} transitions; "
        f"sampleable transitions {sampleable:,} of {len(rb):,}.",
        f"- Rebuilt stacks checked against the recorded run on {VERIFY_SAMPLES:,} sampled transitions ({ended_checked:,} of them "
        f"at an episode end, next obs = the true final obs): obs {'equal' if obs_ok else 'DIFFER'}, next obs "
        f"{'equal' if next_ok else 'DIFFER'}, dones {'equal' if dones_ok else 'DIFFER'}.",
        f"- Fill: {total / fill_s:,.0f} adds/s ({fill_s:.0f} s); sampling a batch of {batch_size}: {sample_ms:.2f} ms. "
        f"RSS at start {gb(rss_start)}, after allocating the empty buffer {gb(rss_empty)} (numpy's untouched pages are not resident).",
        "",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if opts.markdown:
        with open(opts.markdown, "w") as f:
            f.write(text + "\n")
    if not (obs_ok and next_ok and dones_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
