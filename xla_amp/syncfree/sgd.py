"""Sync-free SGD: ``torch.optim.SGD``'s numerics, skip decided on the device.

Algorithm (per parameter p with gradient g; every ``<-`` is a commit that
does nothing when found_inf != 0)::

    g = -g if maximize
    g = g + weight_decay * p                       if weight_decay != 0
    if momentum != 0:
        buf  = ready ? momentum * buf + (1 - dampening) * g : g
        ready <- 1
        d    = g + momentum * buf if nesterov else buf
    else:
        d    = g
    p <- p - lr * d

``torch.optim.SGD`` creates the momentum buffer on the first step as a plain
copy of the gradient (no dampening). Python cannot know whether that first
step was skipped, so the buffer exists from the first call, zero-filled, and
a 0-dim device flag ``ready`` tells whether it holds a value yet. The flag
never leaves the device while training; ``state_dict()`` drops buffers that
are not ready, matching ``torch.optim.SGD``'s absent buffer.

Fused path (the default for float32 parameters): PyTorch/XLA's
``sgd_optimizer_step`` op does it all for one parameter in one IR node,
with ``ready`` as its step count (> 0: ready; it counts the committed
steps). Portable path (bf16 parameters, tensor hyperparameters,
``fused=False``): multi-tensor ``torch._foreach_*`` ops and one
``torch.where`` per written tensor (``syncfree/_base.py``).
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp.syncfree import _fresh, _fused, _low_precision
from xla_amp.syncfree._base import SyncFreeOptimizer

_READY = "momentum_buffer_ready"  # internal key, never in a state dict


class SGD(SyncFreeOptimizer):
    """Stochastic gradient descent with ``torch.optim.SGD``'s arguments.

    ``fused``: ``None`` (default) uses PyTorch/XLA's fused per-parameter op
    where it applies (float32 parameters of groups whose hyperparameters
    are numbers), ``True`` insists on it (``ValueError`` naming the group
    otherwise), ``False`` takes the portable multi-tensor path. ``foreach`` is accepted
    and ignored; ``differentiable`` must be left off.
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0,
                 weight_decay=0.0, nesterov=False, *, maximize=False,
                 foreach=None, differentiable=False, fused=None, master_weights=False,
                 stochastic_rounding=False, state_dtype=None):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("SGD: a tensor lr must have one element")
        if lr < 0.0:
            raise ValueError(f"SGD: invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"SGD: invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"SGD: invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise ValueError("SGD: differentiable=True is not supported by the sync-free SGD")
        if fused and foreach:
            raise RuntimeError("SGD: `fused` and `foreach` cannot be `True` together.")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, foreach=foreach,
                        differentiable=False, fused=fused,
                        **_low_precision.options("SGD", master_weights, stochastic_rounding,
                                                 state_dtype))
        super().__init__(params, defaults)

    _GROUP_DEFAULTS = {**SyncFreeOptimizer._GROUP_DEFAULTS, "nesterov": False}

    _FUSED_KIND = "sgd"
    _FUSED_KEYS = ("lr", "momentum", "dampening", "weight_decay")
    _STATE_LIKE_PARAM = ("momentum_buffer",)

    def _update_group(self, gi: int, group: dict[str, Any], skip, params, grads,
                      fused: bool) -> None:
        dev = params[0].device
        momentum = group["momentum"]
        if momentum != 0:
            for p in params:
                if self._init_state(group, p, self.state[p]):
                    self._lineage[p] = 0  # fresh: not ready
        if not fused:
            self._update_portable(gi, group, skip.keep, params, grads)
            return
        if momentum != 0:
            states = [self.state[p] for p in params]
            steps = [st[_READY] for st in states]
            bufs = [st["momentum_buffer"] for st in states]
        else:  # no state: the op still writes a buffer and a count, throwaways
            steps = [torch.zeros((), dtype=torch.float32, device=dev)] * len(params)
            bufs = [torch.zeros_like(p) for p in params]
        _fused.sgd_(skip.flag, steps, params, grads, bufs, momentum=momentum,
                    dampening=group["dampening"], lr=group["lr"],
                    weight_decay=group["weight_decay"], nesterov=group["nesterov"],
                    maximize=group["maximize"])

    def _init_state(self, group, p, state) -> bool:
        if group["momentum"] == 0 or "momentum_buffer" in state:
            return False
        state["momentum_buffer"] = _fresh.zeros_like(p)
        state[_READY] = _fresh.full((), 0, torch.float32, p)
        return True

    def _update_portable(self, gi, group, keep, params, grads) -> None:
        dev = params[0].device
        momentum = group["momentum"]
        wd = group["weight_decay"]
        like = self._like
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        if wd != 0:
            wd_t = self._scalar((gi, "weight_decay"), wd, dev)
            grads = torch._foreach_addcmul(grads, params, like(wd_t, params))  # g + p * wd
        if momentum != 0:
            m_t = self._scalar((gi, "momentum"), momentum, dev)
            damp_t = self._scalar((gi, "1-dampening"), 1.0 - group["dampening"], dev)
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            flags = [self.state[p][_READY] for p in params]
            ready, per_param, commit_flags = self._counters(params, flags)
            # A buffer that is not ready holds zeros (it is only ever written
            # by a committed step, which makes it ready), so
            #   buf * momentum + g * (ready ? 1 - dampening : 1)
            # is torch.optim's first-step copy of g as well as its update.
            # (Out-of-place ops only: PyTorch/XLA checks in-place foreach ops
            # through Python meta functions, several times the op's cost.)
            g_coef = per_param(torch.where(ready > 0, damp_t, 1.0))
            new_bufs = torch._foreach_addcmul(torch._foreach_mul(bufs, like(m_t, bufs)),
                                              grads, g_coef)
            commit_flags(torch.ones_like(ready), keep)
            self._commit(bufs, new_bufs, keep)
            if group["nesterov"]:
                grads = torch._foreach_addcmul(grads, new_bufs, like(m_t, grads))
            else:
                grads = new_bufs
        neg_lr = -self._scalar((gi, "lr"), group["lr"], dev)
        self._commit(params, torch._foreach_addcmul(params, grads, like(neg_lr, params)), keep)

    # torch.optim.SGD state: {"momentum_buffer": tensor}, present once used.
    def _host_keys(self, state):
        return [state[_READY]] if _READY in state else []

    def _export_state(self, state, host):
        ready = state.pop(_READY, None)
        if ready is not None and not bool(host[id(ready)] > 0):
            state.pop("momentum_buffer", None)
        return state

    def _import_state(self, p, state):
        buf = state.get("momentum_buffer")
        if buf is None:
            state.pop("momentum_buffer", None)
            state.pop(_READY, None)
        elif _READY not in state:  # a loaded buffer is in use: ready
            state[_READY] = _fresh.full((), 1.0, torch.float32, p)
            self._lineage[p] = self._loaded_lineage("ready")


SGD.__doc__ += _low_precision.OPTIONS_DOC
