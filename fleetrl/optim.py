"""torch's Adam, without importing torch._dynamo: the same arithmetic, 1.4 s less CPU at every start of a run.

torch guards an optimizer against the compiler: `add_param_group` (called by the constructor), `zero_grad`,
`state_dict` and `load_state_dict` are wrapped in `torch._disable_dynamo`, and `step` in a wrapper that breaks the graph
around it. Each wrapper imports `torch._dynamo` on its first call, which imports sympy and the symbolic-shapes
machinery: `python -c "import torch"` takes 1.7 s of CPU here, with `torch._dynamo` 3.0 s, so every `fleetrl train`
(each tune trial, benchmark seed, torchrun rank, test run) paid 1.4 s before its first step for a compiler that an
eager run never calls. In eager mode the wrappers only disable what is not running and set `no_grad` around `step`;
this Adam calls torch's own methods under them (`inspect.unwrap`) and keeps the `no_grad`. A run with `--compile`
imports dynamo anyway and compiles the networks, never the optimizer, so it is unaffected.
"""

from __future__ import annotations

import inspect

import torch


def _unguarded(method):
    return inspect.unwrap(method)


class _Unguarded:
    """The optimizer methods torch wraps, called without their wrappers; ``_base`` is the torch optimizer."""

    _base: type[torch.optim.Optimizer]

    def add_param_group(self, param_group: dict) -> None:
        _unguarded(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _unguarded(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict:
        return _unguarded(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict) -> None:
        _unguarded(torch.optim.Optimizer.load_state_dict)(self, state_dict)

    def step(self, closure=None):
        with torch.no_grad():  # the step wrapper's one effect in eager mode (differentiable=False)
            return _unguarded(self._base.step)(self, closure)


class Adam(_Unguarded, torch.optim.Adam):
    """`torch.optim.Adam`, bit for bit (the same fused kernel and state_dict), importing no compiler."""

    _base = torch.optim.Adam


class SGD(_Unguarded, torch.optim.SGD):
    """`torch.optim.SGD`, importing no compiler (fleetrl/accel.py's timed training step)."""

    _base = torch.optim.SGD
