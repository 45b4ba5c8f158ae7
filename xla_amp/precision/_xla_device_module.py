"""``torch.xla``: the device module torch's activation checkpointing asks for.

torch.utils.checkpoint and torch.random.fork_rng reach a device type's
random number generator through ``getattr(torch, device_type)``. torch_xla
2.9 registers no ``torch.xla``, so every checkpoint of XLA tensors raised
``AttributeError: module 'torch' has no attribute 'xla'`` before anything
ran (pytorch/xla#5766, transformers#29314, aws-neuron-sdk#1317; pinned in
tests/precision/test_activation_checkpointing.py). That is the path
Transformers' gradient checkpointing, Lightning and Accelerate take.

`install()` registers this module's functions as ``torch.xla`` through
``torch._register_device_module`` (PyTorch's hook for out-of-tree devices)
where torch_xla has none; a torch_xla that brings its own keeps it. It
holds what those callers read and no more:

    is_available(), is_initialized(), _initialized   True: XLA tensors exist
    device_count()            this process's addressable XLA devices
    current_device()          the index device(...) set on this thread, else 0
    device(index)             context manager: the device get/set_rng_state use
    get_rng_state(device)     torch_xla's running seed as a uint8 tensor of 8
                              bytes (a host value: reading it moves no data)
    set_rng_state(state, device)

With the seed restored, a recomputed forward draws the dropout masks the
first forward drew (torch_xla.utils.checkpoint does the same with
``xm.set_rng_state``).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import types

import torch

_local = threading.local()


def _index(device) -> int:
    if device is None:
        return getattr(_local, "index", 0)
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "xla":
        raise ValueError(f"torch.xla: {device!r} is not an XLA device")
    return 0 if dev.index is None else dev.index


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def device_count() -> int:
    import torch_xla.runtime as xr
    return xr.addressable_runtime_device_count()


def current_device() -> int:
    return _index(None)


@contextlib.contextmanager
def device(index):
    """The XLA device `get_rng_state()` / `set_rng_state()` without a device
    argument mean, on this thread, for the block."""
    before = getattr(_local, "index", None)
    _local.index = _index(index)
    try:
        yield
    finally:
        if before is None:
            del _local.index
        else:
            _local.index = before


def get_rng_state(device=None) -> torch.Tensor:
    """The device's random state (torch_xla's running seed) as 8 bytes."""
    import torch_xla.core.xla_model as xm
    seed = xm.get_rng_state(f"xla:{_index(device)}")
    return torch.tensor(list(int(seed).to_bytes(8, "little")), dtype=torch.uint8)


def set_rng_state(new_state, device=None) -> None:
    """Restores a state `get_rng_state()` returned."""
    import torch_xla.core.xla_model as xm
    state = torch.as_tensor(new_state, dtype=torch.uint8)
    if state.numel() != 8:
        raise ValueError(f"torch.xla.set_rng_state: expected the 8-byte state get_rng_state "
                         f"returns, got {state.numel()} bytes")
    xm.set_rng_state(int.from_bytes(bytes(state.tolist()), "little"), f"xla:{_index(device)}")


_PUBLIC = ("is_available", "is_initialized", "device_count", "current_device", "device",
           "get_rng_state", "set_rng_state")


def install() -> bool:
    """Registers ``torch.xla`` if nothing has; returns whether this call did."""
    if getattr(torch, "xla", None) is not None:
        return False
    module = types.ModuleType("torch.xla", __doc__)
    here = sys.modules[__name__]
    for name in _PUBLIC:
        setattr(module, name, getattr(here, name))
    module._initialized = True
    module.__xla_amp__ = True  # tests tell it from a torch_xla that brings its own
    torch._register_device_module("xla", module)
    return True
