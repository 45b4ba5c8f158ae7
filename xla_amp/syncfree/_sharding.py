"""Optimizer state sharded like its parameter, under PyTorch/XLA's SPMD
(FSDPv2, ``mark_sharding`` meshes).

A sharded parameter carries an XLA sharding; a state tensor made from it
(a moment from ``zeros_like``, a float32 master, a tensor loaded from a
checkpoint) starts with none, and left to XLA's sharding propagation it
may come out replicated -- N times the memory the shard needs, silently.
So every state tensor of the parameter's shape is given the parameter's
sharding when it is made (the step that creates the state) and when it is
loaded (``load_state_dict``); 0-dim entries (step counts, the
stochastic-rounding counter) stay replicated. Nothing here moves data: a
pending tensor gets the annotation in the step's graph, a device tensor is
resharded on the device.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from xla_amp._param_walk import where


def _xlac():
    import torch_xla
    return torch_xla._XLAC


def spec(t: torch.Tensor) -> str:
    """The XLA sharding of `t` as PyTorch/XLA prints it ('' when it has
    none, '{replicated}', '{devices=[2,1]0,1}', ...)."""
    return _xlac()._get_xla_sharding_spec(t) if t.device.type == "xla" else ""


def _like(p: torch.Tensor, v) -> bool:
    """Whether state entry `v` is a tensor of `p`'s shape (not a 0-dim count)."""
    return isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p.shape


def follow(p: torch.Tensor, state: dict[str, Any]) -> None:
    """Give every tensor in `state` of `p`'s shape `p`'s sharding; nothing
    when `p` has none (a model that is not sharded)."""
    want = spec(p)
    if not want:
        return
    xlac = _xlac()
    sharding = None
    for v in state.values():
        if _like(p, v) and v.device == p.device and spec(v) != want:
            if sharding is None:
                sharding = xlac._get_xla_op_sharding(p)
            if spec(v):
                xlac._xla_clear_sharding(v)
            xlac._xla_mark_sharding(v, sharding)


def follow_all(params: Iterable[torch.Tensor], state: dict) -> None:
    """:func:`follow` for each of `params` that has state."""
    for p in params:
        st = state.get(p)
        if st:
            follow(p, st)


def mismatches(optimizer: torch.optim.Optimizer) -> list[str]:
    """Each state tensor of a parameter's shape whose sharding differs from
    its parameter's, as "parameter i of param group g: state 'k' is S, the
    parameter P"; empty when all follow."""
    out = []
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            want = spec(p)
            for key, v in optimizer.state.get(p, {}).items():
                if _like(p, v) and spec(v) != want:
                    out.append(f"{where(gi, pi)}: state {key!r} is {spec(v) or 'unsharded'}, "
                               f"the parameter {want or 'unsharded'}")
    return out
