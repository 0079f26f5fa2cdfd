"""Sampling layer: the rollout buffer the sampler fills, advantage estimation, running normalisation."""
