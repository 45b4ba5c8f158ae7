"""Data-parallel AMP: gradient all-reduce with scaling, replica mode and SPMD.

    xla_amp.all_reduce_gradients(optimizer)                  # mean over replicas
    xla_amp.optimizer_step(optimizer, scaler=scaler)         # reduce, then AMP step

Algorithm of `optimizer_step`::

    if SPMD: the partitioner already reduced the (sharded-batch) gradients
    elif the scaler has not unscaled this optimizer yet:
        all-reduce the scaled gradients (mean)       # an inf anywhere is inf everywhere
    else (unscale_ ran first, e.g. to clip local gradients):
        all-reduce the gradients, and found_inf with MAX  # every replica agrees
    scaler.step(optimizer); scaler.update()          # or optimizer.step() without one

All of it stays on the device: the skip decision is a device tensor that
every replica computes from the same reduced values.

Gradients are reduced in buckets: tensors of one dtype, in parameter order,
filled up to `bucket_cap_mb`; each bucket is one collective (a tuple
all-reduce), never one per tensor.

Replicas come from PyTorch/XLA's runtime (`torch_xla.launch(fn)` on a TPU
pod or multi-GPU host); `groups` are its replica groups. A world of one
replica needs no collective and PyTorch/XLA emits none (set
XLA_ALWAYS_ALLREDUCE=1 to see the HLO anyway).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from xla_amp._param_walk import check_on_xla, check_optimizer, params_with_grads, where

DEFAULT_BUCKET_CAP_MB = 50.0


def _runtime():
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    return xm, xr


def _collectives_skipped(xr) -> bool:
    """PyTorch/XLA's rule: no collective for one replica unless forced."""
    import torch_xla.utils.utils as xu
    return xr.world_size() == 1 and not xu.getenv_as("XLA_ALWAYS_ALLREDUCE", bool, False)


def _gradients(optimizer) -> list[torch.Tensor]:
    check_optimizer(optimizer, "all_reduce_gradients")
    grads = []
    for gi, pi, p in params_with_grads(optimizer):
        if p.grad.device.type != "xla":
            raise ValueError(
                f"all_reduce_gradients: {where(gi, pi)} has its gradient on "
                f"'{p.grad.device}', not on an XLA device")
        grads.append(p.grad)
    return grads


def _check_groups(groups, world: int) -> int:
    """The size of each replica group; ValueError unless they partition the world."""
    if groups is None or len(groups) == 0:
        return world
    members = [r for g in groups for r in g]
    sizes = {len(g) for g in groups}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"replica groups {groups} must be non-empty and of equal size")
    if sorted(members) != list(range(world)):
        raise ValueError(
            f"replica groups {groups} do not cover the {world} replicas 0..{world - 1} "
            "exactly once each")
    return sizes.pop()


def buckets(tensors: Sequence[torch.Tensor], cap_mb: float = DEFAULT_BUCKET_CAP_MB):
    """Split `tensors` into lists of one dtype each, at most `cap_mb` per list
    (a single larger tensor gets a list of its own). Order is kept per dtype."""
    cap = cap_mb * 1024 * 1024
    by_dtype: dict[torch.dtype, list[list[torch.Tensor]]] = {}
    filled: dict[torch.dtype, float] = {}
    for t in tensors:
        size = t.numel() * t.element_size()
        lists = by_dtype.setdefault(t.dtype, [[]])
        if lists[-1] and filled[t.dtype] + size > cap:
            lists.append([])
            filled[t.dtype] = 0.0
        lists[-1].append(t)
        filled[t.dtype] = filled.get(t.dtype, 0.0) + size
    return [b for lists in by_dtype.values() for b in lists if b]


def all_reduce_gradients(optimizer, groups: Optional[list[list[int]]] = None,
                         pin_layout: bool = True, scale: Optional[float] = None,
                         bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB) -> int:
    """Sum the optimizer's gradients over the replicas and multiply by `scale`
    (default 1/replicas per group: the mean), in place, on the device.

    Call after ``backward()`` and before the optimizer step (or use
    `optimizer_step`). A no-op under SPMD, where the compiler reduces.
    Returns the number of collectives emitted (0 under SPMD).
    """
    if scale is not None and not scale > 0:
        raise ValueError(f"all_reduce_gradients: scale must be > 0, got {scale}")
    xm, xr = _runtime()
    grads = _gradients(optimizer)
    if xr.is_spmd():
        return 0
    group_size = _check_groups(groups, xr.world_size())
    if scale is None:
        scale = 1.0 / group_size
    if not grads:
        return 0
    if _collectives_skipped(xr) and scale != 1.0:
        # PyTorch/XLA skips one-replica collectives, scale included.
        with torch.no_grad():
            torch._foreach_mul_(grads, scale)
    parts = buckets(grads, bucket_cap_mb)
    for bucket in parts:
        xm.all_reduce(xm.REDUCE_SUM, bucket, scale=scale, groups=groups or [],
                      pin_layout=pin_layout)
    return len(parts)


def check_replica_groups(groups) -> None:
    """ValueError unless `groups` (None: all replicas) partition this
    process's replicas; nothing to check under SPMD. For callers that take
    `groups` now and reduce later (xla_amp.fp8.attach)."""
    _, xr = _runtime()
    if not xr.is_spmd():
        _check_groups(groups, xr.world_size())


def reduce_max_(tensors: Sequence[torch.Tensor], groups=None, pin_layout: bool = True) -> int:
    """MAX-reduce `tensors` over the replicas in place, as one collective.
    Nothing under SPMD (the compiler reduces) or for no tensors; PyTorch/XLA
    skips it for one replica. Returns the number of collectives emitted."""
    xm, xr = _runtime()
    if xr.is_spmd() or not tensors:
        return 0
    _check_groups(groups, xr.world_size())
    xm.all_reduce(xm.REDUCE_MAX, list(tensors), groups=groups or [], pin_layout=pin_layout)
    return 1


def reduce_found_inf_(found_inf: Sequence[torch.Tensor], groups=None,
                      pin_layout: bool = True) -> None:
    """MAX-reduce skip flags over replicas in place: one replica's overflow
    skips the step on all of them."""
    reduce_max_(found_inf, groups, pin_layout)


def optimizer_step(optimizer, scaler=None, groups: Optional[list[list[int]]] = None,
                   pin_layout: bool = True, optimizer_args: Optional[dict] = None,
                   reduce_gradients: bool = True):
    """Reduce the gradients, then step: with a scaler, unscale + check + step +
    update, all on the device. Call once per iteration after ``backward()``.

    Works in replica mode (``torch_xla.launch``), with one replica and under
    SPMD with the same code. Returns what the optimizer's step returned.

    It calls ``scaler.update()``: with several optimizers sharing a scaler,
    call `all_reduce_gradients` and ``scaler.step`` for each, then one
    ``scaler.update()``, instead. ``reduce_gradients=False``: they were
    reduced already (before clipping them); the skip flags still are.

    An optimizer holding a parameter that is not on the XLA device is
    refused (``ValueError`` naming the first one) before any gradient is
    reduced or anything else changes.
    """
    from xla_amp.scaler import GradScaler
    if scaler is not None and not isinstance(scaler, GradScaler):
        raise TypeError(f"optimizer_step: scaler must be an xla_amp.GradScaler or None, "
                        f"got {type(scaler).__name__}")
    check_on_xla(optimizer, "optimizer_step")
    optimizer_args = optimizer_args or {}
    if reduce_gradients:
        all_reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    if scaler is None or not scaler.is_enabled():
        return optimizer.step(**optimizer_args)
    flags = scaler.found_inf_flags(optimizer)  # non-empty when unscale_ ran first
    if flags:
        reduce_found_inf_(flags, groups=groups, pin_layout=pin_layout)
    result = scaler.step(optimizer, **optimizer_args)
    scaler.update()
    return result
