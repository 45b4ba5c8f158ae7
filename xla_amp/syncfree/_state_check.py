"""Is a loaded state dict one this optimizer can train on? Checked against
what the optimizer itself keeps, never against a list of keys, so a new
option's state is covered by the code that creates it.

Algorithm (before anything is loaded; nothing here changes the optimizer)::

    structure: a dict with "state" and "param_groups"; as many groups, as
               many parameters per group; every state id listed by a group
    for each parameter p (group g, index i) with saved state s
    (None entries are absent, as torch.optim writes them):
        group  = saved hyperparameters + this optimizer's build choices
        keeps  = the state-dict form of create_state(group, meta(p), {}),
                 in its between-steps dtypes          (the step's own code,
                                                       on meta tensors)
        a key of s not in keeps          -> refused: this optimizer never keeps it
        filled = create_state(group, meta(p), meta(s))     what the next step adds
        a key of s replaced by filled, or
        a key of keeps missing from filled -> refused: the entry is incomplete
        each value v against t = keeps[key]:
            t 0-dim:  one number, or a 1-element tensor, of t's kind
            else:     a tensor of t's shape and kind       (kind: floating | integer)

An accepted value is converted to t's dtype on p's device ("step" stays on
the host, as torch.optim keeps it); so a float16 master is widened, a
bfloat16 moment of a plain dict widened for master weights, a float32 one
narrowed to ``state_dtype``. Every refusal names the key, group, index,
expected and got, and ends "nothing was loaded".
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp._param_walk import where as _where
from xla_amp.syncfree import _fresh, _low_precision


class _Written(dict):
    """A dict that remembers which keys were assigned."""

    def __init__(self, items):
        super().__init__(items)
        self.written: set = set()

    def __setitem__(self, key, value):
        self.written.add(key)
        super().__setitem__(key, value)


def _present(saved: dict) -> dict:
    return {k: v for k, v in saved.items() if v is not None}


def _meta(v) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    return torch.empty((), dtype=torch.float64 if isinstance(v, float) else torch.int64,
                       device="meta")


def _exported(opt, st: dict) -> dict:
    """`st` as ``state_dict()`` writes it (internal entries dropped), with
    every counter the export reads taken as set."""
    host = {id(t): torch.ones(()) for t in opt._host_keys(st)}
    return opt._export_state(dict(st), host)


def kept_state(opt, group: dict, p: torch.Tensor, saved: dict):
    """(keeps, filled): what ``opt`` keeps for a parameter like ``p`` between
    steps, state-dict form, meta tensors; and `saved` (meta) with what the
    next step would add to it (``written``: the keys that step assigns)."""
    meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
    keeps: dict = {}
    _low_precision.create_state(opt, group, meta, keeps)
    _low_precision.between_steps(opt, group, meta, keeps)
    filled = _Written({k: _meta(v) for k, v in saved.items()})
    _low_precision.create_state(opt, group, meta, filled)
    return _exported(opt, keeps), filled


def _kind(dtype: torch.dtype) -> str | None:
    if dtype.is_complex or dtype is torch.bool:
        return None
    return "floating" if dtype.is_floating_point else "integer"


def _bad_value(v, t: torch.Tensor) -> str | None:
    """Why `v` cannot stand for the template `t`, or None."""
    kind = _kind(t.dtype)
    if t.dim() == 0:
        if isinstance(v, torch.Tensor):
            ok = v.numel() == 1 and _kind(v.dtype) in (kind, "integer")
        else:
            ok = (isinstance(v, int) or isinstance(v, float) and kind == "floating") \
                and not isinstance(v, bool)
        return None if ok else f"expected one {kind} number, got {v!r}"
    shape = tuple(t.shape)
    if not isinstance(v, torch.Tensor):
        return f"expected a {kind} tensor of shape {shape}, got {type(v).__name__}"
    if _kind(v.dtype) != kind:
        return f"expected a {kind} tensor of shape {shape} ({t.dtype}), got {v.dtype}"
    if tuple(v.shape) != shape:
        return f"expected shape {shape} (the parameter's), got {tuple(v.shape)}"
    return None


KEPT = ("fused",) + _low_precision.KEYS  # how an optimizer was built to run


def _merged_groups(opt, saved_groups: list[dict]) -> list[dict]:
    """Each group as it will be after the load: this optimizer's (its
    parameters, and the keys an older dict lacks), the saved
    hyperparameters, this optimizer's build choices."""
    return [{**ours, **{k: v for k, v in saved.items() if k != "params"},
             **{k: ours.get(k) for k in KEPT}}
            for saved, ours in zip(saved_groups, opt.param_groups)]


def check(opt, state_dict, name: str) -> tuple[list[dict], dict[Any, tuple]]:
    """Raises ``ValueError`` unless `state_dict` can be loaded into `opt`;
    returns the merged param groups and, per saved id with state,
    (parameter, what the optimizer keeps for it) for :func:`converted`."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
        got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise ValueError(f"{name}: expected a dict with 'state' and 'param_groups', got {got}")
    groups = state_dict["param_groups"]
    if len(groups) != len(opt.param_groups):
        raise ValueError(f"{name}: the state dict has {len(groups)} param groups, "
                         f"this optimizer {len(opt.param_groups)}")
    where: dict[Any, tuple] = {}
    for gi, (saved, ours) in enumerate(zip(groups, opt.param_groups)):
        if len(saved["params"]) != len(ours["params"]):
            raise ValueError(f"{name}: param group {gi} has {len(saved['params'])} "
                             f"parameters in the state dict, {len(ours['params'])} here")
        for pi, (idx, p) in enumerate(zip(saved["params"], ours["params"])):
            where[idx] = (gi, pi, p)
    merged = _merged_groups(opt, groups)
    kept = {}
    for idx, saved in state_dict["state"].items():
        if idx not in where:
            raise ValueError(f"{name}: state for parameter id {idx!r}, which no param "
                             "group lists")
        if not isinstance(saved, dict):
            raise ValueError(f"{name}: state for parameter id {idx!r} is a "
                             f"{type(saved).__name__}, expected a dict")
        gi, pi, p = where[idx]
        keeps = _check_entry(opt, merged[gi], p, _present(saved), f"{name}: state",
                             _where(gi, pi))
        kept[idx] = (p, keeps)
    return merged, kept


def _check_entry(opt, group, p, saved: dict, head: str, at: str) -> dict:
    """What `opt` keeps for `p`, once `saved` (None entries dropped) passed."""
    keeps, filled = kept_state(opt, group, p, saved)
    for key in saved:
        if key not in keeps:
            options = ", ".join(f"{k}={group.get(k)}" for k in _low_precision.KEYS)
            raise ValueError(
                f"{head} '{key}' of {at}: this {type(opt).__name__} ({options}) keeps no "
                f"such state for a {p.dtype} parameter (it keeps {sorted(keeps) or 'none'}); "
                "build it with the options of the optimizer that saved the dict, or delete "
                "the key to discard it; nothing was loaded")
    replaced = filled.written & set(saved)
    missing = sorted(k for k in keeps if k not in saved and (replaced or k not in filled))
    if missing:
        raise ValueError(f"{head} of {at} lacks {missing}: expected {sorted(keeps)}, got "
                         f"{sorted(saved)}; nothing was loaded")
    for key, v in saved.items():
        bad = _bad_value(v, keeps[key])
        if bad:
            raise ValueError(f"{head} '{key}' of {at}: {bad}; nothing was loaded")
    return keeps


def converted(keeps: dict, p: torch.Tensor, saved: dict) -> dict:
    """A checked entry as the optimizer keeps it (`keeps`, from :func:`check`):
    each value in its kept dtype, on `p`'s device ("step" on the host, as
    torch.optim keeps it)."""
    out = {}
    for key, v in _present(saved).items():
        t = keeps[key]
        v = v.detach() if isinstance(v, torch.Tensor) else torch.tensor(v)
        if t.dim() == 0:
            v = v.reshape(())
        v = v.to(dtype=t.dtype)
        out[key] = v.to("cpu", copy=True) if key == "step" else _fresh.put(v, p)
    return out
