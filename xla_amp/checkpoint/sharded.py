"""The sharded checkpoint format: parameters, master shards, optimizer state
and the GradScaler's state, each device writing and reading only its own
shards (``torch.distributed.checkpoint`` with PyTorch/XLA's SPMD planners),
on the parts every format of this package shares (the path lock, atomic
files, checksums, the training record). ``xla_amp.sharded.save`` / ``load``
/ ``versions`` are these, after the launch's process check.

    save(path, model=model, optimizer=optimizer, scaler=scaler)   # between steps
    load(path, model=model, optimizer=optimizer, scaler=scaler)   # fresh process, any mesh

``save``: the path's lock (_lock; the coordinator holds it for the job);
a new version directory under `path` (_sharded_versions); each device's
chunks, every chunk once (``_save_planner``), hashed as they are written
(_sharded_checksums); the record of how the run was trained (_record:
mesh, dtypes, precision options, the checksum of ``.metadata``; JSON);
then the version is published by one rename, keeping the ``keep`` newest.
A save killed at any moment leaves the previous checkpoint the one
``load`` reads.

``load`` holds the version it reads against removal (_sharded_versions.
reading) and fills tensors in place, so they must exist with their
sharding first: it builds the model's and the optimizer's state dicts
from the objects given -- the optimizer's state made as its first step
would make it (zero moments, a master from the parameter), sharded as
each parameter -- reads the checkpoint into them, then hands them to each
object's own ``load_state_dict``. Everything that can refuse does so
before a value moves, in this order::

    .metadata   its checksum, then unpickled admitting a metadata's classes
                only                                (_sharded_checksums, _sharded_metadata)
    record      precision options == the optimizer's (_record)
    entries     every key, global shape and dtype == here (_sharded_checks)
    bytes       the checksums of every byte this process will read
    values      non-tensor entries read weights-only, then checked

A refusal drops the optimizer state made for the check again (fresh zeros
and copies of parameters: nothing else holds them yet). The checkpoint's
mesh need not be this one: each device reads the chunks that cover its own
shards (resharding, N -> M devices).
A run restored at step k on the same mesh continues bit-identically.

One process per host on a pod: each process passes the same `path` (a
directory every host can write, e.g. a GCS FUSE mount or NFS) and
``torch.distributed`` must be initialised (it coordinates the plan);
a single process needs nothing.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from xla_amp._param_walk import check_optimizer
from xla_amp.checkpoint import _lock
from xla_amp.checkpoint import _record
from xla_amp.checkpoint import _sharded_versions as _versions
from xla_amp.checkpoint._errors import CheckpointError
from xla_amp.checkpoint._sharded_versions import versions

__all__ = ["save", "load", "versions"]

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


def _load_planner(values: dict[str, Any]):
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
    global shape and dtype first (_checkpoint_checks); when upstream
    refuses by itself, that comparison stays as the one-line message."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    from torch_xla.experimental.distributed_checkpoint._helpers import set_element

    class CheckedValues(SPMDLoadPlanner):
        def load_bytes(self, read_item, value):
            fqn = read_item.dest_index.fqn
            set_element(self.original_state_dict, self.mappings[fqn], values[fqn])

    return CheckedValues()


def _coordinator() -> bool:
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _agree(value):
    """The coordinator's `value` on every process (a broadcast under
    ``torch.distributed``; one process: `value`)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _coordinated(step):
    """``step()`` on the coordinator only; its result on every process, or its
    error: raised there as it is, elsewhere as a CheckpointError with its text."""
    result, error = None, None
    if _coordinator():
        try:
            result = step()
        except Exception as e:  # noqa: BLE001 -- raised again below, on every process
            error = e
    result, text = _agree((result, None if error is None else str(error)))
    if error is not None:
        raise error
    if text is not None:
        raise CheckpointError(text)
    return result


def save(path: str | os.PathLike, *, model, optimizer=None, scaler=None,
         keep: int = 1) -> None:
    """Write `model`'s, `optimizer`'s and `scaler`'s state as a new version
    of the checkpoint at the directory `path` (made if missing): each
    sharded tensor as its shards, with checksums, and how the run was
    trained (``xla_amp_sharded.json``); then make it the one ``load(path)``
    reads, in one atomic step, keeping the `keep` newest (an int >= 1;
    ``versions(path)`` lists them). The path's lock (``PATH.lock``) is held
    from the first write to the last, by the coordinator for the whole job:
    a save while another run or thread holds it is refused
    (``CheckpointLocked``) before anything is written. Call between steps,
    after ``scaler.update()``."""
    who = "xla_amp.sharded.save"
    objects = _objects(model, optimizer, scaler, who)
    _versions.check_keep(keep, who)
    path = os.fspath(path)
    _settle()
    state = {k: v.state_dict() for k, v in objects.items()}
    _write_version(path, state, keep, _save_planner(),
                   lambda: _record.sharded_record(model, optimizer, scaler), who)


def _locked(path: str, who: str) -> contextlib.ExitStack:
    """The path's lock, taken by the coordinator (a refusal raised on every
    process); release it by closing what is returned."""
    held = contextlib.ExitStack()

    def take():
        try:
            held.enter_context(_lock.hold(path))
        except CheckpointError as e:
            raise type(e)(f"{who}: {e}; nothing was written") from None
    _coordinated(take)
    return held


def _write_version(path: str, state, keep: int, planner, describe, who: str) -> None:
    """`state` as a new version of the checkpoint at `path`, published, the
    `keep` newest kept (_sharded_versions), under the path's lock; every
    process of the run calls it, the coordinator also does both ends.
    ``describe()``: the record."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from xla_amp.checkpoint._sharded_checksums import Writer
    with _locked(path, who):
        name, previous = _coordinated(lambda: _versions.begin(path, keep))
        where = os.path.join(path, name)
        writer = Writer(where)
        try:
            dcp.save(state, storage_writer=writer, planner=planner, **_distributed())
        except CheckpointException as e:  # a BaseException, like the load's
            raise CheckpointError(f"{who}: {where}: could not write it ({_first_failure(e)}); "
                                  f"{path} holds what it held before") from None

        def finish():
            record = describe()
            record["checksums"] = writer.metadata_record()
            _versions.write_record(where, record)
            _versions.publish(path, name, previous, keep)
        _coordinated(finish)


def _make_state(optimizer, metadata, made: list) -> None:
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


def _planned_reads(state, metadata) -> list:
    """The items this process's ``dcp.load`` of `state` will read: the local
    plan of its planner, made as DCP makes it (nothing is read or moved)."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    planner = SPMDLoadPlanner()
    planner.set_up_planner(state, metadata, _coordinator())
    return planner.create_local_plan().items


def _first_failure(e) -> str:
    """One line from torch's CheckpointException (a traceback per rank):
    the first failing rank's exception, type and message."""
    for exc, _trace in e.failures.values():
        text = " ".join(str(exc).split())
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return " ".join(str(e).split())[:200]


def load(path: str | os.PathLike, *, model, optimizer=None, scaler=None) -> None:
    """Restore what :func:`save` wrote to `path` into `model`, `optimizer`
    and `scaler`, built as for the run that saved (same model, precision,
    optimizer options; any mesh). `path` is what :func:`save` was given
    (its newest version is read) or one of ``versions(path)``. The version
    read is held against removal until the load ends: a save publishing
    meanwhile leaves it whole. The checksums of ``.metadata`` and of every
    byte this process reads are checked first (a mismatch:
    ``CheckpointDamaged``, a ``CheckpointError``, naming the file and the
    first damaged tensor). Every key, global shape and dtype is compared
    with the checkpoint first, and the precision options with its record:
    a difference raises ``ValueError`` naming it, with nothing changed.
    Shards are then read straight into the device tensors; each object's
    ``load_state_dict`` takes its part."""
    who = "xla_amp.sharded.load"
    objects = _objects(model, optimizer, scaler, who)
    with _versions.reading(os.fspath(path), who) as where:
        _load(os.fspath(path), where, objects, optimizer, who)


def _load(path: str, where: str, objects: dict, optimizer, who: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from xla_amp.checkpoint import _sharded_checks as _checks
    from xla_amp.checkpoint import _sharded_checksums as _checksums
    from xla_amp.checkpoint import _sharded_metadata as _safe
    if not os.path.isfile(os.path.join(where, ".metadata")):
        raise FileNotFoundError(f"{who}: {where!r} holds no checkpoint (no .metadata file)")
    record = _record.read_sharded(where, who)
    sums = _checksums.expected(where, record, who)   # None: from before checksums
    if sums is not None:
        sums.check_metadata()
    metadata = _safe.read_metadata(where, who)
    _record.check_precision(record, optimizer, path, who)
    made: list = []
    try:
        if optimizer is not None:
            _make_state(optimizer, metadata, made)
        state = {k: v.state_dict() for k, v in objects.items()}
        keys = _checks.compare(state, metadata, path, who)
        _settle()  # the state made above takes its sharding: the plan depends on it
        if sums is not None:
            sums.check_reads(metadata, _planned_reads(state, metadata))
        values = _safe.read_values(where, metadata, keys, who)
        _checks.compare_values(values, state, path, who)
    except BaseException:
        for p in made:  # as it was: no state for these
            optimizer.state.pop(p, None)
        raise
    try:
        dcp.load(state, storage_reader=_safe.reader(where, metadata),
                 planner=_load_planner(values), **_distributed())
    except CheckpointException as e:  # a BaseException: `except Exception` would miss it
        raise CheckpointError(f"{who}: {where}: could not read its data ({_first_failure(e)})"
                              ) from None
    for k, obj in objects.items():
        obj.load_state_dict(state[k])
    _settle()
