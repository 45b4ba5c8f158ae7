"""Leaner JAX for two ops torchax 0.0.13 lowers at a cost, inside xla_amp
regions (the GPT-2 step's converts and selects, against plain JAX's).

    embedding          ``jnp.take(weight, ids, axis=0, mode="clip")``.
                       torchax's ``jnp.take`` uses JAX's default mode, which
                       fills the rows of out-of-range ids with NaN and wraps
                       negative ids; XLA repeats that select in every fusion
                       that reads the table (18 of the step's 26 selects).
                       "clip" clamps out-of-range ids, as torch_xla's
                       lowering does (eager torch raises). A padding_idx
                       keeps torchax's lowering.
    split, split_with_sizes, split_copy
                       ``jnp.split`` at the cumulative sizes. torchax slices
                       piece by piece, so the backward is one pad per piece
                       added up in float32 (16 converts in the step); the
                       backward of ``jnp.split`` is one concatenate. The
                       same pieces, forward.

Applied by _region.py to the calls torchax dispatches inside an open
region (every make_train_step); outside regions torchax's own lowerings run.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from xla_amp.torchax import _hook

aten = torch.ops.aten


def _embedding(weight, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if padding_idx != -1 or scale_grad_by_freq or sparse:
        return NotImplemented
    return jnp.take(weight, ids, axis=0, mode="clip")


def _split(x, sizes, dim=0):
    n = x.shape[dim]
    if isinstance(sizes, int):  # equal pieces of `sizes`, the last one shorter
        sizes = [sizes] * (-(-n // sizes)) if n else [0]
        sizes[-1] = n - sizes[0] * (len(sizes) - 1)
    if sum(sizes) != n or any(s < 0 for s in sizes):
        return NotImplemented  # torchax's lowering says what is wrong
    return list(jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=dim))


OPS = {
    aten.embedding.default: _embedding,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.split_copy.Tensor: _split,
}


def run(env, func, args, kwargs):
    """`func` on torchax tensors by the leaner lowering, or NotImplemented."""
    tensors = [a for a in args if isinstance(a, (torch.Tensor, _hook.View))]
    if not tensors or not all(_hook.is_device_tensor(a) for a in tensors):
        return NotImplemented  # a host tensor among them: torchax's own handling
    arrays = [_hook.jax_value(a) if _hook.is_device_tensor(a) else a for a in args]
    out = OPS[func](*arrays, **(kwargs or {}))
    if out is NotImplemented:
        return out
    return env.j2t_iso(out)
