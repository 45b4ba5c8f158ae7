"""Sync-free Adam: ``torch.optim.Adam``'s numerics, skip decided on the device.

Algorithm (per parameter p with gradient g; every ``<-`` is a commit that
does nothing when found_inf != 0; ``t`` is a float32 device tensor)::

    g  = -g if maximize
    if decoupled_weight_decay:  p' = p * (1 - lr * weight_decay)     (AdamW)
    else:                       p' = p;  g = g + weight_decay * p
    t  <- t + 1
    m  <- lerp(m, g, 1 - beta1)
    v  <- beta2 * v + (1 - beta2) * g * g
    vmax <- max(vmax, v)                     if amsgrad (v below means vmax)
    denom = sqrt(v) / sqrt(1 - beta2 ** t) + eps
    p  <- p' - lr / (1 - beta1 ** t) * m / denom

Fused path (the default for float32 parameters): PyTorch/XLA's
``adam_optimizer_step`` op does all of it for one parameter in one IR node
(see ``syncfree/_fused.py``). Portable path (bf16 parameters, tensor
hyperparameters, ``fused=False``): every line is one multi-tensor
``torch._foreach_*`` op over the parameters of a param group (the last two
as ``p' + (m * c1) / (sqrt(v) + c2)`` with per-parameter scalars
``c1 = -lr / (1 - beta1 ** t) * sqrt(1 - beta2 ** t)``,
``c2 = eps * sqrt(1 - beta2 ** t)``); the commits are one ``torch.where``
per tensor.

(``1 - beta ** t`` is computed as ``-expm1(t * log(beta))`` with the log
taken in double precision on the host, which keeps float32 close to
``torch.optim``'s double-precision bias corrections.)

The step count lives on the device (like ``torch.optim``'s ``capturable``
mode) so the bias corrections follow skipped steps without a sync; the
state dict stores it as a CPU float32 tensor, as ``torch.optim.Adam`` does.
A step skipped on the first call leaves zero moments and ``t = 0``, which
behaves exactly as the absent state of ``torch.optim``.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from xla_amp.syncfree import _fresh, _fused, _low_precision
from xla_amp.syncfree._base import SyncFreeOptimizer


def _check_adam_args(name, lr, betas, eps, weight_decay, differentiable, fused, foreach):
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError(f"{name}: a tensor lr must have one element")
    if not 0.0 <= lr:
        raise ValueError(f"{name}: invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"{name}: invalid epsilon value: {eps}")
    if len(betas) != 2:
        raise ValueError(f"{name}: betas must be a pair, got {betas!r}")
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name}: invalid beta parameter at index {i}: {b}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"{name}: invalid weight_decay value: {weight_decay}")
    if differentiable:
        raise ValueError(f"{name}: differentiable=True is not supported by the sync-free {name}")
    if fused and foreach:
        raise RuntimeError(f"{name}: `fused` and `foreach` cannot be `True` together.")


class Adam(SyncFreeOptimizer):
    """Adam with ``torch.optim.Adam``'s arguments.

    ``fused``: ``None`` (default) uses PyTorch/XLA's fused per-parameter op
    where it applies (float32 parameters of groups whose hyperparameters
    are numbers), ``True`` insists on it (``ValueError`` naming the group
    otherwise), ``False`` takes the portable multi-tensor path. ``foreach`` and
    ``capturable`` are accepted and ignored (the step count is always on the
    device); ``differentiable`` must be left off.
    ``decoupled_weight_decay=True`` gives AdamW.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, master_weights=False,
                 stochastic_rounding=False, state_dtype=None):
        _check_adam_args(type(self).__name__, lr, betas, eps, weight_decay,
                         differentiable, fused, foreach)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=False, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay,
                        **_low_precision.options(type(self).__name__, master_weights,
                                                 stochastic_rounding, state_dtype))
        super().__init__(params, defaults)

    _GROUP_DEFAULTS = {**SyncFreeOptimizer._GROUP_DEFAULTS, "amsgrad": False,
                       "capturable": False}

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("decoupled_weight_decay", self._decoupled_default)

    _decoupled_default = False

    _FUSED_KIND = "adam"
    _FUSED_KEYS = ("lr", "betas", "eps", "weight_decay")
    _STATE_LIKE_PARAM = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def _update_group(self, gi: int, group: dict[str, Any], skip, params, grads,
                      fused: bool) -> None:
        amsgrad = group["amsgrad"]
        states = []
        for p in params:
            state = self.state[p]
            if self._init_state(group, p, state):
                self._lineage[p] = 0  # fresh: step 0
            states.append(state)
        if not fused:
            self._update_portable(gi, group, skip.keep, params, grads, states)
            return
        beta1, beta2 = group["betas"]
        _fused.adam_(skip.flag, params, grads, states, beta1=beta1, beta2=beta2,
                     lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                     amsgrad=amsgrad, maximize=group["maximize"],
                     decoupled=group["decoupled_weight_decay"])

    def _init_state(self, group, p, state) -> bool:
        # (a master copy may be there already); max_exp_avg_sq also when
        # amsgrad is switched on for existing state
        fresh = "step" not in state
        if fresh:
            state["step"] = _fresh.full((), 0, torch.float32, p)
            state["exp_avg"] = _fresh.zeros_like(p)
            state["exp_avg_sq"] = _fresh.zeros_like(p)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = _fresh.zeros_like(p)
        return fresh

    def _update_portable(self, gi, group, keep, params, grads, states) -> None:
        dev = params[0].device
        beta1, beta2 = group["betas"]
        wd = group["weight_decay"]
        decoupled = group["decoupled_weight_decay"]
        amsgrad = group["amsgrad"]
        like = self._like
        lr = self._scalar((gi, "lr"), group["lr"], dev)
        one_m_b1 = self._one_minus((gi, "1-beta1"), beta1, dev)
        one_m_b2 = self._one_minus((gi, "1-beta2"), beta2, dev)
        eps = self._scalar((gi, "eps"), group["eps"], dev)
        # 1 - beta**t as -expm1(t * log(beta)), log taken in double precision:
        # 1 - pow(beta, t) in float32 loses ~5 digits for beta2 = 0.999.
        log_b1 = self._log_scalar((gi, "log(beta1)"), beta1, dev)
        log_b2 = self._log_scalar((gi, "log(beta2)"), beta2, dev)
        steps = [st["step"] for st in states]
        exp_avgs = [st["exp_avg"] for st in states]
        exp_avg_sqs = [st["exp_avg_sq"] for st in states]

        # Scalars once per lineage of step counts (see SyncFreeOptimizer._counters;
        # usually one per param group), as float32 vectors.
        t, per_param, commit_steps = self._counters(params, steps)
        t = t + 1
        step_size = lr / -torch.expm1(t * log_b1)
        bias2_sqrt = torch.sqrt(-torch.expm1(t * log_b2))
        # p - step_size * m / (sqrt(v) / bias2_sqrt + eps)
        #   = p + (m * c1) / (sqrt(v) + c2),
        #   c1 = -step_size * bias2_sqrt,  c2 = eps * bias2_sqrt
        # (finite for lr = 0, unlike dividing by lr as capturable torch.optim does)
        c1 = per_param(-step_size * bias2_sqrt)
        c2 = per_param(eps * bias2_sqrt)

        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        base = params
        if wd != 0:
            wd_t = self._scalar((gi, "weight_decay"), wd, dev)
            if decoupled:
                base = torch._foreach_mul(params, like(1 - lr * wd_t, params))
            else:
                grads = torch._foreach_addcmul(grads, params, like(wd_t, params))
        new_avgs = torch._foreach_lerp(exp_avgs, grads, like(one_m_b1, grads))
        # beta2 * v + (1 - beta2) * g * g, as lerp(v, g * g, 1 - beta2)
        new_sqs = torch._foreach_lerp(exp_avg_sqs, torch._foreach_mul(grads, grads),
                                      like(one_m_b2, grads))
        second = new_sqs
        if amsgrad:
            maxs = [st["max_exp_avg_sq"] for st in states]
            second = torch._foreach_maximum(maxs, new_sqs)
            self._commit(maxs, second, keep)
        # (out-of-place ops only: PyTorch/XLA checks in-place foreach ops
        # through Python meta functions, ~5x the cost of the op itself)
        denom = torch._foreach_add(torch._foreach_sqrt(second), c2)
        new_params = torch._foreach_addcdiv(base, torch._foreach_mul(new_avgs, c1), denom)
        commit_steps(t, keep)
        self._commit(exp_avgs, new_avgs, keep)
        self._commit(exp_avg_sqs, new_sqs, keep)
        self._commit(params, new_params, keep)

    def _one_minus(self, slot, beta, dev):
        if isinstance(beta, torch.Tensor):
            return 1 - self._scalar(slot, beta, dev)
        return self._scalar(slot, 1.0 - beta, dev)  # in double, then rounded once

    def _log_scalar(self, slot, beta, dev):
        if isinstance(beta, torch.Tensor):
            return torch.log(self._scalar(slot, beta, dev))
        return self._scalar(slot, math.log(beta) if beta > 0 else -math.inf, dev)

    # torch.optim.Adam state: {"step": CPU float32 tensor, "exp_avg",
    # "exp_avg_sq"[, "max_exp_avg_sq"]}.
    def _host_keys(self, state):
        step = state.get("step")
        return [step] if isinstance(step, torch.Tensor) and step.device.type == "xla" else []

    def _export_state(self, state, host):
        step = state.get("step")
        if isinstance(step, torch.Tensor) and id(step) in host:
            state["step"] = host[id(step)]
        return state

    def _import_state(self, p, state):
        if "step" in state:
            step = state["step"]
            if not isinstance(step, torch.Tensor):
                step = torch.tensor(float(step))
            self._lineage[p] = self._loaded_lineage(float(step))
            state["step"] = _fresh.put(step.detach().reshape(()).to(torch.float32), p)


Adam.__doc__ += _low_precision.OPTIONS_DOC
