"""Checkpoints of model, optimizer, scaler and data position, written atomically
and checked against the run's configuration on resume."""
from __future__ import annotations

import os


def _to_cpu(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu() if obj.device.type != "cpu" else obj
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save_checkpoint(path: str, model, optimizer, scaler, position: dict, compat: dict) -> None:
    import torch
    state = {
        "format": "xla_amp-launcher-checkpoint/1",
        "model": _to_cpu(model.state_dict()),
        "optimizer": _to_cpu(optimizer.state_dict()),
        "scaler": scaler.state_dict(),
        "position": dict(position),
        "compat": dict(compat),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)   # a crash mid-save never leaves a torn checkpoint


def load_checkpoint(path: str, compat: dict) -> dict:
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets one message
        raise SystemExit(f"error: --resume {path!r} is not a readable checkpoint ({e})")
    if not isinstance(state, dict) or state.get("format") != "xla_amp-launcher-checkpoint/1":
        raise SystemExit(f"error: --resume {path!r} is not a checkpoint written by these "
                         "launchers (--checkpoint)")
    diffs = [f"--{k}={state['compat'].get(k)!r} there, --{k}={v!r} here"
             for k, v in compat.items() if state["compat"].get(k) != v]
    if diffs:
        raise SystemExit(f"error: --resume {path!r} was written by a different "
                         f"configuration: {'; '.join(diffs)}")
    return state
