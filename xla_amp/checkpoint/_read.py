"""Reading a checkpoint as data only.

Every checkpoint file xla_amp or its launchers read goes through
:func:`read`: ``torch.load(..., weights_only=True)``, whose unpickler
builds tensors, numbers, strings, dtypes and containers and refuses any
other global. A file carrying an object that would run code when
unpickled is refused with one line naming the path and the object; the
object is never built, so its code never runs.
"""
from __future__ import annotations

import os
import pickle
import re
from typing import Any

from xla_amp.checkpoint._errors import CheckpointError, os_reason

_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL)\s+(\S+)", re.I)
_OPCODE = re.compile(r"Unsupported operand (\S+)")


def read(path: str | os.PathLike, *, what: str = "checkpoint") -> Any:
    """The object in `path`, loaded on the CPU as data only. Raises
    :class:`CheckpointError` (one line naming `path`) for a missing or
    unreadable file, a file that is not a torch checkpoint, and a file that
    holds anything but tensors and plain data (`what` names the file's role
    in the messages: ``"--resume file"``)."""
    import torch
    path = os.fspath(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        g, op = _GLOBAL.search(str(e)), _OPCODE.search(str(e))
        culprit = (f"the object {g.group(1).rstrip('.,')}" if g else
                   f"pickle code the data-only reader refuses (opcode {op.group(1)})" if op
                   else "an object")
        raise CheckpointError(
            f"refused {what} {path}: it holds {culprit}, not only tensors and plain data; "
            "it was not loaded (unpickling it could run code)") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {what} {path}: {os_reason(e)}") from None
    except Exception as e:  # noqa: BLE001 - truncated, not torch's, garbled: one line
        first = f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{what} {path} is not a readable torch checkpoint "
                              f"({first})") from None
