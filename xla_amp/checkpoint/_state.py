"""Whole-run checkpoints: model, optimizer, scaler, the training record and
anything else the loop keeps, in one file written by ``_files`` and read
by ``_read``, with a checksum of every tensor and of the rest
(``_integrity``) written in and verified on reading.

    save(path, model=model, optimizer=opt, scaler=scaler, amp_dtype=torch.bfloat16,
         extra={"step": step}, keep=3)                    # between steps
    state = load(path)                                    # data only
    notes = restore(state, model=model, optimizer=opt, scaler=scaler,
                    amp_dtype=torch.bfloat16)             # converts or refuses

``restore`` checks everything before it changes anything: the record
against the objects (``_convert``), then every model entry's name, shape
and dtype; the optimizer's own ``load_state_dict`` checks its part before
loading; the model and scaler follow.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

from xla_amp.checkpoint import _integrity
from xla_amp.checkpoint._convert import convert
from xla_amp.checkpoint._errors import CheckpointError
from xla_amp.checkpoint._files import write_atomic
from xla_amp.checkpoint._read import read
from xla_amp.checkpoint._record import tensor_text, training_record

FORMAT = "xla_amp-checkpoint/1"


def to_cpu(obj):
    """`obj` with every tensor copied to the host (one read per tensor)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu() if obj.device.type != "cpu" else obj
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [to_cpu(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def snapshot(model, optimizer=None, scaler=None, *, amp_dtype=None, mesh=None,
             extra: Optional[dict] = None, format: str = FORMAT) -> dict[str, Any]:
    """The state to save, on the host (`extra`'s tensors too): call between
    steps (after ``torch_xla.sync()``)."""
    state = {"format": format,
             "model": to_cpu(model.state_dict()),
             "optimizer": None if optimizer is None else to_cpu(optimizer.state_dict()),
             "scaler": {} if scaler is None else scaler.state_dict(),
             "record": training_record(model, optimizer, scaler, amp_dtype=amp_dtype,
                                       mesh=mesh)}
    state.update(to_cpu(dict(extra or {})))
    return state


def save(path: str | os.PathLike, *, model, optimizer=None, scaler=None, amp_dtype=None,
         mesh=None, extra: Optional[dict] = None, keep: int = 1,
         format: str = FORMAT) -> None:
    """Write the run's state to `path` atomically (``_files.write_atomic``),
    keeping ``keep - 1`` older versions. `extra`: more plain data (the data
    position, the step). The file carries a checksum of every tensor and of
    the rest (``_integrity``), taken from the host copies it writes.
    :class:`CheckpointError` (one line) on any OS failure; the previous
    checkpoint is then intact."""
    state = snapshot(model, optimizer, scaler, amp_dtype=amp_dtype, mesh=mesh, extra=extra,
                     format=format)
    if _integrity.enabled:
        state = _integrity.with_checksums(state)
    write_atomic(path, lambda f: torch.save(state, f), keep=keep)


def load(path: str | os.PathLike, *, format: str | tuple[str, ...] = FORMAT,
         what: str = "checkpoint") -> dict:
    """The state in `path`, read as data only and verified against its
    checksums (``_read.read``; a file from before checksums is not
    verified); :class:`CheckpointError` unless it is a checkpoint of
    `format` (one of them, for a tuple), :class:`CheckpointDamaged` when
    it does not match its checksums or cannot be read as a checkpoint."""
    formats = (format,) if isinstance(format, str) else tuple(format)
    state = read(path, what=what)
    if not isinstance(state, dict) or state.get("format") not in formats:
        raise CheckpointError(f"{what} {os.fspath(path)} is not an xla_amp checkpoint "
                              f"({' or '.join(formats)})")
    return state


def _check_model(saved: dict, model: torch.nn.Module) -> None:
    here = model.state_dict()
    missing = [k for k in here if k not in saved]
    unexpected = [k for k in saved if k not in here]
    if missing or unexpected:
        raise CheckpointError("the checkpoint's model does not fit this one: "
                              + (f"missing {missing[:3]}" if missing else "")
                              + ("; " if missing and unexpected else "")
                              + (f"unexpected {unexpected[:3]}" if unexpected else ""))
    for k, v in here.items():
        s = saved[k]
        if isinstance(v, torch.Tensor) and (not isinstance(s, torch.Tensor)
                                            or s.shape != v.shape or s.dtype != v.dtype):
            got = (tensor_text(s.shape, s.dtype) if isinstance(s, torch.Tensor)
                   else type(s).__name__)
            raise CheckpointError(f"the checkpoint's {k} is {got}, this model's is "
                                  f"{tensor_text(v.shape, v.dtype)}")


def restore(state: dict, *, model, optimizer=None, scaler=None, amp_dtype=None,
            allow_rounding: bool = False) -> list[str]:
    """Load `state` into the objects, converting between precision modes
    (``_convert``); returns what was converted. Refusals raise
    :class:`CheckpointError` (or the optimizer's ``ValueError``) before
    anything changes."""
    target = training_record(model, optimizer, scaler, amp_dtype=amp_dtype)
    state, notes = convert(state, target, allow_rounding=allow_rounding)
    _check_model(state["model"], model)
    if optimizer is not None:
        if state.get("optimizer") is None:
            raise CheckpointError("the checkpoint holds no optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    model.load_state_dict(state["model"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    return notes
