"""Sharded checkpoints: parameters, master shards, optimizer state and the
GradScaler's state, each device writing and reading only its own shards
(``torch.distributed.checkpoint`` with PyTorch/XLA's SPMD planners).

    save(path, model=model, optimizer=optimizer, scaler=scaler)   # between steps
    load(path, model=model, optimizer=optimizer, scaler=scaler)   # fresh process, same setup

``load`` fills tensors in place, so they must exist with their sharding
first: it builds the model's and the optimizer's state dicts from the
objects given -- the optimizer's state made as its first step would make
it (zero moments, a master from the parameter), sharded as each parameter
-- reads the checkpoint into them, then hands them to each object's own
``load_state_dict`` (whose checks name any mismatch). A run restored at
step k continues bit-identically to the run that saved it.

One process per host on a pod: each process passes the same `path` (a
directory every host can write, e.g. a GCS FUSE mount or NFS) and
``torch.distributed`` must be initialised (it coordinates the plan);
a single process needs nothing.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from xla_amp._param_walk import check_optimizer

_KEYS = ("model", "optimizer", "scaler")


def _objects(model, optimizer, scaler, name) -> dict[str, Any]:
    from torch import nn
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None:
        check_optimizer(optimizer, name)
    if scaler is not None and not hasattr(scaler, "state_dict"):
        raise TypeError(f"{name}: scaler must be a GradScaler or None, got {type(scaler).__name__}")
    return {k: v for k, v in zip(_KEYS, (model, optimizer, scaler)) if v is not None}


def _distributed() -> dict[str, Any]:
    import torch.distributed as dist
    return {"no_dist": not (dist.is_available() and dist.is_initialized())}


def _settle() -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm
    torch_xla.sync()
    xm.wait_device_ops()


def _save_planner():
    """PyTorch/XLA's SPMDSavePlanner, writing each chunk once.

    Upstream defect (torch_xla 2.9, pinned in tests/test_sharded_api.py): a
    tensor replicated over one mesh axis and sharded over another (FSDPv2
    with ``extra_data_axis``: parameters sharded over ``fsdp``, replicated
    over ``data``) gets one write item per local shard, replicas included;
    the overlapping chunks fail the global plan's validation and the
    checkpoint is written without any sharded tensor, with no error. Here
    a chunk already planned (same tensor, same offsets) is not planned
    again; loading fills every replica from it."""
    import dataclasses
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    class OncePerChunk(SPMDSavePlanner):
        def create_local_plan(self):
            plan = super().create_local_plan()
            seen, items = set(), []
            for item in plan.items:
                if item.type == WriteItemType.SHARD:
                    key = (item.index.fqn, tuple(item.index.offset))
                    if key in seen:
                        continue
                    seen.add(key)
                items.append(item)
            return dataclasses.replace(plan, items=items)

    return OncePerChunk()


def save(path: str | os.PathLike, *, model, optimizer=None, scaler=None) -> None:
    """Write `model`'s, `optimizer`'s and `scaler`'s state to the directory
    `path` (made if missing), each sharded tensor as its shards. Call
    between steps, after ``scaler.update()``."""
    import torch.distributed.checkpoint as dcp
    objects = _objects(model, optimizer, scaler, "xla_amp.sharded.save")
    _settle()
    state = {k: v.state_dict() for k, v in objects.items()}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(path)),
             planner=_save_planner(), **_distributed())


def _make_state(optimizer) -> None:
    """The state `optimizer`'s first step would make, for each parameter
    lacking it, sharded as the parameter (values are overwritten by the
    load). torch.optim optimizers must have stepped once already."""
    from xla_amp.syncfree import _low_precision, _sharding
    missing = [(g, p) for g in optimizer.param_groups for p in g["params"]
               if not optimizer.state.get(p)]
    if not missing:
        return
    if not getattr(optimizer, "_xla_amp_syncfree", False):
        raise ValueError(f"xla_amp.sharded.load: {type(optimizer).__name__} has no state yet "
                         "to load into; use an xla_amp.syncfree optimizer (which makes it) "
                         "or load after one step")
    with torch.no_grad():
        for group, p in missing:
            st = optimizer.state[p]
            _low_precision.create_state(optimizer, group, p, st)
            _low_precision.between_steps(optimizer, group, p, st)
            _sharding.follow(p, st)


def load(path: str | os.PathLike, *, model, optimizer=None, scaler=None) -> None:
    """Restore what :func:`save` wrote to `path` into `model`, `optimizer`
    and `scaler`, built as for the run that saved (same model, mesh,
    precision, optimizer options). Shards are read straight into the
    device tensors; each object's ``load_state_dict`` then checks and takes
    its part."""
    import torch.distributed.checkpoint as dcp
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    objects = _objects(model, optimizer, scaler, "xla_amp.sharded.load")
    if not os.path.isfile(os.path.join(os.fspath(path), ".metadata")):
        raise FileNotFoundError(f"xla_amp.sharded.load: {os.fspath(path)!r} holds no checkpoint "
                                "(no .metadata file)")
    if optimizer is not None:
        _make_state(optimizer)
    _settle()
    state = {k: v.state_dict() for k, v in objects.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(os.fspath(path)),
             planner=SPMDLoadPlanner(), **_distributed())
    for k, obj in objects.items():
        obj.load_state_dict(state[k])
    _settle()
