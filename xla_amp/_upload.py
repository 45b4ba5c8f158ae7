"""Host values put on a device as device data: one upload each, never a
graph constant.

On PyTorch/XLA, ``host.to(device)`` of a 0-dim tensor holding 0 or 1 is
inlined as a constant of the next graph, and equal-valued 0-dim uploads share
one device buffer. A tensor that a training step keeps and updates (a step
count, a loss scale) made that way is a constant, or a shared input, in the
first step's graph and a buffer of its own in every later one: two graphs,
the whole step compiled twice. ``_xla_tensors_from_aten`` uploads each
tensor as a buffer of its own; other devices take ``.to``.
"""
from __future__ import annotations

import torch


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) as device data on ``device``."""
    device = torch.device(device)
    if device.type != "xla":
        return host.to(device)
    import torch_xla
    return torch_xla._XLAC._xla_tensors_from_aten([host], [str(device)])[0]


def materialize(tensors: list) -> None:
    """Run the pending computation of ``tensors`` (XLA) as one graph of its
    own, now, so that they are device data in the next step's graph."""
    if tensors:
        import torch_xla
        torch_xla._XLAC._xla_sync_multi(tensors, devices=[], wait=False)
