"""GradientSync with several optimisers and several backward passes before a step, on 2 real ranks.

test_every_algorithm.py's 2-rank job (dist_every_algorithm.py) runs :func:`worker` on each rank, which puts a tiny
SAC-like setup (twin critics Q(s, a) in one optimiser, an actor whose loss backpropagates through them) through
every call pattern and checks, after each ``finish``, that its gradients equal the gradient of the global
batch computed in this one process.
"""

from __future__ import annotations

import torch
from torch import nn

from fleetrl import distributed
from fleetrl.distributed import Dist


OBS, ACT, HIDDEN = 3, 2, 8
GLOBAL_BATCH = 16
SMALL_BUCKET_BYTES = 256  # several buckets, so that some start during backward and others only at finish


def q_net() -> nn.Module:
    return nn.Sequential(nn.Linear(OBS + ACT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


class Setup:
    """Twin critics, an actor, their optimisers and syncs, and a fixed global batch split over the ranks."""

    def __init__(self, dist_: Dist):
        torch.manual_seed(100 + dist_.rank)  # different on purpose: the broadcast aligns the replicas
        self.qf1, self.qf2 = q_net(), q_net()
        self.actor = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, ACT), nn.Tanh())
        for net in (self.qf1, self.qf2, self.actor):
            dist_.broadcast_parameters(net)
        self.critic_params = [*self.qf1.parameters(), *self.qf2.parameters()]
        self.actor_params = list(self.actor.parameters())
        self.q_optimizer = torch.optim.SGD(self.critic_params, lr=0.1)
        self.actor_optimizer = torch.optim.SGD(self.actor_params, lr=0.1)
        self.critic_sync = dist_.gradient_sync(self.critic_params)
        self.actor_sync = dist_.gradient_sync(self.actor_params)
        g = torch.Generator().manual_seed(0)  # the same global batch on every rank
        self.batch = (torch.randn(GLOBAL_BATCH, OBS, generator=g), torch.rand(GLOBAL_BATCH, ACT, generator=g) * 2 - 1,
                      torch.randn(GLOBAL_BATCH, 1, generator=g))
        share = GLOBAL_BATCH // dist_.world_size
        self.local = tuple(t[dist_.rank * share : (dist_.rank + 1) * share] for t in self.batch)

    def q(self, qf: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return qf(torch.cat([obs, actions], 1))

    def qf1_loss(self, local: bool = True) -> torch.Tensor:
        obs, actions, target = self.local if local else self.batch
        return ((self.q(self.qf1, obs, actions) - target) ** 2).mean()

    def qf2_loss(self, local: bool = True) -> torch.Tensor:
        obs, actions, target = self.local if local else self.batch
        return ((self.q(self.qf2, obs, actions) - target) ** 2).mean()

    def q_loss(self, local: bool = True) -> torch.Tensor:
        return self.qf1_loss(local) + self.qf2_loss(local)

    def actor_loss(self, local: bool = True) -> torch.Tensor:
        obs = (self.local if local else self.batch)[0]
        pi = self.actor(obs)
        return -torch.min(self.q(self.qf1, obs, pi), self.q(self.qf2, obs, pi)).mean()


def expect(case: str, params: list[nn.Parameter], global_loss: torch.Tensor) -> None:
    """The averaged ``.grad`` of ``params`` equals the global batch's gradient (autograd.grad leaves .grad and the hooks alone)."""
    reference = torch.autograd.grad(global_loss, params)
    for i, (p, ref) in enumerate(zip(params, reference)):
        assert p.grad is not None, f"{case}: parameter {i} has no gradient"
        torch.testing.assert_close(p.grad, ref, atol=1e-10, rtol=1e-10, msg=lambda m: f"{case}: parameter {i}: {m}")
    assert max(r.abs().max() for r in reference) > 1e-3, f"{case}: a meaningful gradient, not zeros"


def worker() -> None:
    torch.set_default_dtype(torch.float64)
    distributed.BUCKET_BYTES = SMALL_BUCKET_BYTES
    dist_ = distributed.init_distributed(cuda=False)
    s = Setup(dist_)
    assert len(s.critic_sync.buckets) > 2 and len(s.actor_sync.buckets) > 1

    for it in range(3):  # SAC's update, repeated: state left by one update must not leak into the next
        s.q_optimizer.zero_grad()
        s.critic_sync.backward(s.q_loss())
        assert len(s.critic_sync._pending) == len(s.critic_sync.buckets), "every bucket's all-reduce started during backward"
        s.critic_sync.finish()
        expect(f"SAC update {it}: critic", s.critic_params, s.q_loss(local=False))
        s.q_optimizer.step()
        s.actor_optimizer.zero_grad()
        s.actor_sync.backward(s.actor_loss())  # through the critics: fills their .grad, must not touch critic_sync
        assert not s.critic_sync._pending and not s.critic_sync._stale, "the actor's backward started no critic all-reduce"
        s.actor_sync.finish()
        expect(f"SAC update {it}: actor", s.actor_params, s.actor_loss(local=False))
        s.actor_optimizer.step()

    s.q_optimizer.zero_grad()
    s.critic_sync.backward(s.qf1_loss())  # the buckets of qf2 are still incomplete here
    s.critic_sync.backward(s.qf2_loss())
    s.critic_sync.finish()
    expect("two backward passes over disjoint parameters", s.critic_params, s.q_loss(local=False))

    s.q_optimizer.zero_grad()
    s.critic_sync.backward(s.q_loss())
    s.critic_sync.backward(2 * s.q_loss())  # every bucket already started: reduced again at finish
    s.critic_sync.finish()
    expect("two backward passes accumulated before one step", s.critic_params, 3 * s.q_loss(local=False))

    s.q_optimizer.zero_grad()
    s.actor_optimizer.zero_grad()
    s.critic_sync.backward(s.q_loss())
    s.actor_sync.backward(s.actor_loss())  # adds to the critics' .grad after their all-reduces started
    s.actor_sync.finish()
    s.critic_sync.finish()
    expect("the actor's backward between the critic's backward and finish: actor", s.actor_params, s.actor_loss(local=False))
    expect("the actor's backward between the critic's backward and finish: critic", s.critic_params,
           s.q_loss(local=False) + s.actor_loss(local=False))

    s.q_optimizer.zero_grad()
    s.critic_sync.backward(s.q_loss())
    s.q_loss().backward()  # plain backward after an armed one
    s.critic_sync.finish()
    expect("an armed and a plain backward", s.critic_params, 2 * s.q_loss(local=False))

    s.q_optimizer.zero_grad()
    loss = s.q_loss()
    loss.backward()  # PPO's pattern before sync.backward: nothing overlaps, finish averages everything
    averaged = s.critic_sync.finish(torch.stack([loss.detach(), 2 * loss.detach()]))
    expect("a plain backward, then finish", s.critic_params, s.q_loss(local=False))
    torch.testing.assert_close(averaged, torch.stack([s.q_loss(local=False)] * 2) * torch.tensor([1.0, 2.0]))
    assert s.critic_sync.finish() is None, "finish without extra scalars returns None"

    print(f"rank {dist_.rank}: every gradient equals the global batch's", flush=True)
    dist_.close()


def test_at_world_size_one_gradient_sync_is_plain_backward_and_registers_no_hooks():
    net = nn.Linear(3, 1)
    sync = Dist().gradient_sync(net.parameters())
    sync.backward(net(torch.ones(2, 3)).sum())
    extra = torch.tensor([1.5])
    assert sync.finish(extra) is extra and sync.finish() is None
    assert torch.equal(net.weight.grad, torch.full((1, 3), 2.0))
    assert not net.weight._post_accumulate_grad_hooks


if __name__ == "__main__":
    worker()
