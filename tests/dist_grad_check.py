"""Run under torchrun (or alone): one PPO update on a fixed global batch in float64; each rank saves
its averaged gradient and its parameters after the optimizer step to OUT/rank{R}.pt."""

import sys

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from fleetrl import config
from fleetrl.algos.ppo import FAMILY_DEFAULTS, Agent, Args, ppo_loss
from fleetrl.distributed import init_distributed

GLOBAL_BATCH = 64


def main(out_dir: str) -> None:
    torch.set_default_dtype(torch.float64)
    dist = init_distributed(cuda=False)
    torch.manual_seed(1234 + dist.rank)  # different on purpose: the broadcast must align the replicas
    agent = Agent((4,), gym.spaces.Discrete(2))
    dist.broadcast_parameters(agent)
    args = config.apply_family_defaults(Args(num_minibatches=1, update_epochs=1), FAMILY_DEFAULTS, "classic")

    rng = np.random.default_rng(0)  # the same global batch on every rank
    obs = torch.as_tensor(rng.normal(size=(GLOBAL_BATCH, 4)))
    actions = torch.as_tensor(rng.integers(0, 2, GLOBAL_BATCH))
    with torch.no_grad():
        logprobs, _, values = agent.evaluate({"obs": obs, "actions": actions})
    batch = {
        "obs": obs, "actions": actions,
        "logprobs": logprobs + torch.as_tensor(rng.normal(scale=0.3, size=GLOBAL_BATCH)),  # ratios away from 1: clipping is active
        "values": values + torch.as_tensor(rng.normal(scale=0.5, size=GLOBAL_BATCH)),
        "advantages": torch.as_tensor(rng.normal(loc=0.3, size=GLOBAL_BATCH)),
        "returns": torch.as_tensor(rng.normal(size=GLOBAL_BATCH)),
    }
    share = GLOBAL_BATCH // dist.world_size
    mb = {k: v[dist.rank * share : (dist.rank + 1) * share] for k, v in batch.items()}

    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    grad_sync = dist.gradient_sync(agent.parameters())
    loss, stats = ppo_loss(agent, mb, args, dist)
    optimizer.zero_grad()
    loss.backward()
    grad_sync.finish(torch.stack([loss.detach(), stats["approx_kl"]]))
    grads = torch.cat([p.grad.reshape(-1) for p in agent.parameters()]).clone()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    params = torch.cat([p.detach().reshape(-1) for p in agent.parameters()])
    torch.save({"grads": grads, "params": params}, f"{out_dir}/rank{dist.rank}.pt")
    dist.close()


if __name__ == "__main__":
    main(sys.argv[1])
