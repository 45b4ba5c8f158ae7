"""Attention through ``jax.nn.dot_product_attention`` inside xla_amp regions:
on a GPU, cuDNN's fused kernel, where torchax 0.0.13 lowers
``F.scaled_dot_product_attention`` as its unfused math (the scores in memory).

Measured on an H200 (docs/gpu.md): the 6 x 768 LM's xla_amp bf16 step 10.58
-> 8.27 ms (1.48x ``torch.compile`` AMP), losses within 0.01 %.

    fused(env, backend, args, kwargs):       (a call of one of SDPA)
        (the call as the region passes it on: its inputs cast where the policy
        puts attention in a category, as they come where it does not -- the
        tpu rules, whose q, k, v are the low-dtype linears' outputs)
        torchax tensors q, k, v of rank 4 (B, N, T, H), one dtype, float16 or
        bfloat16; no attn_mask, dropout_p == 0; heads equal, or enable_gqa
        with N_q a multiple of N_kv
            -> dot_product_attention(q, k, v in (B, T, N, H), scale, is_causal,
               implementation="cudnn" on a GPU, XLA's elsewhere), back to
               (B, N, T, H)
        else, or a shape JAX refuses while tracing -> NotImplemented
            (torchax's own lowering runs)

Whether a region takes this path: ``autocast(..., fused_attention=)``; None
(the default) means on where the region's JAX backend is a GPU, off
elsewhere. Softmax statistics are float32 inside the kernel, as in
PyTorch's attention kernels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from xla_amp.policies import _attention as shared
from xla_amp.torchax import _hook

LOW = (jnp.float16, jnp.bfloat16)
CUDNN = ("gpu", "cuda")  # JAX's names for an NVIDIA backend
CATEGORY = "lower_precision_fp attention"  # what the region runs inside, as a category
SDPA = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def default(backend: str) -> bool:
    """Whether a region on JAX `backend` fuses attention unless told."""
    return backend in CUDNN


def low(args, kwargs) -> bool:
    """Whether a call of one of SDPA has float16/bfloat16 queries."""
    query = args[0] if args else (kwargs or {}).get("query")
    return isinstance(query, torch.Tensor) and query.dtype in (torch.float16, torch.bfloat16)


def low_call(top, original, func, args, kwargs, suspended):
    """A call of one of SDPA cast to a low dtype in region `top`: `fused`
    where the region asks for it, else the computation every engine runs
    there (xla_amp/policies/_attention.py), which picks each op's dtype itself
    (`suspended`: the region's context that keeps autocast off inside)."""
    with suspended(CATEGORY):
        out = run(top, original, func, args, kwargs)
    if out is not None:
        return out
    with suspended():
        return shared.attention(*args, **kwargs)


def check(value, where: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{where}: fused_attention must be a bool or None, got {value!r}")


def _bound(args, kwargs) -> dict | None:
    if len(args) > len(_NAMES) or any(k not in _NAMES for k in kwargs):
        return None
    call = dict(zip(_NAMES, args))
    for k, v in kwargs.items():
        if k in call:
            return None
        call[k] = v
    return call


def run(top, original, func, args, kwargs):
    """`fused` where region `top` asks for it (its fused_attention, backend),
    on the environment of torchax's dispatch `original`; else None."""
    if not top.fused_attention or func not in SDPA:
        return None
    out = fused(_hook.environment_of(original), top.backend, args, kwargs)
    return None if out is NotImplemented else out


def fused(env, backend: str, args, kwargs):
    """A call of one of SDPA by jax.nn.dot_product_attention, or NotImplemented."""
    call = _bound(args, kwargs or {})
    if (call is None or not {"query", "key", "value"} <= call.keys()
            or call.get("attn_mask") is not None or call.get("dropout_p", 0.0)):
        return NotImplemented
    qkv = [call["query"], call["key"], call["value"]]
    if not all(_hook.is_device_tensor(t) for t in qkv):
        return NotImplemented
    q, k, v = (_hook.jax_value(t) for t in qkv)
    if not (q.ndim == k.ndim == v.ndim == 4 and q.dtype == k.dtype == v.dtype
            and q.dtype in LOW):
        return NotImplemented
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv and not (call.get("enable_gqa") and heads_q % heads_kv == 0):
        return NotImplemented
    try:
        out = jax.nn.dot_product_attention(
            *(a.transpose(0, 2, 1, 3) for a in (q, k, v)),  # to (B, T, N, H)
            scale=call.get("scale"), is_causal=bool(call.get("is_causal", False)),
            implementation="cudnn" if backend in CUDNN else "xla")
    except (NotImplementedError, ValueError, RuntimeError, TypeError):
        return NotImplemented  # a shape or dtype the kernel refuses: torchax's lowering
    return env.j2t_iso(out.transpose(0, 2, 1, 3))
