"""Validation of GradScaler settings, shared by the constructor, the setters,
``update(new_scale)`` and load_state_dict: every value is checked before any
is set, and a bad one raises ValueError naming it.

Invariants: every number finite; scale > 0; growth_factor > 1 >
backoff_factor > 0; growth_interval an int >= 1; min_scale None or
0 < min_scale <= scale; the tracker and the skip count ints >= 0."""
from __future__ import annotations

import math
from typing import Optional

import torch

from xla_amp import _devices

STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
               "_growth_tracker", "min_scale", "_skipped_steps")


def _number(name: str, value, who: str, shown: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not (isinstance(value, torch.Tensor) and value.numel() == 1
                and value.device.type == "cpu"):
            raise ValueError(f"{who}: {shown} must be a number, got {value!r}")
        value = value.item()
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{who}: {shown} must be finite, got {value}")
    return value


def _count(name: str, value, who: str, shown: str, minimum: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type == "cpu" \
            and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{who}: {shown} must be an int >= {minimum}, got {value!r}")
    return value


def checked(values: dict, who: str, shown: Optional[dict] = None) -> dict:
    """Validated copies of GradScaler settings; raises ValueError naming the
    first bad one (as `shown` names it) before the caller sets anything."""
    shown = shown or {}
    out = {}
    for name, value in values.items():
        label = shown.get(name, name)
        if name in ("growth_interval",):
            out[name] = _count(name, value, who, label, 1)
        elif name in ("_growth_tracker", "_skipped_steps"):
            out[name] = _count(name, value, who, label, 0)
        elif name == "min_scale" and value is None:
            out[name] = None
        else:
            v = _number(name, value, who, label)
            if name == "growth_factor" and not v > 1.0:
                raise ValueError(f"{who}: {label} must be > 1.0, got {v}")
            if name == "backoff_factor" and not 0.0 < v < 1.0:
                raise ValueError(f"{who}: {label} must be in (0, 1), got {v}")
            if name in ("init_scale", "min_scale") and not v > 0.0:
                raise ValueError(f"{who}: {label} must be > 0, got {v}")
            out[name] = v
    floor, scale = out.get("min_scale"), out.get("init_scale")
    if floor is not None and scale is not None and floor > scale:
        raise ValueError(
            f"{who}: min_scale ({floor:g}) must not exceed {shown.get('init_scale', 'init_scale')}"
            f" ({scale:g}): below its floor the scale could never back off, and every "
            "overflowing step would be skipped at that scale for good")
    return out


def new_scale(value, min_scale: Optional[float]):
    """``GradScaler.update(new_scale)``'s argument: a float, checked as
    ``init_scale`` is (finite, > 0, not below `min_scale`), or a 1-element
    tensor with requires_grad=False, taken as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return checked({"init_scale": value, "min_scale": min_scale}, "GradScaler.update",
                       {"init_scale": "new_scale"})["init_scale"]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
        return value
    raise ValueError("GradScaler.update: new_scale must be a float or a 1-element tensor "
                     f"with requires_grad=False, got {value!r}")


def on_engine_device(device: torch.device, what: str) -> None:
    """ValueError unless `device` is one an xla_amp engine drives."""
    if device.type != "xla" and not _devices.is_engine_type(device.type):
        raise ValueError(f"GradScaler: {what} is on '{device}', not on an XLA device; use "
                         "torch.amp.GradScaler for other devices")
