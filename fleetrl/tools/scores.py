"""How an env's returns become scores for the statistics: as they are, min-max scaled to bounds the user gives
(``ENV=LO,HI``, parsed here for `fleetrl tune --target-scores` too), or human-normalised with the published Atari scores."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetrl import config
from fleetrl.errors import FleetError

# Random-agent and human scores of the 57 Atari games, by ALE ROM id: 30 no-op starts, episodes capped at 108,000
# frames. Human scores: Mnih et al. 2015 ("Human-level control through deep reinforcement learning", Nature 518,
# Extended Data Table 2), with the games added later from Wang et al. 2016 ("Dueling Network Architectures"); the
# values are those of DeepMind's DQN Zoo (dqn_zoo/atari_data.py), which rliable's Atari data normalises with too.
# A human-normalised score is (return - random) / (human - random): 0 plays like a random agent, 1 like the human.
ATARI_RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    "alien": (227.8, 7127.7), "amidar": (5.8, 1719.5), "assault": (222.4, 742.0), "asterix": (210.0, 8503.3),
    "asteroids": (719.1, 47388.7), "atlantis": (12850.0, 29028.1), "bank_heist": (14.2, 753.1),
    "battle_zone": (2360.0, 37187.5), "beam_rider": (363.9, 16926.5), "berzerk": (123.7, 2630.4),
    "bowling": (23.1, 160.7), "boxing": (0.1, 12.1), "breakout": (1.7, 30.5), "centipede": (2090.9, 12017.0),
    "chopper_command": (811.0, 7387.8), "crazy_climber": (10780.5, 35829.4), "defender": (2874.5, 18688.9),
    "demon_attack": (152.1, 1971.0), "double_dunk": (-18.6, -16.4), "enduro": (0.0, 860.5),
    "fishing_derby": (-91.7, -38.7), "freeway": (0.0, 29.6), "frostbite": (65.2, 4334.7), "gopher": (257.6, 2412.5),
    "gravitar": (173.0, 3351.4), "hero": (1027.0, 30826.4), "ice_hockey": (-11.2, 0.9), "jamesbond": (29.0, 302.8),
    "kangaroo": (52.0, 3035.0), "krull": (1598.0, 2665.5), "kung_fu_master": (258.5, 22736.3),
    "montezuma_revenge": (0.0, 4753.3), "ms_pacman": (307.3, 6951.6), "name_this_game": (2292.3, 8049.0),
    "phoenix": (761.4, 7242.6), "pitfall": (-229.4, 6463.7), "pong": (-20.7, 14.6), "private_eye": (24.9, 69571.3),
    "qbert": (163.9, 13455.0), "riverraid": (1338.5, 17118.0), "road_runner": (11.5, 7845.0), "robotank": (2.2, 11.9),
    "seaquest": (68.4, 42054.7), "skiing": (-17098.1, -4336.9), "solaris": (1236.3, 12326.7),
    "space_invaders": (148.0, 1668.7), "star_gunner": (664.0, 10250.0), "surround": (-10.0, 6.5),
    "tennis": (-23.8, -8.3), "time_pilot": (3568.0, 5229.2), "tutankham": (11.4, 167.6), "up_n_down": (533.4, 11693.2),
    "venture": (0.0, 1187.5), "video_pinball": (16256.9, 17667.9), "wizard_of_wor": (563.5, 4756.5),
    "yars_revenge": (3092.9, 54576.9), "zaxxon": (32.5, 9173.3),
}  # fmt: skip

NORMALIZE_MODES = ("auto", "human", "minmax", "none")


@dataclass(frozen=True)
class Scale:
    """One env's score: (return - low) / (high - low); the identity for raw returns."""

    kind: str = "return"  # "return", "human-normalised" or "min-max"
    low: float = 0.0
    high: float = 1.0

    @property
    def normalised(self) -> bool:
        return self.kind != "return"

    def apply(self, returns) -> np.ndarray:
        return (np.asarray(returns, dtype=np.float64) - self.low) / (self.high - self.low)

    def describe(self) -> str:
        if self.kind == "human-normalised":
            return f"human-normalised (random {self.low:g}, human {self.high:g})"
        return f"min-max ({self.low:g}, {self.high:g})" if self.kind == "min-max" else "return"


def atari_random_human(env_id: str) -> tuple[float, float] | None:
    """The published (random, human) scores of an Atari env id, or None: not Atari, or a game outside the 57.
    Takes run folder names too, whose ``ALE/`` became ``ALE-``."""
    from fleetrl.envs.atari import is_atari_id
    from fleetrl.envs.native import atari_game_name

    if env_id.startswith("ALE-"):
        env_id = "ALE/" + env_id[len("ALE-") :]
    if not is_atari_id(env_id):
        return None
    return ATARI_RANDOM_HUMAN.get(atari_game_name(env_id))


def parse_env_bounds(items: list[str], env_ids: list[str], flag: str, env_source: str) -> dict[str, tuple[float, float]]:
    """``ENV=LO,HI`` items, keyed by the env of ``env_ids`` each names; an env may be named by its run folder's name
    (``ALE-Pong-v5`` for ``ALE/Pong-v5``) too. ``env_source`` says in an error where the known envs came from."""
    by_name: dict[str, str] = {}
    for env_id in env_ids:
        by_name.setdefault(env_id, env_id)
        by_name.setdefault(config.path_safe(env_id), env_id)
    bounds = {}
    for item in items:
        env_id, sep, pair = item.rpartition("=")
        parts = pair.split(",")
        try:
            lo, hi = (float(p) for p in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            lo = hi = None
        if not sep or lo is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
            raise FleetError(f"{flag} takes ENV=LO,HI with two different finite numbers, e.g. CartPole-v1=0,500 Acrobot-v1=-500,0; got {item!r}.")
        known = by_name.get(env_id) or by_name.get(config.path_safe(env_id))
        if known is None:
            raise FleetError(f"{flag} names {env_id!r}, which is not one of {env_source} {' '.join(env_ids)}.")
        bounds[known] = (lo, hi)
    return bounds


def env_scales(normalize: str, bound_items: list[str], env_ids: list[str], env_source: str) -> dict[str, Scale]:
    """Each env's :class:`Scale` under ``--normalize`` and ``--score-bounds``; contradictions and gaps are refused here,
    before anything runs.

    auto: the bounds where given, else human-normalised where the game has published scores, else the return;
    human: every env human-normalised; minmax: every env needs bounds; none: returns as they are.
    """
    if normalize not in NORMALIZE_MODES:
        raise FleetError(f"--normalize takes one of {', '.join(NORMALIZE_MODES)}; got {normalize!r}.")
    bounds = parse_env_bounds(bound_items, env_ids, "--score-bounds", env_source)
    if bounds and normalize in ("human", "none"):
        raise FleetError(f"--score-bounds and --normalize {normalize} contradict each other: {normalize} ignores bounds. "
                         "Drop --score-bounds, or use --normalize minmax (or auto, which uses the bounds where given).")
    scales, missing = {}, []
    for env_id in env_ids:
        atari = atari_random_human(env_id) if normalize in ("auto", "human") and env_id not in bounds else None
        if env_id in bounds:
            scales[env_id] = Scale("min-max", *bounds[env_id])
        elif atari is not None:
            scales[env_id] = Scale("human-normalised", *atari)
        elif normalize in ("human", "minmax"):
            missing.append(env_id)
        else:
            scales[env_id] = Scale()
    if missing and normalize == "human":
        raise FleetError(f"--normalize human needs published human and random scores, which only the 57 Atari games have; "
                         f"none for: {' '.join(missing)}. Give those envs --score-bounds ENV=LO,HI with --normalize auto.")
    if missing:
        raise FleetError(f"--normalize minmax needs --score-bounds ENV=LO,HI for every env; missing: {' '.join(missing)}. "
                         f"Example: --score-bounds {missing[0]}=0,500 (LO: e.g. a random policy's return, HI: the best one).")
    return scales
