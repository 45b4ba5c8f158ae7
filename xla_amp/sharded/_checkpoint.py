"""``xla_amp.sharded.save`` / ``load``: the sharded checkpoint format of
``xla_amp.checkpoint`` (xla_amp/checkpoint/sharded.py, where the lock,
versions, checksums, record and checks are), after the check that the
launch's processes are the runtime's (_topology)."""
from __future__ import annotations

import os

from xla_amp.checkpoint import sharded as _format
from xla_amp.sharded._topology import check_processes


def save(path: str | os.PathLike, *, model, optimizer=None, scaler=None,
         keep: int = 1, extra: dict | None = None) -> None:
    check_processes("xla_amp.sharded.save")
    _format.save(path, model=model, optimizer=optimizer, scaler=scaler, keep=keep, extra=extra)


def load(path: str | os.PathLike, *, model, optimizer=None, scaler=None,
         allow_rounding: bool = False) -> dict:
    check_processes("xla_amp.sharded.load")
    return _format.load(path, model=model, optimizer=optimizer, scaler=scaler,
                        allow_rounding=allow_rounding)


save.__doc__ = _format.save.__doc__
load.__doc__ = _format.load.__doc__
