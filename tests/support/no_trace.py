"""What a skipped step must leave alone, derived from the objects' own
state: every tensor in the model's state_dict (parameters, buffers, fp8
histories, pending amaxes and scales) and in the optimizer's state_dict
(moments, step counts, fp32 masters, stochastic-rounding counters, tensor
hyper-parameters), walked whatever their keys are, less the buffers a
module declares as describing its last call (``per_call_buffers``) -- a new piece of state
is checked without being named anywhere. Used by the whole-model skip
tests of every entry point (tests/fp8/test_fp8_no_trace.py, the
integrations, the launcher)."""
from __future__ import annotations

import torch


def flatten(prefix: str, obj, out: dict | None = None) -> dict[str, torch.Tensor]:
    """Every tensor in `obj` (nested dicts, lists, tuples) by its path."""
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(f"{prefix}/{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(f"{prefix}/{i}", v, out)
    return out


def training_state(model=None, optimizer=None) -> dict[str, torch.Tensor]:
    """Host copies of every tensor the model and the optimizer hold, keyed by
    their path (``model/fc.weight``, ``optimizer/state/0/exp_avg``); call
    between steps."""
    import torch_xla
    torch_xla.sync()
    found: dict[str, torch.Tensor] = {}
    if model is not None:
        flatten("model", model.state_dict(), found)
        for name in per_call(model):
            del found[f"model/{name}"]
    if optimizer is not None:
        flatten("optimizer", optimizer.state_dict(), found)
    return {k: v.detach().cpu().clone() for k, v in found.items()}


def per_call(model) -> list[str]:
    """The state_dict names of buffers that modules declare as describing
    their last call (``per_call_buffers``: fp8's diagnostics), not training."""
    return [f"{prefix}.{b}" if prefix else b for prefix, m in model.named_modules()
            for b in getattr(m, "per_call_buffers", ())]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


def moved(before: dict, after: dict) -> list[str]:
    """The paths whose bits, dtype or shape differ (or that appeared or went)."""
    out = sorted(set(before) ^ set(after))
    for k in sorted(set(before) & set(after)):
        a, b = before[k], after[k]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(_bits(a), _bits(b)):
            out.append(k)
    return out
