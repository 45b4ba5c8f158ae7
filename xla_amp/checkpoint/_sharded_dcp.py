"""DCP under PyTorch/XLA's SPMD, for the sharded format (sharded.py): the
planners (each chunk written once; non-tensor entries taken as read and
checked), the read plan a load will make, the optimizer state made to load
into, and the coordination of a job's processes (the coordinator's result
or error on every process; one line out of DCP's per-rank traceback).
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp.checkpoint._errors import CheckpointError


def distributed() -> dict[str, Any]:
    import torch.distributed as dist
    return {"no_dist": not (dist.is_available() and dist.is_initialized())}


def settle() -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm
    torch_xla.sync()
    xm.wait_device_ops()


def save_planner():
    """PyTorch/XLA's SPMDSavePlanner, writing each chunk once.

    Upstream defect (torch_xla 2.9, pinned in tests/sharded/test_sharded_api.py): a
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


def load_planner(values: dict[str, Any]):
    """PyTorch/XLA's SPMDLoadPlanner taking the non-tensor entries already
    read and checked (weights-only) by :func:`load` instead of unpickling
    them again with ``torch.load`` (whose ``weights_only`` an environment
    variable can turn off: pinned in tests/sharded/test_sharded_checkpoint_safety.py).

    Upstream gap (torch_xla 2.9, pinned in tests/sharded/test_sharded_checkpoint_checks.py,
    ``..._silently_upstream_gap``): the planner never compares a sharded
    tensor's size or dtype with the checkpoint's -- it reads whatever
    chunks overlap the local shards, so a wider checkpoint fills a narrower
    tensor with its leading rows, a narrower one leaves a wider tensor as
    it was (its shards never complete), and bf16 is converted into fp32,
    all without an error. :func:`load` therefore compares every key,
    global shape and dtype first (_sharded_checks); when upstream
    refuses by itself, that comparison stays as the one-line message."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    from torch_xla.experimental.distributed_checkpoint._helpers import set_element

    class CheckedValues(SPMDLoadPlanner):
        def load_bytes(self, read_item, value):
            fqn = read_item.dest_index.fqn
            set_element(self.original_state_dict, self.mappings[fqn], values[fqn])

    return CheckedValues()


def coordinator() -> bool:
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def agree(value):
    """The coordinator's `value` on every process (a broadcast under
    ``torch.distributed``; one process: `value`)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def coordinated(step):
    """``step()`` on the coordinator only; its result on every process, or its
    error: raised there as it is, elsewhere as a CheckpointError with its text."""
    result, error = None, None
    if coordinator():
        try:
            result = step()
        except Exception as e:  # noqa: BLE001 -- raised again below, on every process
            error = e
    result, text = agree((result, None if error is None else str(error)))
    if error is not None:
        raise error
    if text is not None:
        raise CheckpointError(text)
    return result


def make_state(optimizer, metadata, made: list) -> None:
    """Make the state `optimizer`'s first step would make, for each parameter
    lacking it whose state the checkpoint holds (index i: a key
    ``optimizer.state.<i>.*``), sharded as the parameter; the values are
    overwritten by the load. Appends each parameter it makes state for to
    `made` as it goes, so that a refusal can drop it again. torch.optim
    optimizers must have stepped once already."""
    from xla_amp.syncfree import _low_precision, _sharding
    saved = {k.split(".")[2] for k in metadata.state_dict_metadata
             if k.startswith("optimizer.state.")}
    params = [(g, p) for g in optimizer.param_groups for p in g["params"]]
    missing = [(g, p) for i, (g, p) in enumerate(params)
               if str(i) in saved and not optimizer.state.get(p)]
    if missing and not getattr(optimizer, "_xla_amp_syncfree", False):
        raise ValueError(f"xla_amp.sharded.load: {type(optimizer).__name__} has no state yet "
                         "to load into; use an xla_amp.syncfree optimizer (which makes it) "
                         "or load after one step")
    with torch.no_grad():
        for group, p in missing:
            made.append(p)
            st = optimizer.state[p]
            _low_precision.create_state(optimizer, group, p, st)
            _low_precision.between_steps(optimizer, group, p, st)
            _sharding.follow(p, st)


def planned_reads(state, metadata) -> list:
    """The items this process's ``dcp.load`` of `state` will read: the local
    plan of its planner, made as DCP makes it (nothing is read or moved)."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    planner = SPMDLoadPlanner()
    planner.set_up_planner(state, metadata, coordinator())
    return planner.create_local_plan().items


def first_failure(e) -> str:
    """One line from torch's CheckpointException (a traceback per rank):
    the first failing rank's exception, type and message."""
    for exc, _trace in e.failures.values():
        text = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return " ".join(str(e).split())[:200]


def read_into(state, where: str, metadata, values: dict[str, Any], who: str) -> None:
    """DCP's load of `state` from the checkpoint in `where`, through the
    checked `metadata` and the non-tensor `values` already read; torch's
    CheckpointException as one CheckpointError line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from xla_amp.checkpoint._sharded_metadata import reader
    try:
        dcp.load(state, storage_reader=reader(where, metadata), planner=load_planner(values),
                 **distributed())
    except CheckpointException as e:  # a BaseException: `except Exception` would miss it
        raise CheckpointError(f"{who}: {where}: could not read its data ({first_failure(e)})"
                              ) from None
