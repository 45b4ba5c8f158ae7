"""Resuming a checkpoint under another precision mode: convert exactly, or
refuse in one line naming both modes.

Algorithm (on the saved state dicts, before any object changes), for each
floating entry ``n`` of the model's state dict, saved dtype ``ds``, wanted
dtype ``dt`` (the live model's), and for a parameter its saved optimizer
state ``s``::

    full = s["master"] if s has one else saved[n]    # the most precise value kept
    saved[n] already dt (and no master, or a master wanted):
                            new = saved[n]           # no change: bit-identical
    a master is wanted      s["master"] = full (float32); new = full.to(dt)
      (dt below float32, the group has master_weights): exactly what a
      master-weights step would have made
    else                    new = full.to(dt), only if new.to(full.dtype) == full
                            everywhere: widening (bf16 -> fp32) always is;
                            narrowing (fp32 -> bf16 without a master) refuses
                            unless allow_rounding (the fp32 bits would be lost)
    s keeps "master" only for a master group, "sr_counter" only for an SR one
    (a missing one is made by the optimizer's load: master from the weight,
    the rounding counter started)

The scaler's state carries over when both runs scale; a run that did not
scale gives a new run a fresh scaler; a run that stops scaling drops it.
The autocast dtype (fp16 AMP -> bf16 AMP) changes no saved value.
Optimizer moments are left to the optimizer's ``load_state_dict``, which
converts them to the dtype it keeps (``state_dtype``).

| saved \\ resumed as   | fp32 / AMP   | bf16 + master     | bf16 + SR / bf16 |
|---------------------|--------------|-------------------|------------------|
| fp32 / AMP          | =            | master = weights  | refused*         |
| bf16 + master       | weights = master | =             | refused*         |
| bf16 + SR / bf16    | widened      | master from weights | =              |
(* allow_rounding=True rounds to nearest.)
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp.checkpoint._errors import CheckpointError
from xla_amp.checkpoint._record import dtype_name, group_of, mode_name

_MASTER, _COUNTER = "master", "sr_counter"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _structure(saved: dict, target: dict) -> None:
    if saved.get("optimizer") and target.get("optimizer") and \
            saved["optimizer"] != target["optimizer"]:
        raise CheckpointError(f"the checkpoint's optimizer is {saved['optimizer']}, this "
                              f"run's is {target['optimizer']}")
    a, b = saved["optimizer_params"], target["optimizer_params"]
    if a and b and a != b:
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        got = a[i] if i < len(a) else "nothing"
        want = b[i] if i < len(b) else "nothing"
        raise CheckpointError(f"the optimizer's parameter {i} is {got!r} in the checkpoint, "
                              f"{want!r} in this run")


def convert(state: dict[str, Any], target: dict[str, Any], *,
            allow_rounding: bool = False) -> tuple[dict[str, Any], list[str]]:
    """`state` (``model``, ``optimizer``, ``scaler`` state dicts and its
    ``record``) made fit for the objects described by `target` (a
    ``training_record``). Returns the converted copy and a list of what was
    converted (empty: nothing; then every value is the saved one).
    :class:`CheckpointError` naming both modes if a value would be lost."""
    saved = state["record"]
    _structure(saved, target)
    model = dict(state["model"])
    opt = state.get("optimizer")
    if opt is not None:   # a copy down to the per-parameter dicts this edits
        opt = dict(opt, state={k: dict(v) for k, v in opt["state"].items()})
    index = {n: i for i, n in enumerate(saved["optimizer_params"])}
    done: list[str] = []
    for name, value in state["model"].items():
        want = target["dtypes"].get(name)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or want is None:
            continue
        dt = getattr(torch, want)
        i = index.get(name)
        st = opt["state"].get(i) if (opt is not None and i is not None) else None
        group = group_of(target, i) if (i is not None and target["groups"]) else {}
        master_wanted = bool(group.get("master_weights")) and dt != torch.float32
        full = st[_MASTER] if st and _MASTER in st else value
        if value.dtype == dt and (full is value or master_wanted):
            new = value                   # nothing to convert (a kept master stays)
        elif full.dtype == dt:
            new = full
        elif master_wanted and full.dtype == torch.float32:
            new = full.to(dt)
            if opt is not None:
                st = st if st is not None else opt["state"].setdefault(i, {})
                st[_MASTER] = full
        else:
            new = full.to(dt)
            if not allow_rounding and not _same(new.to(full.dtype), full):
                raise CheckpointError(
                    f"cannot resume a run of {mode_name(saved)} as {mode_name(target)}: "
                    f"{name} would be rounded from {dtype_name(full.dtype)} to {want} and the "
                    "lost bits kept nowhere; resume with master weights, or round on "
                    "purpose (allow_rounding=True)")
        if new is not value:
            how = (" (from the fp32 master)" if full is not value
                   else " (the fp32 values kept as its master)" if st and st.get(_MASTER) is full
                   else "")
            done.append(f"{name}: {dtype_name(value.dtype)} -> {want}{how}")
        model[name] = new
        if st is not None:
            if not master_wanted:
                st.pop(_MASTER, None)
            if not (group.get("stochastic_rounding") and dt != torch.float32):
                st.pop(_COUNTER, None)
    out = dict(state, model=model, optimizer=opt, scaler=_scaler(saved, target, state))
    return out, _summarise(done)


def _scaler(saved: dict, target: dict, state: dict):
    if not target["scaler"]:
        return {}
    return state.get("scaler") if saved["scaler"] else None  # None: start fresh


def _summarise(done: list[str]) -> list[str]:
    return done if len(done) <= 3 else done[:2] + [f"... {len(done) - 2} more"]
