"""Batch norm's running statistics on torchax.

torchax 0.0.13 lowers ``aten._native_batch_norm_legit`` and
``aten.native_batch_norm`` as pure functions: the running mean and
variance are computed and dropped, never written back into the buffers
their schema marks as mutated (``Tensor(a!) running_mean``). A model
trained through torchax keeps running_mean 0 and running_var 1 for ever
and is wrong in eval mode, with no error (pinned in
tests/torchax/test_torchax_no_trace.py). Inside an xla_amp.torchax region
the update runs after torchax's op, as torch's kernels do it::

    n = elements per channel
    running_mean <- (1 - momentum) * running_mean + momentum * mean(x)
    running_var  <- (1 - momentum) * running_var + momentum * var(x) * n / (n - 1)

in the buffers' dtype, with no gradient (the buffers are not trained),
computed in JAX: inside torchax's dispatch its torch modes are off.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from xla_amp.torchax import _hook

_SIGNATURE = ("input", "weight", "bias", "running_mean", "running_var", "training",
              "momentum", "eps")
OPS = frozenset({torch.ops.aten._native_batch_norm_legit.default,
                 torch.ops.aten.native_batch_norm.default})


def _bound(args, kwargs) -> dict:
    bound = dict(zip(_SIGNATURE, args))
    bound.update(kwargs or {})
    return bound


def update_running_stats(args, kwargs) -> None:
    """After torchax's batch-norm op on (args, kwargs): write the running
    statistics back into their buffers, when training with buffers."""
    b = _bound(args, kwargs)
    mean_buf, var_buf = b.get("running_mean"), b.get("running_var")
    if not b.get("training") or mean_buf is None or var_buf is None:
        return
    momentum = float(b.get("momentum", 0.1))
    mean_old, var_old = _hook.jax_value(mean_buf), _hook.jax_value(var_buf)
    x = jax.lax.stop_gradient(_hook.jax_value(b["input"])).astype(mean_old.dtype)
    dims = (0, *range(2, x.ndim))
    mean, var = jnp.mean(x, axis=dims), jnp.var(x, axis=dims, ddof=1)
    _hook.set_jax_value(mean_buf, ((1 - momentum) * mean_old + momentum * mean).astype(mean_old.dtype))
    _hook.set_jax_value(var_buf, ((1 - momentum) * var_old + momentum * var).astype(var_old.dtype))
