"""What ``load`` compares before it reads a single value: every entry of
the state it would fill against the checkpoint's metadata.

torch_xla 2.9's ``SPMDLoadPlanner`` never compares sizes: it asks for the
chunks of each local shard that the checkpoint covers and copies them, so
a checkpoint of a wider layer fills a narrower one with its leading rows,
one of a narrower layer leaves a wider one as it was, and a bf16
checkpoint is converted into fp32 parameters -- all without an error
(pinned: tests/sharded/test_sharded_checkpoint_checks.py; plain DCP refuses the
size mismatch of an unsharded tensor). So, with the state flattened
exactly as the planner flattens it (torch_xla's ``flatten_state_dict``:
``model.<name>``, ``optimizer.state.<i>.<key>``, ``optimizer.param_groups``,
``scaler``)::

    for each entry here, in order (model, optimizer, scaler):
        absent from the checkpoint            -> refused (missing)
        a tensor here:  global shape + dtype  == the checkpoint's size + dtype
        not a tensor:   a non-tensor entry there too
    for each checkpoint entry under an object given here, not here
                                              -> refused (unexpected)
    non-tensor values (read safely beforehand): the optimizer's param
    groups hold as many groups and parameters; the scaler's state is
    enabled on both sides or on neither

Entries under an object not given (a checkpoint's optimizer when only the
model is loaded) are not looked at. The first difference raises a
``ValueError`` of one line naming the key, both sides and the path.
"""
from __future__ import annotations

from typing import Any

import torch

from xla_amp.checkpoint._record import tensor_text


def flatten(state: dict[str, Any]) -> dict[str, Any]:
    """`state` flattened into DCP keys, as the SPMD planners flatten it."""
    from torch_xla.experimental.distributed_checkpoint._helpers import flatten_state_dict
    flat, _ = flatten_state_dict(state)
    return flat


def _entry_text(md) -> str:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    if isinstance(md, TensorStorageMetadata):
        return tensor_text(md.size, md.properties.dtype)
    return "a non-tensor entry"


def _here_text(value) -> str:
    if isinstance(value, torch.Tensor):
        return tensor_text(value.shape, value.dtype)
    return f"a {type(value).__name__}"


def compare(state: dict[str, Any], metadata, path: str, who: str) -> list[str]:
    """Refuse the first entry of `state` that the checkpoint's `metadata`
    does not hold as it is here (module docstring); return the keys of the
    non-tensor entries (for :func:`compare_values`)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    saved = metadata.state_dict_metadata
    flat = flatten(state)
    tail = "; nothing was loaded"
    for top in state:
        if not any(k.split(".", 1)[0] == top for k in saved) and any(
                k.split(".", 1)[0] == top for k in flat):
            raise ValueError(f"{who}: the checkpoint in {path} holds no {top} state{tail}")
    values = []
    for key, value in flat.items():
        md = saved.get(key)
        if md is None:
            raise ValueError(f"{who}: {key!r} ({_here_text(value)} here) is not in the "
                             f"checkpoint in {path}{tail}")
        is_tensor = isinstance(md, TensorStorageMetadata)
        if isinstance(value, torch.Tensor):
            if not is_tensor or (list(md.size) != list(value.shape)
                                 or md.properties.dtype != value.dtype):
                raise ValueError(f"{who}: {key!r} is {_entry_text(md)} in {path}, "
                                 f"{_here_text(value)} here{tail}")
        elif is_tensor:
            raise ValueError(f"{who}: {key!r} is {_entry_text(md)} in {path}, "
                             f"{_here_text(value)} here{tail}")
        else:
            values.append(key)
    for key, md in saved.items():
        if key.split(".", 1)[0] in state and key not in flat:
            raise ValueError(f"{who}: the checkpoint in {path} holds {key!r} "
                             f"({_entry_text(md)}), which nothing here takes{tail}")
    return values


def compare_values(values: dict[str, Any], state: dict[str, Any], path: str,
                   who: str) -> None:
    """The non-tensor entries read from the checkpoint against this side's:
    param-group structure, the scaler enabled on both sides or neither."""
    tail = "; nothing was loaded"
    groups = values.get("optimizer.param_groups")
    if "optimizer" in state and groups is not None:
        here = state["optimizer"].get("param_groups", [])
        ok = isinstance(groups, list) and all(isinstance(g, dict) for g in groups)
        then = [len(g.get("params", ())) for g in groups] if ok else None
        now = [len(g["params"]) for g in here]
        if then != now:
            raise ValueError(f"{who}: 'optimizer.param_groups' holds {then if ok else 'no groups'}"
                             f" parameters per group in {path}, {now} here{tail}")
    if "scaler" in state and "scaler" in values:
        then, now = values["scaler"], state["scaler"]
        if not isinstance(then, dict) or bool(then) != bool(now):
            def text(v):
                return "an enabled scaler's" if v else "a disabled scaler's"
            raise ValueError(f"{who}: 'scaler' is {text(then)} state in {path}, "
                             f"{text(now)} here{tail}")
