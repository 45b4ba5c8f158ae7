"""How a run was trained, as plain data saved inside its checkpoint, so
that a resume under another precision mode can convert or refuse
knowingly (``_convert.py``) instead of letting ``copy_`` round silently.

    record = training_record(model, optimizer, scaler, amp_dtype=torch.bfloat16)
    {"format": 1,
     "dtypes": {"fc.weight": "bfloat16", "bn.running_mean": "float32", ...},
     "optimizer": "AdamW",
     "optimizer_params": ["fc.weight", "fc.bias", ...],     # optimizer order
     "groups": [{"params": 12, "master_weights": True,
                 "stochastic_rounding": False, "state_dtype": None}],
     "amp_dtype": "bfloat16",                                # None: no autocast
     "scaler": True,                                         # GradScaler enabled
     "mesh": {"shape": [4], "axis_names": ["fsdp"]}}        # None: one device

Everything is read off the objects themselves (never off flags), so a new
option of theirs shows in the record where it changes a dtype.

A sharded checkpoint keeps its record as plain JSON next to DCP's
``.metadata``, in each version directory (``sharded_record``, FILE)::

    {"format": "xla_amp.sharded checkpoint", "version": 1,
     "versions": {"torch": ..., "torch_xla": ...},
     "devices": 4, "processes": 1,
     "mesh": {"shape": [2, 2], "axis_names": ["data", "fsdp"], "device_ids": [0, 1, 2, 3]},
     "param_dtypes": {"torch.bfloat16": 10, "torch.float32": 4},
     "precision": {ShardedPrecision's fields} | null,
     "optimizer": {"class": "AdamW", "param_groups": [
         {"master_weights": true, "stochastic_rounding": false, "state_dtype": null}]} | null,
     "training": training_record(...)}     # since conversion; older ones lack it

and, in a checkpoint that has checksums, ``"checksums": {"algorithm":
"xxh3_64", ".metadata": {"size": ..., "segments": [...]}}``
(_sharded_checksums.py). Reading it runs nothing. A sharded checkpoint
without a record (an older ``save``, plain DCP) loads on the tensor checks
alone; one without ``"training"`` loads into the precision mode it was
saved in only (``check_precision``).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

FORMAT = 1


def dtype_name(dtype: Optional[torch.dtype]) -> Optional[str]:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def tensor_text(size, dtype) -> str:
    """``"[8, 4] bfloat16"``: a tensor's shape and dtype, as every refusal of
    a checkpoint entry names them."""
    return f"{list(size)} {dtype_name(dtype)}"


def mesh_record(mesh) -> Optional[dict]:
    """An SPMD mesh (``torch_xla.distributed.spmd.Mesh``) as plain data."""
    if mesh is None:
        return None
    return {"shape": [int(n) for n in mesh.mesh_shape],
            "axis_names": [str(a) for a in (mesh.axis_names or ())],
            "device_ids": [int(d) for d in mesh.device_ids]}


def _optimizer_options() -> dict[str, Any]:
    """The optimizer's low-precision options and their values in a group
    without them, as xla_amp.syncfree defines them; none where it cannot be
    imported (no torch_xla: no such optimizer exists)."""
    try:
        from xla_amp.syncfree._low_precision import DEFAULTS
    except ImportError:
        return {}
    return DEFAULTS


def group_options(group: dict) -> dict[str, Any]:
    """A param group's low-precision options, as plain data; a group without
    them (torch.optim, a default group) has their defaults: flags False,
    state_dtype None."""
    return {k: bool(group.get(k, d)) if isinstance(d, bool) else dtype_name(group.get(k, d))
            for k, d in _optimizer_options().items()}


def training_record(model: torch.nn.Module, optimizer=None, scaler=None, *,
                    amp_dtype: Optional[torch.dtype] = None, mesh=None) -> dict[str, Any]:
    """The record of `model`, `optimizer` (None: no optimizer state) and
    `scaler` as they are now; `amp_dtype` is the autocast dtype the run
    computes in (None: no autocast), `mesh` its SPMD mesh (None: one device
    or plain data parallel). ValueError if the optimizer holds a tensor
    that is not one of the model's parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    order: list[str] = []
    groups: list[dict] = []
    if optimizer is not None:
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                if id(p) not in names:
                    from xla_amp._param_walk import where
                    raise ValueError(f"training_record: {where(gi, pi)} of the optimizer is "
                                     "not a parameter of the model")
                order.append(names[id(p)])
            groups.append({"params": len(group["params"]), **group_options(group)})
    return {
        "format": FORMAT,
        "dtypes": {k: dtype_name(v.dtype) for k, v in model.state_dict().items()
                   if isinstance(v, torch.Tensor)},
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "optimizer_params": order,
        "groups": groups,
        "amp_dtype": dtype_name(amp_dtype),
        "scaler": bool(scaler is not None and getattr(scaler, "is_enabled", lambda: True)()),
        "mesh": mesh_record(mesh),
    }


def infer_record(state: dict, model: torch.nn.Module) -> dict[str, Any]:
    """The record of a checkpoint saved without one, read off its own
    contents: dtypes from its model state dict, the optimizer's parameter
    names from its groups (``param_names``, else `model`'s order), the
    group options it saved, the scaler on if its state is non-empty. The
    autocast dtype and the mesh are unknown (None)."""
    opt = state.get("optimizer") or {"param_groups": []}
    model_names = [n for n, _ in model.named_parameters()]
    order: list[str] = []
    groups = []
    for g in opt["param_groups"]:
        order += list(g.get("param_names") or model_names[len(order):len(order) + len(g["params"])])
        groups.append({"params": len(g["params"]), **group_options(g)})
    return {"format": FORMAT,
            "dtypes": {k: dtype_name(v.dtype) for k, v in state["model"].items()
                       if isinstance(v, torch.Tensor)},
            "optimizer": None, "optimizer_params": order, "groups": groups,
            "amp_dtype": None, "scaler": bool(state.get("scaler")), "mesh": None}


def group_of(record: dict, index: int) -> dict:
    """The group options of the optimizer's `index`-th parameter."""
    for group in record["groups"]:
        if index < group["params"]:
            return group
        index -= group["params"]
    raise IndexError(index)


def is_low(name: Optional[str]) -> bool:
    """A floating dtype narrower than float32 (by its name)."""
    dtype = getattr(torch, name or "", None)
    return (isinstance(dtype, torch.dtype) and dtype.is_floating_point
            and torch.finfo(dtype).bits < 32)


def mode_name(record: dict) -> str:
    """``"bf16 weights + fp32 master, AMP bfloat16"``: the precision mode in words."""
    params = record["optimizer_params"] or list(record["dtypes"])
    low = sorted(d for d in {record["dtypes"][n] for n in params} if is_low(d))
    if not low:
        weights = "fp32 weights"
    else:
        weights = "/".join(d.replace("bfloat16", "bf16").replace("float16", "fp16")
                           for d in low) + " weights"
        if any(g.get("master_weights") for g in record["groups"]):
            weights += " + fp32 master"
        elif any(g.get("stochastic_rounding") for g in record["groups"]):
            weights += " + stochastic rounding"
    amp = record.get("amp_dtype")
    text = weights + (f", AMP {amp}" if amp else ", no autocast")
    return text + (" + GradScaler" if record.get("scaler") else "")


FILE = "xla_amp_sharded.json"
SHARDED_FORMAT = "xla_amp.sharded checkpoint"
_FLAGS = ("master_weights", "stochastic_rounding")


def _model_mesh(model):
    """The mesh FSDPv2 was given, else the global mesh, else None (a model
    annotated by hand on a mesh nobody registered)."""
    mesh = getattr(model, "_mesh", None)
    if mesh is None:
        import torch_xla.distributed.spmd as xs
        mesh = xs.get_global_mesh()
    return mesh


def _precision(model) -> Optional[dict[str, Any]]:
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


def sharded_training(model, optimizer, scaler=None) -> dict[str, Any]:
    """:func:`training_record` of a sharded run: its mesh, and as autocast
    dtype the ``shard_model`` wrapper's compute dtype (None otherwise)."""
    amp_dtype = getattr(getattr(model, "precision", None), "compute_dtype", None)
    return training_record(model, optimizer, scaler, amp_dtype=amp_dtype,
                           mesh=_model_mesh(model))


def sharded_record(model, optimizer, scaler=None) -> dict[str, Any]:
    """The record of a sharded save of `model`, `optimizer` and `scaler`
    (None: not saved)."""
    import torch_xla
    import torch_xla.runtime as xr
    training = sharded_training(model, optimizer, scaler)
    dtypes: dict[str, int] = {}
    for p in model.parameters():
        dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + 1
    opt = None if optimizer is None else {
        "class": training["optimizer"],
        "param_groups": [{k: v for k, v in g.items() if k != "params"}
                         for g in training["groups"]]}
    return {"format": SHARDED_FORMAT, "version": 1,
            "versions": {"torch": torch.__version__, "torch_xla": torch_xla.__version__},
            "devices": xr.global_runtime_device_count(), "processes": xr.process_count(),
            "mesh": training["mesh"], "param_dtypes": dict(sorted(dtypes.items())),
            "precision": _precision(model), "optimizer": opt, "training": training}


def read_sharded(path: str, who: str) -> Optional[dict[str, Any]]:
    """The record of the sharded checkpoint in directory `path`; None when it
    has none. ValueError (one line naming the file) for anything else."""
    import json
    import os
    file = os.path.join(path, FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{who}: {file} was not loaded: {str(e).splitlines()[0]}") from None
    if not isinstance(record, dict) or record.get("format") != SHARDED_FORMAT:
        raise ValueError(f"{who}: {file} was not loaded: not an xla_amp.sharded record")
    return record


def _options_text(opts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={bool(opts.get(k))}" for k in _FLAGS)


def check_precision(record: Optional[dict[str, Any]], optimizer, path: str, who: str) -> None:
    """ValueError naming both settings when the sharded checkpoint's optimizer
    was built with other precision options than `optimizer` (a record
    without ``"training"``, which cannot be converted)."""
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
        if not isinstance(then, dict) or any(bool(then.get(k)) != bool(now.get(k))
                                             for k in _FLAGS):
            then = then if isinstance(then, dict) else {}
            raise ValueError(
                f"{who}: the checkpoint in {path} was trained with {_options_text(then)} "
                f"(param group {gi}), this optimizer has {_options_text(now)}; build the "
                "optimizer with the checkpoint's options; nothing was loaded")
