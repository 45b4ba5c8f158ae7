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
"""
from __future__ import annotations

from typing import Any, Optional

import torch

FORMAT = 1


def dtype_name(dtype: Optional[torch.dtype]) -> Optional[str]:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def mesh_record(mesh) -> Optional[dict]:
    """An SPMD mesh (``torch_xla.distributed.spmd.Mesh``) as plain data."""
    if mesh is None:
        return None
    return {"shape": [int(n) for n in mesh.mesh_shape],
            "axis_names": [str(a) for a in (mesh.axis_names or ())],
            "device_ids": [int(d) for d in mesh.device_ids]}


# The param-group keys of xla_amp.syncfree's low-precision options (bf16
# master weights, stochastic rounding, state dtype): here, in the core, so
# that a checkpoint's record needs no engine.
LOW_PRECISION_KEYS = ("master_weights", "stochastic_rounding", "state_dtype")


def group_options(group: dict) -> dict[str, Any]:
    """A param group's low-precision options (LOW_PRECISION_KEYS), as plain
    data; a group without them (torch.optim, a default group) has neither:
    flags False, state_dtype None."""
    return {k: dtype_name(group.get(k)) if k == "state_dtype" else bool(group.get(k, False))
            for k in LOW_PRECISION_KEYS}


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
        "scaler": bool(scaler is not None and scaler.is_enabled()),
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
        if any(g["master_weights"] for g in record["groups"]):
            weights += " + fp32 master"
        elif any(g["stochastic_rounding"] for g in record["groups"]):
            weights += " + stochastic rounding"
    amp = record.get("amp_dtype")
    text = weights + (f", AMP {amp}" if amp else ", no autocast")
    return text + (" + GradScaler" if record.get("scaler") else "")
