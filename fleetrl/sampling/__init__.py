"""Sampling layer: the sampler (serial, split, first-ready or lagged rollouts), the rollout buffer it fills,
advantage estimation, running normalisation and the acting policy (on-policy); and the replay buffer of the
off-policy algorithms (DQN, SAC, TD3: replay.py)."""
