"""Make runnable variants of CleanRL's PPO scripts (benchmarks/cleanrl/upstream/, verbatim): gymnasium 1.x's port, then
the one line that puts them on fleetrl's envs.

    python benchmarks/cleanrl/patch.py OUT_DIR

writes, for ppo.py, ppo_atari.py and ppo_continuous_action.py, three variants into OUT_DIR (with cleanrl_utils/):
* ``*_gym_sync.py``: CleanRL's script ported to gymnasium 1.x (CleanRL pins gymnasium 0.29.1): SyncVectorEnv in
  SAME_STEP mode, Atari wrapper names of 1.x, and the episode logging reading 1.x's ``final_info`` (one dict of arrays
  with masks, where 0.29 gave a list of dicts). Nothing else changes.
* ``*_gym_async.py``: the same with gymnasium's AsyncVectorEnv (the baseline for envs that wait).
* ``*_make_vec.py``: the gymnasium 1.x port with the one line that builds ``envs`` changed to fleetrl's ``make_vec``
  (and its import). make_vec.diff beside this file shows that change.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = ("ppo", "ppo_atari", "ppo_continuous_action")

LOGGING_0_29 = '''            if "final_info" in infos:
                for info in infos["final_info"]:
'''
LOGGING_1_X = '''            if "final_info" in infos and "_episode" in infos["final_info"]:  # gymnasium 1.x: a dict of arrays with masks
                for i in infos["final_info"]["_episode"].nonzero()[0]:
                    info = {"episode": {k: infos["final_info"]["episode"][k][i] for k in ("r", "l")}}
'''
# (old, new) for every script: gymnasium 1.x's port
GYMNASIUM_1X = [
    ("    envs = gym.vector.SyncVectorEnv(\n        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],\n    )",
     "    envs = gym.vector.SyncVectorEnv(\n        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],\n"
     "        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"),
    ("    envs = gym.vector.SyncVectorEnv(\n        [make_env(args.env_id, i, args.capture_video, run_name, args.gamma) for i in range(args.num_envs)]\n    )",
     "    envs = gym.vector.SyncVectorEnv(\n        [make_env(args.env_id, i, args.capture_video, run_name, args.gamma) for i in range(args.num_envs)],\n"
     "        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"),
    (LOGGING_0_29, LOGGING_1_X),
    ("gym.wrappers.GrayScaleObservation(env)", "gym.wrappers.GrayscaleObservation(env)"),
    ("gym.wrappers.FrameStack(env, 4)", "gym.wrappers.FrameStackObservation(env, 4)"),
    # 1.x takes the clipped observation's space (unchanged here) as a third argument
    ("gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
     "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)"),
]
ATARI_REGISTER = ("from cleanrl_utils.atari_wrappers import (  # isort:skip",
                  "import ale_py  # gymnasium 1.x: ale-py registers its ids only when asked\n\ngym.register_envs(ale_py)\n"
                  "from cleanrl_utils.atari_wrappers import (  # isort:skip")

# The one line (and its import): the same env functions for ppo.py and ppo_continuous_action.py; for ppo_atari.py the
# env id, so fleetrl builds its own Atari chain (the same preprocessing as CleanRL's wrappers) on its C++ ale backend.
# Each keeps the port's SAME_STEP (make_vec's default is gymnasium's, NEXT_STEP): CleanRL's loop reads final_info.
MAKE_VEC_IMPORT = ("import gymnasium as gym\n", "import gymnasium as gym\nfrom fleetrl.envs import make_vec\n")
MAKE_VEC_LINE = {
    "ppo": ("    envs = gym.vector.SyncVectorEnv(\n", "    envs = make_vec(\n"),
    "ppo_continuous_action": ("    envs = gym.vector.SyncVectorEnv(\n", "    envs = make_vec(\n"),
    "ppo_atari": ("    envs = gym.vector.SyncVectorEnv(\n        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],\n"
                  "        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )",
                  "    envs = make_vec(args.env_id, args.num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)"),
}


def replace(text: str, old: str, new: str, name: str, required: bool = True) -> str:
    if old not in text:
        if required:
            raise SystemExit(f"{name}: the text to patch was not found (has CleanRL's file changed?):\n{old}")
        return text
    return text.replace(old, new)


def variants(name: str) -> dict[str, str]:
    """The three variants of CleanRL's ``name``.py."""
    text = (HERE / "upstream" / f"{name}.py").read_text()
    for old, new in GYMNASIUM_1X:
        text = replace(text, old, new, name, required=old in (LOGGING_0_29,))
    if name == "ppo_atari":
        text = replace(text, *ATARI_REGISTER, name)
    gym_async = replace(text, "gym.vector.SyncVectorEnv(", "gym.vector.AsyncVectorEnv(", name)
    make_vec = replace(replace(text, *MAKE_VEC_LINE[name], name), *MAKE_VEC_IMPORT, name)
    return {"gym_sync": text, "gym_async": gym_async, "make_vec": make_vec}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE / "upstream" / "cleanrl_utils", out / "cleanrl_utils", dirs_exist_ok=True)
    for name in SCRIPTS:
        for variant, text in variants(name).items():
            (out / f"{name}_{variant}.py").write_text(f"# The {variant} variant written by benchmarks/cleanrl/patch.py.\n{text}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
