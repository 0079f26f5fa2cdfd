"""Memory tasks for ``fleetrl train ppo_trxl``: CleanRL's Proof-of-Memory env (``ProofofMemory-v0``, registered on
import) and MiniGrid's memory ids (``MiniGrid-MemoryS9-v0``, ...) wrapped as CleanRL's ppo_trxl.py wraps them.

memory-gym (MortarMayhem, MysteryPath) is not among them: it runs under gymnasium 1.x unchanged, but its 1.0.2 pins
gymnasium 0.29 and pygame 2.4, so no extra can install it beside fleetrl (pip either downgrades gymnasium or picks
memory-gym 0.3 on gym 0.26); docs/algorithms.md says more.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fleetrl.errors import require

# CleanRL's make_env for MiniGrid: a 3x3 view drawn at 28 px a tile (84x84 RGB), episodes cut at 96 steps
MINIGRID_VIEW_SIZE = 3
MINIGRID_TILE_SIZE = 28
MINIGRID_TIME_LIMIT = 96  # ppo_trxl.py sizes its episode memory by the same limit


class PoMEnv(gym.Env):
    """CleanRL's Proof of Memory env (cleanrl/ppo_trxl/pom_env.py), ported.

    A one-dimensional grid whose two ends hold goals, one rewarding and one punishing. The agent sees which is which
    during its first two steps (frozen in place), then only its position: it must remember. The observation is
    ``[left goal, position, right goal]``; the goals read 0 once hidden.

    The one deliberate difference: the start position and the goals are drawn from the env's own ``self.np_random``
    (seeded by ``reset(seed=...)``), not numpy's global RNG as CleanRL's does, so that envs in worker processes are
    seeded like any gymnasium env. The lockstep test (tests/test_ppo_trxl.py) therefore never asks both envs for their
    draws: it replays CleanRL's update on fleetrl's recorded rollouts, and checks the dynamics separately by stepping
    CleanRL's env from the same start position and goals.
    """

    metadata = {"render_modes": ["human", "rgb_array", "debug_rgb_array"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None):
        self._freeze = True
        self._step_size = 0.2
        self._min_steps = int(1.0 / self._step_size) + 1
        self._time_penalty = 0.1
        self._num_show_steps = 2
        self.render_mode = render_mode

        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(low=-1.0, high=1.0, shape=(3,), dtype=np.float32)

        # the possible start positions (CleanRL's, with its glob=False)
        num_steps = int(0.4 / self._step_size)
        lower = min(-2.0 * self._step_size, -num_steps * self._step_size)
        upper = max(3.0 * self._step_size, self._step_size, (num_steps + 1) * self._step_size)
        positions = np.arange(lower, upper, self._step_size).clip(-1 + self._step_size, 1 - self._step_size)
        self.possible_positions = [round(x, 2) for x in positions]  # fix floating point errors

        self.window = None
        self.clock = None
        self.width, self.height = 400, 80
        self.cell_width = self.width / (2 * int(1 / self._step_size) + 1)

    def step(self, action):
        reward = 0.0
        done = False

        if self._num_show_steps > self._step_count:
            self._position += self._step_size * (1 - self._freeze) if action == 1 else -self._step_size * (1 - self._freeze)
            self._position = np.round(self._position, 2)
            obs = np.asarray([self._goals[0], self._position, self._goals[1]], dtype=np.float32)
            if self._freeze:
                self._step_count += 1
                return obs, reward, done, False, {}
        else:
            self._position += self._step_size if action == 1 else -self._step_size
            self._position = np.round(self._position, 2)
            obs = np.asarray([0.0, self._position, 0.0], dtype=np.float32)  # the goals hidden

        # reward and termination
        if self._position == -1.0 or self._position == 1.0:
            goal = self._goals[0] if self._position == -1.0 else self._goals[1]
            reward += (1.0 if goal == 1.0 else -1.0) * (1.0 + self._min_steps * self._time_penalty)
            done = True
        else:
            reward -= self._time_penalty
        self.rewards.append(reward)
        info = {"reward": sum(self.rewards), "length": len(self.rewards)} if done else {}
        self._step_count += 1
        return obs, reward, done, False, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.rewards = []
        self._position = self.np_random.choice(self.possible_positions)
        self._step_count = 0
        self._goals = np.asarray([-1.0, 1.0])[self.np_random.permutation(2)]
        return np.asarray([self._goals[0], self._position, self._goals[1]], dtype=np.float32), {}

    def render(self):
        if self.render_mode not in self.metadata["render_modes"]:
            return None
        import pygame  # drawing only: training never imports it

        if not pygame.get_init():
            pygame.init()
        if self.window is None and self.render_mode == "human":
            pygame.display.init()
            self.window = pygame.display.set_mode((self.width, self.height))
            pygame.display.set_caption("Proof of Memory Environment")
        if self.clock is None and self.render_mode == "human":
            self.clock = pygame.time.Clock()
        canvas = pygame.Surface((self.width, self.height))
        canvas.fill((255, 255, 255))
        for i in range(2 * int(1 / self._step_size) + 1):  # the grid
            pygame.draw.rect(canvas, (200, 200, 200), pygame.Rect(i * self.cell_width, 0, self.cell_width, self.height), 1)
        agent_x = int((self._position + 1) / self._step_size) * self.cell_width + self.cell_width / 2
        pygame.draw.circle(canvas, (0, 0, 255), (agent_x, self.height / 2), 15)
        shown = self._num_show_steps > self._step_count
        for goal, x in ((self._goals[0], 0), (self._goals[1], self.width - self.cell_width)):
            colour = ((0, 255, 0) if goal > 0 else (255, 0, 0)) if shown else (200, 200, 200)
            pygame.draw.rect(canvas, colour, pygame.Rect(x, 0, self.cell_width, self.height))
        if self.render_mode == "human":
            self.window.blit(canvas, (0, 0))
            pygame.display.flip()
            self.clock.tick(self.metadata["render_fps"])
            return None
        return np.transpose(np.array(pygame.surfarray.pixels3d(canvas)), axes=(1, 0, 2))

    def close(self):
        if self.window is not None:
            import pygame

            pygame.display.quit()
            pygame.quit()
            self.window = None
            self.clock = None


if "ProofofMemory-v0" not in gym.registry:
    gym.register("ProofofMemory-v0", entry_point=PoMEnv, max_episode_steps=16)


def is_minigrid_id(env_id: str) -> bool:
    return env_id.startswith("MiniGrid-")


def require_minigrid(env_id: str) -> None:
    """Import minigrid (which registers its ids), or say in one paragraph which extra provides it."""
    require("minigrid", "memory", f"The MiniGrid environment {env_id!r}")


def make_minigrid(env_id: str, render_mode: str | None = None) -> gym.Env:
    """A MiniGrid id as CleanRL's ppo_trxl.py makes it: an 84x84x3 uint8 image of the agent's 3x3 view, all 7 actions,
    96 steps at most."""
    require_minigrid(env_id)
    from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper

    env = gym.make(env_id, agent_view_size=MINIGRID_VIEW_SIZE, tile_size=MINIGRID_TILE_SIZE, render_mode=render_mode or "rgb_array")
    env = ImgObsWrapper(RGBImgPartialObsWrapper(env, tile_size=MINIGRID_TILE_SIZE))
    return gym.wrappers.TimeLimit(env, MINIGRID_TIME_LIMIT)
