"""The loss scaler's state dict, for GradScaler and torchax's LossScaler
alike: ``torch.amp.GradScaler``'s format (``scale``, ``growth_factor``,
``backoff_factor``, ``growth_interval``, ``_growth_tracker``) plus
``min_scale`` and ``_skipped_steps``. `write` builds one; `read` checks one
(a dict of ours or torch.amp's: no floor, no skip count -> None and 0) and
returns its values, raising before the caller sets anything."""
from __future__ import annotations

from typing import Any, Optional

from xla_amp.scaler._checks import STATE_KEYS, checked

REQUIRED = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def write(scale: float, growth_factor: float, backoff_factor: float, growth_interval: int,
          growth_tracker: int, min_scale: Optional[float], skipped: int) -> dict[str, Any]:
    return {"scale": scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
            "growth_interval": growth_interval, "_growth_tracker": growth_tracker,
            "min_scale": min_scale, "_skipped_steps": skipped}


def read(state_dict, who: str) -> dict[str, Any]:
    """The checked values of `state_dict`, keyed as GradScaler's arguments
    (``init_scale`` for the scale) and ``_growth_tracker`` /
    ``_skipped_steps``; ValueError (RuntimeError for an empty dict, as
    torch's) naming the first bad field."""
    if not isinstance(state_dict, dict):
        raise ValueError(f"{who}: expected a dict, got {type(state_dict).__name__}")
    if len(state_dict) == 0:
        raise RuntimeError("The source state dict is empty, possibly because it was saved "
                           "from a disabled instance of GradScaler.")
    missing = [k for k in REQUIRED if k not in state_dict]
    if missing:
        raise ValueError(f"{who}: missing keys {missing}")
    unknown = sorted(set(state_dict) - set(STATE_KEYS))
    if unknown:
        raise ValueError(f"{who}: unknown keys {unknown}")
    return checked({"init_scale": state_dict["scale"],
                    "growth_factor": state_dict["growth_factor"],
                    "backoff_factor": state_dict["backoff_factor"],
                    "growth_interval": state_dict["growth_interval"],
                    "min_scale": state_dict.get("min_scale"),
                    "_growth_tracker": state_dict["_growth_tracker"],
                    "_skipped_steps": state_dict.get("_skipped_steps", 0)},
                   who, {"init_scale": "scale"})
