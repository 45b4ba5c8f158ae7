"""PyTorch/XLA's fused per-parameter optimizer ops, the sync-free fast path.

PyTorch/XLA 2.9 lowers one whole SGD or Adam/AdamW parameter update --
weight decay, moments, bias corrections, the step count and the skip on
``found_inf`` -- to a single IR node (``xla::sgd_optimizer_step`` /
``xla::adam_optimizer_step``). Building that node costs a fraction of the
dozen multi-tensor ops plus a ``torch.where`` per written tensor that the
portable path needs, and the graph it leaves is smaller to hash and look up
at every ``torch_xla.sync()``.

Semantics, measured on this torch_xla (``tests/syncfree/test_syncfree.py`` keeps
them honest)::

    fused_step(found_inf, step, param, ...):
        if found_inf != 0 (NaN included):  nothing changes, bit for bit
        else:  torch.optim's update of param and state;  step <- step + 1
    SGD: a buffer whose step is 0 is (re)initialised to the gradient, as
         torch.optim.SGD creates it on its first step; the op writes a
         buffer of the parameter's shape even with momentum 0; with maximize
         it negates after adding weight decay (torch.optim: before), so
         sgd_() negates the gradients itself then.
    Adam: bias corrections from the device-side step; max_exp_avg_sq is an
         empty tensor unless amsgrad.

Limits: parameters and gradients must be float32 (the op compares a float32
found_inf with constants of the parameter's type, which XLA rejects for
bf16), so other parameters take the portable path, also within a group that
otherwise runs fused; and every hyperparameter must be a Python number (the
op takes doubles, not tensors), or the whole group takes the portable path.
Doubles become graph inputs, so a scheduler's new lr does not recompile --
except that PyTorch/XLA inlines exactly 0.0 and 1.0 as constants (its
"special scalars"), and a schedule reaching one (CosineAnnealingLR ends at
0.0) would compile another graph. The lr is therefore passed as the nearest
non-special double (5e-324, 1 + 2**-52): both round to the same float32 on
the device, and the updates are bit-identical (tests/syncfree/test_syncfree.py).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch_xla

from xla_amp._upload import upload

_XLAC = torch_xla._XLAC
_ADAM = getattr(_XLAC, "_xla_adam_optimizer_step_", None)
_SGD = getattr(_XLAC, "_xla_sgd_optimizer_step_", None)

_empty: dict[torch.device, torch.Tensor] = {}

# lr values PyTorch/XLA would inline as constants -> the nearest doubles it
# does not (same float32; -0.0 == 0.0 maps too)
_NOT_SPECIAL = {0.0: 5e-324, 1.0: math.nextafter(1.0, 2.0)}


def _lr(value) -> float:
    value = float(value)
    return _NOT_SPECIAL.get(value, value)


def empty(device: torch.device) -> torch.Tensor:
    """A 0-element float32 tensor on ``device`` for Adam's unused
    max_exp_avg_sq (not written without amsgrad, so one per device is
    shared)."""
    t = _empty.get(device)
    if t is None:
        # device data from the start: a pending tensor would be an output
        # of the first step's graph only (another graph than the next step's)
        t = _empty[device] = upload(torch.empty(0, dtype=torch.float32), device)
    return t


def unfusable(kind: str, group: dict[str, Any], keys: tuple[str, ...],
              odd: tuple | None) -> str | None:
    """Why this param group cannot take the fused op (``None`` if it can);
    ``odd`` is (index, dtype, gradient dtype or None) of a parameter that is
    not float32 or has a gradient that is not."""
    if (_ADAM if kind == "adam" else _SGD) is None:
        return f"this torch_xla has no fused {kind} op"
    for key in keys:
        value = group[key]
        for v in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(v, torch.Tensor):
                return f"'{key}' is a tensor (the fused op takes Python numbers)"
    if odd is not None:
        pi, dtype, grad_dtype = odd
        grad = "" if grad_dtype is None else f" with a {grad_dtype} gradient"
        return f"parameter {pi} is {dtype}{grad} (the fused op needs float32)"
    return None


def flag(found_inf: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """``found_inf`` as the float32 0-dim tensor the ops expect (non-zero
    skips); zero when there is none."""
    if found_inf is None:
        return torch.zeros((), dtype=torch.float32, device=device)
    if found_inf.dtype != torch.float32:
        # != 0 first: a float64 1e-300 or an int must not round to 0
        return (found_inf != 0).to(torch.float32)
    return found_inf


def adam_(found_inf, params, grads, states, *, beta1: float, beta2: float, lr: float,
          weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
          decoupled: bool) -> None:
    """One fused Adam (``decoupled``: AdamW) update per parameter, in place;
    ``states`` are torch.optim.Adam's per-parameter dicts (``step``,
    ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` if amsgrad)."""
    beta1, beta2, lr, weight_decay, eps = (
        float(beta1), float(beta2), _lr(lr), float(weight_decay), float(eps))
    unused = None if amsgrad else empty(params[0].device)
    for p, g, st in zip(params, grads, states):
        _ADAM(found_inf, st["step"], p, g, st["exp_avg"], st["exp_avg_sq"],
              unused if unused is not None else st["max_exp_avg_sq"],
              beta1, beta2, lr, weight_decay, eps, amsgrad, maximize, decoupled)


def sgd_(found_inf, steps, params, grads, bufs, *, momentum: float, dampening: float,
         lr: float, weight_decay: float, nesterov: bool, maximize: bool) -> None:
    """One fused SGD update per parameter, in place."""
    momentum, dampening, lr, weight_decay = (
        float(momentum), float(dampening), _lr(lr), float(weight_decay))
    if maximize and weight_decay != 0:
        # The op negates after adding weight decay, -(g + wd * p);
        # torch.optim.SGD adds it to the negated gradient, -g + wd * p.
        grads, maximize = torch._foreach_neg(grads), False
    for step, p, g, buf in zip(steps, params, grads, bufs):
        _SGD(found_inf, step, p, buf, g, weight_decay, momentum, lr, dampening,
             nesterov, maximize)
