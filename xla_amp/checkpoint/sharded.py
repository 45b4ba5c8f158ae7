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
chunks, every chunk once (_sharded_dcp.save_planner), hashed as they are written
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
import logging
import os
from typing import Any

import torch

from xla_amp._param_walk import check_optimizer
from xla_amp.checkpoint import _lock
from xla_amp.checkpoint import _sharded_dcp as _dcp
from xla_amp.checkpoint import _sharded_convert as _converting
from xla_amp.checkpoint import _record
from xla_amp.checkpoint import _sharded_versions as _versions
from xla_amp.checkpoint._errors import CheckpointError
from xla_amp.checkpoint._sharded_versions import versions

__all__ = ["save", "load", "versions", "read_extra"]
log = logging.getLogger("xla_amp")

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


def save(path: str | os.PathLike, *, model, optimizer=None, scaler=None,
         keep: int = 1, extra: dict | None = None) -> None:
    """Write `model`'s, `optimizer`'s and `scaler`'s state as a new version
    of the checkpoint at the directory `path` (made if missing): each
    sharded tensor as its shards, with checksums, and how the run was
    trained (``xla_amp_sharded.json``); then make it the one ``load(path)``
    reads, in one atomic step, keeping the `keep` newest (an int >= 1;
    ``versions(path)`` lists them). The path's lock (``PATH.lock``) is held
    from the first write to the last, by the coordinator for the whole job:
    a save while another run or thread holds it is refused
    (``CheckpointLocked``) before anything is written. `extra`: plain JSON
    data kept in the record (a step, a data position), returned by
    ``load`` and :func:`read_extra`. Call between steps, after
    ``scaler.update()``."""
    who = "xla_amp.sharded.save"
    objects = _objects(model, optimizer, scaler, who)
    _versions.check_keep(keep, who)
    extra = _plain_json(extra, who)
    path = os.fspath(path)
    _dcp.settle()
    state = {k: v.state_dict() for k, v in objects.items()}

    def describe():
        return dict(_record.sharded_record(model, optimizer, scaler), extra=extra)
    _write_version(path, state, keep, _dcp.save_planner(), describe, who)


def _plain_json(extra, who: str) -> dict:
    """`extra` (None: {}) if it is a dict of plain JSON data that reads back
    equal; TypeError in one line otherwise, before anything is written."""
    import json
    if extra is None:
        return {}
    try:
        ok = isinstance(extra, dict) and json.loads(json.dumps(extra)) == extra
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TypeError(f"{who}: extra must be a dict of plain JSON data (str keys; numbers, "
                        f"strings, lists, dicts), got {str(extra)[:80]!r}; nothing was written")
    return extra


def read_extra(path: str | os.PathLike) -> dict:
    """The `extra` that :func:`save` kept in the checkpoint ``load(path)``
    reads ({} for one saved without it); nothing is loaded."""
    who = "xla_amp.sharded.read_extra"
    with _versions.reading(os.fspath(path), who) as where:
        record = _record.read_sharded(where, who)
    extra = (record or {}).get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{who}: {os.path.join(where, _record.FILE)} was not loaded: its "
                         "extra is not a dict")
    return extra


def _locked(path: str, who: str) -> contextlib.ExitStack:
    """The path's lock, taken by the coordinator (a refusal raised on every
    process); release it by closing what is returned."""
    held = contextlib.ExitStack()

    def take():
        try:
            held.enter_context(_lock.hold(path))
        except CheckpointError as e:
            raise type(e)(f"{who}: {e}; nothing was written") from None
    _dcp.coordinated(take)
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
        name, previous = _dcp.coordinated(lambda: _versions.begin(path, keep))
        where = os.path.join(path, name)
        writer = Writer(where)
        try:
            dcp.save(state, storage_writer=writer, planner=planner, **_dcp.distributed())
        except CheckpointException as e:  # a BaseException, like the load's
            raise CheckpointError(f"{who}: {where}: could not write it "
                                  f"({_dcp.first_failure(e)}); {path} holds what it held "
                                  "before") from None

        def finish():
            record = describe()
            record["checksums"] = writer.metadata_record()
            _versions.write_record(where, record)
            _versions.publish(path, name, previous, keep)
        _dcp.coordinated(finish)


def load(path: str | os.PathLike, *, model, optimizer=None, scaler=None,
         allow_rounding: bool = False) -> dict:
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
    ``load_state_dict`` takes its part. Into objects of another precision
    mode (bf16 + master into fp32, ...) it converts where that is exact
    and refuses in one line naming both modes where it is not, unless
    `allow_rounding` (_sharded_convert). Returns the `extra` saved with it."""
    who = "xla_amp.sharded.load"
    objects = _objects(model, optimizer, scaler, who)
    with _versions.reading(os.fspath(path), who) as where:
        return _load(os.fspath(path), where, objects, optimizer, allow_rounding, who)


def _load(path: str, where: str, objects: dict, optimizer, allow_rounding: bool,
          who: str) -> dict:
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
    saved = (record or {}).get("training")
    if _converting.needed(saved, _record.sharded_training(*objects_of(objects)), objects):
        return _load_converted(path, where, record, metadata, sums, objects, allow_rounding,
                               who)
    _record.check_precision(record, optimizer, path, who)
    made: list = []
    try:
        if optimizer is not None:
            _dcp.make_state(optimizer, metadata, made)
        state = {k: v.state_dict() for k, v in objects.items()}
        keys = _checks.compare(state, metadata, path, who)
        _dcp.settle()  # the state made above takes its sharding: the plan depends on it
        if sums is not None:
            sums.check_reads(metadata, _dcp.planned_reads(state, metadata))
        values = _safe.read_values(where, metadata, keys, who)
        _checks.compare_values(values, state, path, who)
    except BaseException:
        for p in made:  # as it was: no state for these
            optimizer.state.pop(p, None)
        raise
    _dcp.read_into(state, where, metadata, values, who)
    for k, obj in objects.items():
        obj.load_state_dict(state[k])
    _dcp.settle()
    return dict((record or {}).get("extra") or {})


def objects_of(objects: dict) -> tuple:
    """(model, optimizer, scaler) of :func:`_objects`' dict."""
    return tuple(objects.get(k) for k in _KEYS)


def _load_converted(path: str, where: str, record: dict, metadata, sums, objects: dict,
                    allow_rounding: bool, who: str) -> dict:
    """``load`` into objects of another precision mode (_sharded_convert)."""
    from xla_amp.checkpoint import _sharded_metadata as _safe
    device = next(objects["model"].parameters()).device
    tensors = _converting.read_as_saved(metadata, objects, device)
    keys = [k for k in metadata.state_dict_metadata
            if k.split(".", 1)[0] in objects and k not in tensors]
    _dcp.settle()  # the new tensors take their sharding: the plan depends on it
    if sums is not None:
        sums.check_reads(metadata, _dcp.planned_reads(tensors, metadata))
    values = _safe.read_values(where, metadata, keys, who)
    _dcp.read_into(tensors, where, metadata, {}, who)
    notes = _converting.restore({**tensors, **values}, record["training"], objects,
                                allow_rounding, path, who)
    _dcp.settle()
    if notes:
        log.warning("%s: %s converted from %s: %s", who, path,
                    _record.mode_name(record["training"]), "; ".join(notes))
    return dict(record.get("extra") or {})
