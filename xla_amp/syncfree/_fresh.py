"""State that a first step creates, made as device data, so that the first
step traces the same graph as every later one and compiles once.

On PyTorch/XLA, ``torch.zeros(..., device=xla)`` is a pending IR node: the
first step's graph would hold the zeros as constants where every later
step's graph takes the (by then materialised) state as inputs -- two
different graphs, two compilations of the whole training step (the larger
part of a whole model's start-up on a TPU). A tensor uploaded from the host
is device data from the start, so step 1 and step 2 trace the same graph::

    new_state(shape, dtype, like=p):
        if p is on an XLA device and carries no sharding:
            upload the host tensor (one host->device transfer, no graph)
        else:  # meta tensors (load_state_dict's dry run), SPMD shardings
            create it on p's device as before

Each tensor is uploaded as a buffer of its own (``xla_amp._upload``).
The optimizer makes it when it is built, before the first forward
(:func:`reserve`): a graph orders its outputs by when their tensors were
made, and state made inside the first step would come after that step's
gradients where every later step has it before them. The first step takes
it over (:func:`take`) when it is still what that step would make.
A parameter with an XLA sharding (every parameter under SPMD) keeps the
pending form, annotated by ``_sharding.py``: an upload takes a tiling only
as a mesh-based spec, and under SPMD PyTorch/XLA compiles the first step
apart anyway (docs/sync_free.md, "The first step compiles once").
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp._upload import materialize, upload as _upload
from xla_amp.syncfree import _low_precision, _sharding


def uploads(like: torch.Tensor) -> bool:
    """Whether state made for ``like`` is uploaded (XLA, no sharding)."""
    return like.device.type == "xla" and not _sharding.spec(like)


def full(shape, value, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``shape`` filled with ``value`` on ``like``'s device."""
    if uploads(like):
        return _upload(torch.full(shape, value, dtype=dtype), like.device)
    return torch.full(shape, value, dtype=dtype, device=like.device)


def put(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` of its own on ``like``'s device: a host value
    uploaded where :func:`uploads` (a loaded state entry: device data, never
    a constant or a buffer shared with an equal value), else ``.to``."""
    if uploads(like) and value.device.type == "cpu":
        return _upload(value, like.device)
    return value.to(like.device, copy=True)


def zeros_like(p: torch.Tensor) -> torch.Tensor:
    """Zeros of ``p``'s shape and dtype on ``p``'s device."""
    return full(p.shape, 0, p.dtype, p)


def reserve(opt, group: dict[str, Any]) -> None:
    """Make for each trainable parameter of ``group`` (``requires_grad``,
    no state yet, uploadable) the state its first step would create, and
    keep it in ``opt._reserved``. A bf16 parameter's float32 master, computed
    from the parameter, is made device data by one small graph here, so no
    step computes it."""
    masters = []
    positions = None
    for p in group["params"]:
        if not (p.requires_grad and not opt.state.get(p) and uploads(p)):
            continue
        st: dict[str, Any] = {}
        if _low_precision.applies(group, [p]):
            if positions is None:
                positions = _low_precision.positions_of(opt)
            masters += _low_precision.reserve_state(opt, group, p, st, positions[id(p)])
        else:
            opt._init_state(group, p, st)
        if st:
            opt._reserved[p] = st
    materialize(masters)


def take(opt, group: dict[str, Any], p: torch.Tensor, state: dict[str, Any]) -> bool:
    """Move the state :func:`reserve` made for ``p`` into ``state`` (empty)
    if it is what the step would make now -- the group's options may have
    changed since -- and return whether it did (else it is dropped)."""
    reserved = opt._reserved.pop(p)
    meta = torch.empty_like(p, device="meta")
    plan: dict[str, Any] = {}
    _low_precision.create_state(opt, group, meta, plan)
    _low_precision.between_steps(opt, group, meta, plan)
    if _layout(plan) != _layout(reserved):
        return False
    state.update(reserved)
    return True


def _layout(state: dict[str, Any]) -> dict[str, tuple]:
    """Each tensor entry's shape and dtype."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()
            if isinstance(v, torch.Tensor)}
