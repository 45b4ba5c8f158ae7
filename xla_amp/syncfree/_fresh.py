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
The optimizer makes it before the first forward (``_base._reserve``): a
graph orders its outputs by when their tensors were made.
A parameter with an XLA sharding (every parameter under SPMD) keeps the
pending form, annotated by ``_sharding.py``: an upload takes a tiling only
as a mesh-based spec, and under SPMD PyTorch/XLA compiles the first step
apart anyway (docs/sync_free.md, "The first step compiles once").
"""
from __future__ import annotations

import torch

from xla_amp._upload import upload as _upload
from xla_amp.syncfree import _sharding


def uploads(like: torch.Tensor) -> bool:
    """Whether state made for ``like`` is uploaded (XLA, no sharding)."""
    return like.device.type == "xla" and not _sharding.spec(like)


def full(shape, value, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``shape`` filled with ``value`` on ``like``'s device."""
    if uploads(like):
        return _upload(torch.full(shape, value, dtype=dtype), like.device)
    return torch.full(shape, value, dtype=dtype, device=like.device)


def zeros_like(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Zeros of ``p``'s shape (and dtype unless given) on ``p``'s device."""
    return full(p.shape, 0, dtype or p.dtype, p)


def arange(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """0 .. n-1 on ``device`` (uploaded on an XLA device)."""
    if device.type == "xla":
        return _upload(torch.arange(n, dtype=dtype), device)
    return torch.arange(n, dtype=dtype, device=device)
