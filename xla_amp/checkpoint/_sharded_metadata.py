"""Reading a checkpoint's files without running code from them.

A ``torch.distributed.checkpoint`` directory holds a pickled ``.metadata``
and data files. In torch 2.9, ``FileSystemReader.read_metadata`` unpickles
``.metadata`` with plain ``pickle.load``: a crafted file runs whatever its
pickle calls (pinned: tests/sharded/test_sharded_checkpoint_safety.py). Tensors
are read with ``torch.load(weights_only=True)``; non-tensor entries (the
optimizer's param groups, the scaler's state) reach the planner's
``load_bytes``, which in torch_xla 2.9's ``SPMDLoadPlanner`` calls
``torch.load`` without saying ``weights_only`` -- safe only while nothing
sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` (DCP's own default planner turns
the weights-only reader off outright).

So here:

    .metadata      unpickled by an Unpickler whose find_class admits only
                   what a DCP metadata is made of (the dataclasses of
                   torch.distributed.checkpoint.metadata, _StorageInfo,
                   torch.Size, torch dtypes, layouts, paths) -- any other
                   global (os.system, builtins.open, getattr, ...) stops
                   the read before it is called -- then checked for shape:
                   a Metadata of str keys, storage files inside the folder
    bytes entries  read (through the reader, so DCP's own transforms apply)
                   before anything is loaded and unpickled with
                   torch.load(weights_only=True); the load's planner takes
                   these values rather than unpickling again

Every refusal is a ``ValueError`` of one line naming the file and saying
it was not loaded.
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

_DCP = "torch.distributed.checkpoint.metadata"
_ADMITTED = {
    *((_DCP, n) for n in ("Metadata", "MetadataIndex", "ChunkStorageMetadata",
                          "TensorStorageMetadata", "BytesStorageMetadata",
                          "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how torch pickles a layout: a table look-up
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    ("builtins", "set"), ("builtins", "frozenset"), ("collections", "OrderedDict"),
}


def _refused(who: str, file: str, why: str) -> ValueError:
    return ValueError(f"{who}: {file} was not loaded: {why}")


class _MetadataUnpickler(pickle.Unpickler):
    """Admits the globals of ``_ADMITTED`` and torch's dtypes, nothing else;
    no persistent ids (the base class refuses them)."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ADMITTED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a checkpoint's "
                                     "metadata never holds")


def _check_shape(md: Any) -> str | None:
    """What is wrong with an unpickled metadata's structure, or None."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata, Metadata, MetadataIndex, TensorStorageMetadata)
    if not isinstance(md, Metadata):
        return f"it holds a {type(md).__name__}, not a checkpoint's Metadata"
    if not isinstance(md.state_dict_metadata, dict):
        return "its state_dict_metadata is not a dict"
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(key, str):
            return f"key {key!r} is not a string"
        if isinstance(entry, TensorStorageMetadata):
            if not (isinstance(entry.size, torch.Size)
                    and isinstance(getattr(entry.properties, "dtype", None), torch.dtype)):
                return f"entry {key!r} has no size and dtype"
        elif not isinstance(entry, BytesStorageMetadata):
            return f"entry {key!r} is a {type(entry).__name__}"
    if not isinstance(md.storage_data, dict):
        return "its storage table is not a dict"
    for index, info in md.storage_data.items():
        if not (isinstance(index, MetadataIndex) and isinstance(info, _StorageInfo)):
            return "its storage table holds something other than storage records"
        rel = info.relative_path
        escapes = (not isinstance(rel, str) or os.path.isabs(rel)
                   or ".." in rel.replace("\\", "/").split("/"))
        if escapes or not isinstance(info.offset, int) or not isinstance(info.length, int):
            return f"entry {index.fqn!r} points outside the checkpoint ({rel!r})"
    return None


def read_metadata(path: str, who: str):
    """The ``Metadata`` of the checkpoint in directory `path`, unpickled with
    only a metadata's classes admitted and checked for shape."""
    file = os.path.join(path, ".metadata")
    try:
        with open(file, "rb") as f:
            md = _MetadataUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 -- whatever a bad pickle raises: refused
        raise _refused(who, file, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    problem = _check_shape(md)
    if problem:
        raise _refused(who, file, problem)
    return md


def load_value(data: io.BytesIO, who: str, file: str, key: str):
    """A non-tensor entry unpickled with torch's weights-only unpickler (as
    ``xla_amp.checkpoint.read`` reads a file)."""
    from xla_amp.checkpoint._read import refused_content
    try:
        return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refused(who, f"{file} (entry {key!r})", f"it holds {refused_content(e)}, not "
                       "only tensors and plain data (unpickling it could run code)") from None
    except Exception as e:  # noqa: BLE001 -- weights_only raises several kinds
        lines = [s.strip() for s in str(e).splitlines() if s.strip()]
        why = next((s for s in lines if "unsupported" in s.lower()), None)
        why = why or (lines[0] if lines else type(e).__name__)
        raise _refused(who, f"{file} (entry {key!r})", why) from None


def reader(path: str, metadata):
    """A ``FileSystemReader`` of `path` that hands DCP `metadata` (read above)
    instead of unpickling ``.metadata`` again."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class CheckedReader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            # always the checked one (DCP asks for a per-rank file only
            # when this call fails)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return CheckedReader(path)


def read_values(path: str, metadata, keys: list[str], who: str) -> dict[str, Any]:
    """The non-tensor entries `keys`, read through a DCP reader (so its
    stream transforms apply) and unpickled weights-only."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
    if not keys:
        return {}
    rd = reader(path, metadata)
    rd.set_up_storage_reader(metadata, True)
    zero = torch.Size((0,))
    items = [ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(k),
                      dest_offsets=zero, storage_index=MetadataIndex(k),
                      storage_offsets=zero, lengths=zero) for k in keys]
    out: dict[str, Any] = {}

    class Collect:  # the one planner method read_data calls for bytes
        def load_bytes(self, item, data):
            key = item.dest_index.fqn
            info = metadata.storage_data[item.storage_index]
            out[key] = load_value(data, who, os.path.join(path, info.relative_path), key)

    try:
        rd.read_data(LoadPlan(items), Collect()).wait()
    except (OSError, KeyError) as e:
        raise _refused(who, path, f"a non-tensor entry could not be read ({e})") from None
    return out
