"""Reading a checkpoint as data only.

Every checkpoint file xla_amp or its launchers read goes through
:func:`read` (a sharded checkpoint's entries through the same unpickler
and :func:`refused_content`: _sharded_metadata.py): ``torch.load(...,
weights_only=True)``, whose unpickler
builds tensors, numbers, strings, dtypes and containers and refuses any
other global. A file carrying an object that would run code when
unpickled is refused with one line naming the path and the object; the
object is never built, so its code never runs.

A file that carries checksums (every one ``save`` writes) is verified
here, before anything is returned (``_integrity``): a mismatch is one line
of :class:`CheckpointDamaged`, as is a file torch cannot read at all.
"""
from __future__ import annotations

import errno
import os
import pickle
import re
from typing import Any

from xla_amp.checkpoint import _integrity
from xla_amp.checkpoint._errors import CheckpointDamaged, CheckpointError, os_reason

_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL)\s+(\S+)", re.I)
_OPCODE = re.compile(r"Unsupported operand (\S+)")


def read(path: str | os.PathLike, *, what: str = "checkpoint") -> Any:
    """The object in `path`, loaded on the CPU as data only and checked
    against the checksums it carries (returned without that entry). Raises
    :class:`CheckpointError` (one line naming `path`) for a missing or
    unreadable file and a file that holds anything but tensors and plain
    data; :class:`CheckpointDamaged` for a file that is not a torch
    checkpoint or does not match its checksums (`what` names the file's
    role in the messages: ``"--resume file"``). A file without checksums
    (written before they existed) is returned unverified."""
    path = os.fspath(path)
    hashes = _integrity.StorageHashes() if _integrity.enabled else None
    try:
        obj = _load(path, what, hashes)
        if isinstance(obj, dict) and _integrity.KEY in obj:
            if hashes is None:
                obj.pop(_integrity.KEY)
            else:
                _integrity.verify(obj, path, what, hashes)
        return obj
    finally:
        if hashes is not None:
            hashes.close()


def _load(path: str, what: str, hashes) -> Any:
    import torch
    try:
        return torch.load(path, map_location=hashes or "cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        culprit = refused_content(e)
        if _pickle_record_damaged(path):   # a flipped byte, not someone's object
            raise CheckpointDamaged(f"{what} {path} is damaged: its pickle record fails the "
                                    f"zip's CRC-32 or headers (read as {culprit}); it was not "
                                    "loaded") from None
        raise CheckpointError(
            f"refused {what} {path}: it holds {culprit}, not only tensors and plain data; "
            "it was not loaded (unpickling it could run code)") from None
    except OSError as e:
        if e.errno == errno.EINVAL and os.path.isfile(path):   # torch's zip reader, torn file
            raise CheckpointDamaged(f"{what} {path} is not a readable torch checkpoint (its zip "
                                    f"structure is torn: {os_reason(e)}); it was not loaded"
                                    ) from None
        error = CheckpointDamaged if e.errno == errno.EIO else CheckpointError
        raise error(f"cannot read {what} {path}: {os_reason(e)}") from None
    except Exception as e:  # noqa: BLE001 - truncated, not torch's, garbled: one line
        first = f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:200]
        raise CheckpointDamaged(f"{what} {path} is not a readable torch checkpoint "
                                f"({first}); it was not loaded") from None


def refused_content(e: Exception) -> str:
    """What the weights-only unpickler refused, from its error:
    ``"the object posix.system"``, the opcode, or ``"an object"``."""
    g, op = _GLOBAL.search(str(e)), _OPCODE.search(str(e))
    return (f"the object {g.group(1).rstrip('.,')}" if g else
            f"pickle code the data-only reader refuses (opcode {op.group(1)})" if op
            else "an object")


def _pickle_record_damaged(path: str) -> bool:
    """Is the torch zip at `path` inconsistent where its pickle record is:
    the record fails the CRC-32 the zip holds for it (torch.load never
    checks it), or its header disagrees with the zip's directory? False
    for a file that is no zip (a raw pickle) and for an intact record.
    Only a stored record is read, as torch writes it: nothing is
    decompressed."""
    import zipfile
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            info = next((i for i in z.infolist() if i.filename.endswith("data.pkl")), None)
            if info is not None and info.compress_type == zipfile.ZIP_STORED:
                z.read(info)
    except (zipfile.BadZipFile, EOFError, ValueError, OSError):
        return True
    return False
