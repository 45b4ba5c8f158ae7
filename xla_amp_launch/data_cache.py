"""Prepared data kept on disk between runs, so that a launcher's start does
not redo (or import what redoes) the preparation.

    cached(name, key, make):
        path = cache folder / f"{name}-{sha256(key)[:16]}.pt"
        if path reads back (weights_only) as a dict of tensors whose
           "_key" entry is key:          return it
        data = make()                    # a dict of tensors
        write {**data, "_key": key} atomically   # xla_amp.checkpoint.write_atomic:
                                                 # readers see all or nothing
        return data

The folder is ``$XLA_AMP_CACHE``, else ``$XDG_CACHE_HOME/xla_amp``, else
``~/.cache/xla_amp``. The key names everything the data depends on (the
source's version, the arguments, torch's version); a file that is
unreadable, truncated, or made for another key is made again and replaced.
A folder that cannot be written costs only the saving: the data is
returned all the same, and the reason goes to the debug log.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Callable

import torch

log = logging.getLogger(__name__)


def folder() -> str:
    """Where cached data lives (see the module docstring)."""
    explicit = os.environ.get("XLA_AMP_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xla_amp")


def cached(name: str, key: dict, make: Callable[[], dict[str, torch.Tensor]]
           ) -> dict[str, torch.Tensor]:
    """``make()``'s tensors for ``key`` (JSON-able), from the cache when a
    file made for the same key is there, else made and written to it."""
    text = json.dumps(key, sort_keys=True)
    path = os.path.join(folder(), f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.pt")
    found = _read(path, text)
    if found is not None:
        return found
    data = make()
    _write(path, {**data, "_key": text})
    return data


def _read(path: str, text: str) -> dict[str, torch.Tensor] | None:
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 -- any unreadable file is made again
        log.debug("data cache: %s unreadable (%s); making it again", path, e)
        return None
    if (not isinstance(data, dict) or data.pop("_key", None) != text
            or not all(isinstance(v, torch.Tensor) for v in data.values())):
        log.debug("data cache: %s holds other data; making it again", path)
        return None
    return data


def _write(path: str, data: dict) -> None:
    """``data`` at ``path`` through the checkpoints' atomic write (a
    temporary beside it, fsynced, renamed; the file mode open() would give);
    imported here, on a miss only: it imports xla_amp."""
    from xla_amp.checkpoint import CheckpointError, write_atomic
    try:
        write_atomic(path, lambda f: torch.save(data, f))
    except CheckpointError as e:
        log.debug("data cache: %s; not cached", e)
