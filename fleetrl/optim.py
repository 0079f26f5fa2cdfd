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


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides of a dense tensor laid out as ``t`` is (its own where ``t`` is dense: channels-last stays so)."""
    return torch.empty_like(t, device="meta").stride()


class RAdam(_Unguarded, torch.optim.RAdam):
    """`torch.optim.RAdam` (its single-tensor arithmetic, bit for bit, and its state_dict), stepping all parameters as
    one flat tensor: PQN's update is CleanRL's, and torch's RAdam spends most of it on per-tensor calls.

    torch's step runs about 12 elementwise operations for each parameter tensor in turn, each a Python-to-kernel call of
    a few microseconds: for PQN's 120-84 LayerNorm MLP (7 tensors, 11k numbers) the step cost more than the forward
    pass and backward together. An elementwise operation gives each element the same result whichever tensor it sits
    in, so this optimizer keeps the gradients, RAdam's two moments and the update in one flat buffer each, runs torch's
    expressions once over them, in torch's order and with torch's Python scalars, and adds the update to the parameters
    in one ``_foreach_add_``.

    The parameters are never moved or rebound, only updated in place: whatever holds them or a view of them, however
    early it was built (the acting engine's captured views, a module copy sharing them, a compiled function), acts
    with every step, and they keep their memory format (fleetrl/accel.py's channels-last). Each parameter's slice of
    the flat buffers is laid out as the parameter is, so its ``.grad`` (a view of the flat gradient, into which
    backward accumulates; ``zero_grad`` zeroes it in place) has its strides too. A gradient replaced behind the
    optimizer's back (a module's own ``zero_grad()`` sets ``.grad`` to None, ``module.to(memory_format=...)`` rebinds
    it) becomes a view again at the next ``zero_grad`` or ``step``, which reads its values. A gradient sync (fleetrl/distributed.py) and
    ``clip_grad_norm_`` write ``.grad`` in place. Only what PQN uses: one parameter group of dense float tensors on one
    device, no weight decay, no ``maximize``/``capturable``/``differentiable``; anything else is refused."""

    _base = torch.optim.RAdam

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr=lr, betas=betas, eps=eps, foreach=False)
        if len(self.param_groups) != 1:
            raise ValueError("fleetrl.optim.RAdam steps one parameter group")
        self._params: list[torch.nn.Parameter] = self.param_groups[0]["params"]
        if (len({(p.dtype, p.device) for p in self._params}) != 1
                or any(p.is_sparse or p.is_complex() for p in self._params)):
            raise ValueError("fleetrl.optim.RAdam needs dense real parameters of one dtype on one device")
        # each parameter's place in the flat buffers: its offset, shape and strides (the parameter's own layout), so
        # a slice and its parameter line up element for element in memory
        self._layouts: list[tuple[int, torch.Size, tuple[int, ...]]] = []
        offset = 0
        for p in self._params:
            self._layouts.append((offset, p.shape, _dense_strides(p)))
            offset += p.numel()
        first = self._params[0]
        self._flat_grad, self._exp_avg, self._exp_avg_sq, self._update = (
            torch.zeros(offset, dtype=first.dtype, device=first.device) for _ in range(4))
        self._updates = self._views(self._update)
        self._grads: list[torch.Tensor] = self._views(self._flat_grad)
        self._grad_ptrs = [g.data_ptr() for g in self._grads]
        for p, g in zip(self._params, self._grads):
            if p.grad is not None:
                g.copy_(p.grad)
            p.grad = g  # backward accumulates into it (grad mode is off in backward)
        self._point_state()

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's slice of ``flat``, shaped and laid out as the parameter."""
        return [flat.as_strided(shape, strides, offset) for offset, shape, strides in self._layouts]

    def _point_state(self, loaded: dict | None = None) -> None:
        """Each parameter's state as torch's RAdam keeps it ("step", "exp_avg", "exp_avg_sq"), its moments views of
        the flat moments; ``loaded``: values to copy in (a state_dict's), else zeros at step 0."""
        moments = {"exp_avg": self._views(self._exp_avg), "exp_avg_sq": self._views(self._exp_avg_sq)}
        for i, p in enumerate(self._params):
            state = self.state[p]
            old = loaded.get(p, {}) if loaded is not None else {}
            for name, views in moments.items():
                view = views[i]
                if name in old:
                    view.copy_(old[name])
                else:
                    view.zero_()
                state[name] = view
            step = old.get("step")
            state["step"] = (torch.tensor(0.0, dtype=torch.float32) if step is None
                             else torch.as_tensor(step, dtype=torch.float32).detach().clone())

    def _reattach_grads(self, keep: bool) -> None:
        """Make each ``.grad`` that is no longer its view of the flat gradient (a module's own ``zero_grad()`` set it
        to None, ``module.to(...)`` rebound it) that view again, with its values copied in if ``keep`` (None: zeros).
        A parameter whose memory format changed meanwhile (``Accel.apply`` after the optimizer) has its slices of the
        flat buffers laid out anew, its moments moved with them, so gradient and parameter keep matching strides."""
        for i, (p, g, ptr) in enumerate(zip(self._params, self._grads, self._grad_ptrs)):
            grad = p.grad
            if grad is g and g.data_ptr() == ptr:
                continue
            offset, shape, strides = self._layouts[i]
            if _dense_strides(p) != strides:
                strides = _dense_strides(p)
                self._layouts[i] = offset, shape, strides
                self._updates[i] = self._update.as_strided(shape, strides, offset)
                state = self.state[p]
                for name, flat in (("exp_avg", self._exp_avg), ("exp_avg_sq", self._exp_avg_sq)):
                    moment = state[name].clone()  # the old layout's values, before the slice is rewritten
                    state[name] = flat.as_strided(shape, strides, offset)
                    state[name].copy_(moment)
            view = self._flat_grad.as_strided(shape, strides, offset)
            if keep and grad is not None:
                view.copy_(grad)
            elif keep:
                view.zero_()  # no gradient since .grad was dropped: zero (the flat step moves every parameter)
            self._grads[i] = p.grad = view

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._reattach_grads(keep=False)
        self._flat_grad.zero_()  # the views stay: set_to_none would detach .grad from the flat buffer

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # checks the groups and maps the saved state onto the parameters
        self._point_state({p: dict(self.state[p]) for p in self._params})

    def step(self, closure=None):
        with torch.no_grad():
            loss = None if closure is None else closure()
            self._reattach_grads(keep=True)
            self._step()
            return loss

    def _step(self) -> None:
        # torch/optim/radam.py `_single_tensor_radam`, its expressions verbatim, once over the flat tensors; the last
        # product is written into the flat update, which is then added to each parameter in place
        group = self.param_groups[0]
        if group["weight_decay"] or group["maximize"] or group["capturable"] or group["differentiable"]:
            raise ValueError("fleetrl.optim.RAdam has no weight decay, maximize, capturable or differentiable")
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        steps = [self.state[p]["step"] for p in self._params]
        torch._foreach_add_(steps, 1)
        step = steps[0].item()
        grad, exp_avg, exp_avg_sq = self._flat_grad, self._exp_avg, self._exp_avg_sq

        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            exp_avg_sq_sqrt = exp_avg_sq.sqrt().add_(eps)
            adaptive_lr = (bias_correction2**0.5) / exp_avg_sq_sqrt
            torch.mul(bias_corrected_exp_avg * lr * adaptive_lr, rect, out=self._update)
        else:
            torch.mul(bias_corrected_exp_avg, lr, out=self._update)
        torch._foreach_add_(self._params, self._updates, alpha=-1.0)  # torch's param.add_(update, alpha=-1.0), each
