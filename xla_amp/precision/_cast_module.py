"""`cast_module`: bf16 (or fp16) weights, the successor of PyTorch/XLA's
XLA_USE_BF16 / XLA_DOWNCAST_BF16 switches, per model instead of per process.

    xla_amp.cast_module(model, torch.bfloat16, keep=(nn.LayerNorm,))

Casts, in place, every floating parameter and floating buffer to `dtype`
(buffers to `buffer_dtype` where given), except in modules that are instances of a `keep` class and everything inside
them. Integer buffers (BatchNorm's num_batches_tracked) stay as they are.
Parameters keep their identity (``param.data`` changes), so an optimizer
built before the cast still holds them; build it after, as its state dtype
follows the parameters. Pair with ``syncfree.*(..., master_weights=True)``
or ``stochastic_rounding=True`` so updates below bf16's resolution are not
lost, and with ``module_policies(model, {KeptClass: "fp32"})`` so a kept
module gets float32 inputs.
"""
from __future__ import annotations

import torch
from torch import nn


def keep_classes(keep, who: str) -> tuple[type, ...]:
    """`keep` (a class or a collection of them) as a tuple of nn.Module
    classes; ValueError naming the first entry that is not one."""
    keep = tuple(keep) if isinstance(keep, (tuple, list, set, frozenset)) else (keep,)
    for cls in keep:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ValueError(f"{who}: keep entry {cls!r} is not an nn.Module subclass")
    return keep


def _check(model, dtype, keep) -> tuple[type, ...]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"cast_module: expected an nn.Module, got {type(model).__name__}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"cast_module: dtype must be a floating torch.dtype, got {dtype!r}")
    return keep_classes(keep, "cast_module")


def cast_module(model: nn.Module, dtype: torch.dtype = torch.bfloat16,
                keep=(), buffer_dtype: torch.dtype | None = None) -> nn.Module:
    """Casts `model`'s floating parameters to `dtype` and its floating
    buffers to `buffer_dtype` (``None``: `dtype`) in place, except inside
    modules of the `keep` classes; returns `model`. Call it once, after
    moving the model to its device and before building the optimizer. A
    sharded parameter (SPMD) keeps its sharding."""
    keep = _check(model, dtype, keep)
    if buffer_dtype is None:
        buffer_dtype = dtype
    elif not (isinstance(buffer_dtype, torch.dtype) and buffer_dtype.is_floating_point):
        raise ValueError("cast_module: buffer_dtype must be a floating torch.dtype or None, "
                         f"got {buffer_dtype!r}")
    kept: set[int] = set()
    for module in model.modules():  # parents come before their children
        if id(module) in kept or isinstance(module, keep):
            kept.update(id(m) for m in module.modules())
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                with torch.no_grad():
                    p.data = p.data.to(dtype)
                if p.grad is not None:
                    p.grad = p.grad.to(dtype)
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point() and b.dtype != buffer_dtype:
                setattr(module, name, b.to(buffer_dtype))
    return model
