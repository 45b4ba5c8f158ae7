"""`shard_model`: PyTorch/XLA's FSDPv2 (``SpmdFullyShardedDataParallel``)
with a ``ShardedPrecision``.

    model = shard_model(model, ShardedPrecision.bf16_master(), mesh=mesh)

Order, and why::

    model.to(xla)                        # FSDPv2 wants the module on the device
    precision.cast(model)                # bf16 before sharding: every shard,
                                         # all-gather and gradient in param_dtype
    FSDPv2(model, mesh=mesh, ...)        # marks each parameter's sharding
    forward: precision.autocast(device)  # the wrapper runs the module in it

The optimizer is built on the wrapped model's parameters, with
``precision.optimizer_options()``; its state takes each parameter's
sharding (``xla_amp.syncfree``).
"""
from __future__ import annotations

import functools
from typing import Any

from torch import nn

from xla_amp.sharded._precision import ShardedPrecision
from xla_amp.sharded._topology import check_processes


def _fsdpv2():
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel)
    return SpmdFullyShardedDataParallel


@functools.cache
def _wrapper_class():
    base = _fsdpv2()

    class PrecisionFSDPv2(base):
        """FSDPv2 whose forward runs in its ``ShardedPrecision``'s autocast."""

        def __init__(self, module: nn.Module, precision: ShardedPrecision, **kwargs):
            super().__init__(module, **kwargs)
            self.precision = precision

        def forward(self, *args: Any, **kwargs: Any):
            # no autocast of its own: the caller's region (if any) stays in
            # force (a disabled region here would switch an outer one off)
            if self.precision is None or self.precision.compute_dtype is None:
                return super().forward(*args, **kwargs)
            with self.precision.autocast(next(self.module.parameters()).device):
                return super().forward(*args, **kwargs)

    return PrecisionFSDPv2


def _checked(model, precision, mesh):
    import torch_xla.runtime as xr
    if not isinstance(model, nn.Module):
        raise TypeError(f"shard_model: expected an nn.Module, got {type(model).__name__}")
    if precision is not None and not isinstance(precision, ShardedPrecision):
        raise TypeError("shard_model: precision must be an xla_amp.sharded.ShardedPrecision "
                        "or None, "
                        f"got {type(precision).__name__}")
    if isinstance(model, _fsdpv2()):
        raise ValueError("shard_model: the model is already wrapped with FSDPv2; pass the "
                         "module it wraps (`.module`)")
    if not xr.is_spmd():
        raise RuntimeError("shard_model: SPMD is off; call torch_xla.runtime.use_spmd() before "
                           "the first XLA tensor is made")
    check_processes("shard_model")
    if mesh is None:
        import torch_xla.distributed.spmd as xs
        mesh = xs.get_global_mesh()
        if mesh is None:
            raise ValueError("shard_model: no mesh given and no global mesh set "
                             "(torch_xla.distributed.spmd.set_global_mesh)")
    if "fsdp" not in mesh.axis_names:
        raise ValueError(f"shard_model: the mesh's axes are {mesh.axis_names}; FSDPv2 shards "
                         "parameters over an axis named 'fsdp'")
    return mesh


def shard_model(model: nn.Module, precision: ShardedPrecision | None = None, *,
                mesh=None, **fsdp_kwargs) -> nn.Module:
    """Cast `model` to `precision` and wrap it with FSDPv2 on `mesh` (``None``:
    the global mesh); `fsdp_kwargs` go to ``SpmdFullyShardedDataParallel``
    (``shard_output``, ``auto_wrap_policy``, ``extra_data_axis``, ...).
    The returned wrapper runs the forward in ``precision.autocast`` when
    ``precision.compute_dtype`` is set. ``precision=None``: the model's
    dtypes as they are (cast it yourself), no autocast of its own. Call
    once, in SPMD mode, before building the optimizer. Everything is checked
    before the model changes, the launch too: a WORLD_SIZE or
    torch.distributed world size other than the runtime's process count
    is refused (``_topology``)."""
    mesh = _checked(model, precision, mesh)
    model = model.to("xla")
    if precision is not None:
        precision.cast(model)
    return _wrapper_class()(model, precision, mesh=mesh, **fsdp_kwargs)
