"""How a sharded checkpoint was trained, as plain data next to its
``.metadata``: ``xla_amp_sharded.json``.

    {"format": "xla_amp.sharded checkpoint", "version": 1,
     "versions": {"torch": ..., "torch_xla": ...},
     "devices": 4, "processes": 1,
     "mesh": {"shape": [2, 2], "axis_names": ["data", "fsdp"], "device_ids": [0, 1, 2, 3]},
     "param_dtypes": {"torch.bfloat16": 10, "torch.float32": 4},
     "precision": {ShardedPrecision's fields} | null,
     "optimizer": {"class": "AdamW", "param_groups": [
         {"master_weights": true, "stochastic_rounding": false, "state_dtype": null}]} | null}

and, in a checkpoint that has checksums (saved since they came in),
``"checksums": {"algorithm": "xxh3_64", ".metadata": {"size": ...,
"segments": [...]}}`` (_checksums.py).

JSON, so reading it runs nothing. ``save`` writes it into the version
directory after DCP has written the tensors and ``.metadata`` (a
temporary file, fsync'ed, renamed; the directory fsync'ed, which makes
every name DCP put there durable too) and before the version is
published (_versions.py). ``load`` refuses a checkpoint whose precision
options (``master_weights`` / ``stochastic_rounding`` per param group)
differ from the optimizer's, naming both; a different mesh is allowed --
that is resharding. A checkpoint without a record (written by an older
``save`` or by plain DCP) loads on the tensor checks alone.
"""
from __future__ import annotations

import json
import os
from typing import Any

from xla_amp.checkpoint._files import write_atomic
from xla_amp.checkpoint._record import group_options, mesh_record

FILE = "xla_amp_sharded.json"
FORMAT = "xla_amp.sharded checkpoint"
_OPTIONS = ("master_weights", "stochastic_rounding")


def _mesh(model) -> dict[str, Any] | None:
    """The mesh FSDPv2 was given, else the global mesh, else None (a model
    annotated by hand on a mesh nobody registered)."""
    mesh = getattr(model, "_mesh", None)
    if mesh is None:
        import torch_xla.distributed.spmd as xs
        mesh = xs.get_global_mesh()
    return mesh_record(mesh)


def _precision(model) -> dict[str, Any] | None:
    import dataclasses
    p = getattr(model, "precision", None)
    if p is None or not dataclasses.is_dataclass(p):
        return None
    out = {}
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        out[f.name] = ([c.__qualname__ for c in v] if f.name == "keep"
                       else v if isinstance(v, (bool, str)) or v is None else str(v))
    return out


def describe(model, optimizer) -> dict[str, Any]:
    """The record of a save of `model` and `optimizer` (None: not saved)."""
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    dtypes: dict[str, int] = {}
    for p in model.parameters():
        dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + 1
    opt = None
    if optimizer is not None:
        opt = {"class": type(optimizer).__name__,
               "param_groups": [group_options(g) for g in optimizer.param_groups]}
    return {"format": FORMAT, "version": 1,
            "versions": {"torch": torch.__version__, "torch_xla": torch_xla.__version__},
            "devices": xr.global_runtime_device_count(), "processes": xr.process_count(),
            "mesh": _mesh(model), "param_dtypes": dict(sorted(dtypes.items())),
            "precision": _precision(model), "optimizer": opt}


def write_json(file: str, data: Any) -> None:
    """`data` as JSON in `file`, atomically and durably
    (``xla_amp.checkpoint.write_atomic``: temporary file, fsync, rename,
    directory fsync). Every JSON file of a sharded checkpoint is written so."""
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(file, lambda f: f.write(text.encode()))


def write(path: str, record: dict[str, Any]) -> None:
    """`record` as ``path/FILE`` (:func:`write_json`)."""
    write_json(os.path.join(path, FILE), record)


def read(path: str, who: str) -> dict[str, Any] | None:
    """The record of the checkpoint in `path`; None when it has none."""
    file = os.path.join(path, FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{who}: {file} was not loaded: {str(e).splitlines()[0]}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{who}: {file} was not loaded: not an xla_amp.sharded record")
    return record


def _options_text(opts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={bool(opts.get(k))}" for k in _OPTIONS)


def check_precision(record: dict[str, Any] | None, optimizer, path: str, who: str) -> None:
    """ValueError naming both settings when the checkpoint's optimizer was
    built with other precision options than `optimizer`."""
    saved = (record or {}).get("optimizer")
    if optimizer is None or not isinstance(saved, dict):
        return
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        n = len(groups) if isinstance(groups, list) else "?"
        raise ValueError(f"{who}: the checkpoint in {path} has {n} param group(s), this "
                         f"optimizer {len(optimizer.param_groups)}; nothing was loaded")
    for gi, (then, group) in enumerate(zip(groups, optimizer.param_groups)):
        now = group_options(group)
        if not isinstance(then, dict) or any(bool(then.get(k)) != now[k] for k in _OPTIONS):
            then = then if isinstance(then, dict) else {}
            raise ValueError(
                f"{who}: the checkpoint in {path} was trained with {_options_text(then)} "
                f"(param group {gi}), this optimizer has {_options_text(now)}; build the "
                "optimizer with the checkpoint's options; nothing was loaded")
