"""The small per-step costs fleetrl's code and docs quote, measured: one table, one figure each.

    python benchmarks/micro_costs.py            # a few seconds

Each row times one call many times and keeps the fastest of several rounds (the least disturbed by other jobs):
* PPO's acting on CartPole-v1 (4 envs): the numpy path (``NumpyMLPActor``, fleetrl/sampling/acting.py) against the torch
  path (``TorchActor``) on the same network;
* DQN's Q-values on CartPole-v1 (1 env): ``host_forward``'s numpy path against the torch module;
* the env output check (``CheckOutputs``, fleetrl/envs/wrappers.py): a CartPole step with it against without it;
* DQN's exploration draw: one ``np.random.random((2, n))`` call against ``np.random.randint`` per step.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

ROUNDS, CALLS = 7, 2000


def best_us(fn, calls: int = CALLS, rounds: int = ROUNDS) -> float:
    """The fastest round's microseconds per call."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def main() -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from fleetrl.algos.ppo import Agent
    from fleetrl.envs.registry import EnvFactory
    from fleetrl.envs.wrappers import CheckOutputs
    from fleetrl.nets import mlp
    from fleetrl.sampling.acting import NumpyMLPActor, TorchActor, host_forward, make_actor

    rows = []
    agent = Agent((4,), gym.spaces.Discrete(2))
    numpy_actor, torch_actor = make_actor(agent, torch.device("cpu"), 0), TorchActor(agent, torch.device("cpu"), 0)
    assert isinstance(numpy_actor, NumpyMLPActor)
    obs4 = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    rows.append(("PPO acting, CartPole, 4 envs: numpy path", best_us(lambda: numpy_actor.act(obs4))))
    rows.append(("PPO acting, CartPole, 4 envs: torch path", best_us(lambda: torch_actor.act(obs4))))

    q_network = mlp(4, 2, out_std=1.0, hidden=(120, 84), activation=torch.nn.ReLU)
    numpy_q, obs1 = host_forward(q_network, torch.device("cpu")), obs4[:1]

    def torch_q():
        with torch.inference_mode():
            return q_network(torch.as_tensor(obs1)).numpy()

    rows.append(("DQN Q-values, CartPole, 1 env: numpy path (host_forward)", best_us(lambda: numpy_q(obs1))))
    rows.append(("DQN Q-values, CartPole, 1 env: torch module", best_us(torch_q)))

    checked, plain = EnvFactory("CartPole-v1", "classic")(), gym.make("CartPole-v1")
    assert isinstance(checked, CheckOutputs)

    def stepper(env):
        env.reset(seed=0)

        def step():
            if env.step(0)[2]:
                env.reset()
        return step

    rows.append(("CartPole step through fleetrl's env (with CheckOutputs and EpisodeStats)", best_us(stepper(checked))))
    rows.append(("CartPole step, gymnasium's plain env", best_us(stepper(plain))))
    rows.append(("DQN exploration draw: np.random.random((2, 1)), one call", best_us(lambda: np.random.random((2, 1)))))
    rows.append(("DQN exploration draw: np.random.randint(2) and np.random.random()", best_us(lambda: (np.random.randint(2), np.random.random()))))

    print(f"## Per-step costs (benchmarks/micro_costs.py), fastest of {ROUNDS} rounds of {CALLS} calls, one torch thread\n")
    print("| what | µs a call |")
    print("| --- | --- |")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
