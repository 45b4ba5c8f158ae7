"""Resuming a sharded checkpoint in another precision mode: the single-file
conversion (``_convert``, through ``_state.restore``) on the sharded
format.

A sharded load normally reads each entry straight into the live tensor of
the same dtype. When the checkpoint's training record (``"training"``,
_record.py) and the objects given differ in precision -- an entry's dtype,
a param group's ``master_weights`` / ``stochastic_rounding``, the scaler
on in one run only -- the load goes this way instead::

    read      every entry under the objects given, as saved: each tensor
              into a new one of the saved shape and dtype, sharded like
              the live tensor it belongs to (so each device reads its own
              chunks; any mesh); checksums of those reads checked first
    convert   _state.restore(those state dicts + the record): ``convert``
              makes them fit the objects (exactly, or refuses in one line
              naming both modes), every model entry is checked, then each
              object's own load_state_dict takes its part

Nothing live changes before ``convert`` and the checks have passed. A
checkpoint without the record's ``"training"`` (saved before conversion
came in) is never converted: it loads into its own mode only.
"""
from __future__ import annotations

from typing import Any

import torch

_FLAGS = ("master_weights", "stochastic_rounding")


def needed(saved: dict | None, target: dict, given: dict) -> bool:
    """Whether the training record `saved` (None: none) and `target` (that
    of the objects `given`) differ in precision where an object is given: a
    model entry's dtype, an optimizer group's options, the scaler on in one
    run only."""
    if not isinstance(saved, dict) or not isinstance(saved.get("dtypes"), dict):
        return False
    if any(saved["dtypes"].get(k, v) != v for k, v in target["dtypes"].items()):
        return True
    if "scaler" in given and bool(saved.get("scaler")) != bool(target["scaler"]):
        return True
    then, now = saved.get("groups") or [], target["groups"]
    return "optimizer" in given and len(then) == len(now) and any(
        bool(a.get(k)) != bool(b.get(k)) for a, b in zip(then, now) for k in _FLAGS)


def _home(key: str, live_model: dict, params: list):
    """The live tensor a checkpoint entry belongs to (its sharding), or None."""
    top, _, rest = key.partition(".")
    if top == "model":
        return live_model.get(rest)
    if top == "optimizer" and rest.startswith("state."):
        i = rest.split(".")[1]
        return params[int(i)] if i.isdigit() and int(i) < len(params) else None
    return None


def read_as_saved(metadata, objects: dict[str, Any], device) -> dict[str, torch.Tensor]:
    """A new tensor for each tensor entry of the checkpoint under the objects
    given, of its saved shape and dtype, sharded like its live tensor."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from xla_amp.syncfree._sharding import follow
    live_model = objects["model"].state_dict()
    optimizer = objects.get("optimizer")
    params = [] if optimizer is None else [p for g in optimizer.param_groups
                                           for p in g["params"]]
    out = {}
    for key, md in metadata.state_dict_metadata.items():
        if key.split(".", 1)[0] not in objects or not isinstance(md, TensorStorageMetadata):
            continue
        t = torch.zeros(tuple(md.size), dtype=md.properties.dtype, device=device)
        home = _home(key, live_model, params)
        if home is not None and home.shape == t.shape:
            follow(home, {"t": t})
        out[key] = t
    return out


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """DCP's flat keys back into the state dicts the objects take."""
    state: dict[str, Any] = {}
    for key, v in flat.items():
        top, _, rest = key.partition(".")
        if top == "model":
            state.setdefault("model", {})[rest] = v
        elif top == "optimizer":
            opt = state.setdefault("optimizer", {"state": {}})
            if rest.startswith("state."):
                _, i, name = rest.split(".", 2)
                opt["state"].setdefault(int(i), {})[name] = v
            else:
                opt[rest] = v
        elif top == "scaler":
            if rest:
                state.setdefault("scaler", {})[rest] = v
            else:
                state["scaler"] = v
    return state


def restore(values: dict[str, Any], saved: dict, objects: dict[str, Any],
            allow_rounding: bool, where: str, who: str) -> list[str]:
    """The entries read (`values`, flat) into the objects, converted from the
    mode of the training record `saved` to theirs; the conversions made.
    CheckpointError (one line naming both modes) before anything changes
    when a value would be lost."""
    from xla_amp.checkpoint._errors import CheckpointError
    from xla_amp.checkpoint._state import restore as restore_state
    model = objects["model"]
    state = dict(nested(values), record=saved)
    state.setdefault("optimizer", None)
    state.setdefault("scaler", {})
    amp = getattr(getattr(model, "precision", None), "compute_dtype", None)
    try:
        return restore_state(state, model=model, optimizer=objects.get("optimizer"),
                             scaler=objects.get("scaler"), amp_dtype=amp,
                             allow_rounding=allow_rounding)
    except CheckpointError as e:
        raise CheckpointError(f"{who}: {where}: {e}; nothing was loaded") from None
