"""Attention in the region's dtype: what ``scaled_dot_product_attention``
computes where a policy casts it to a low dtype, on every engine.

Why: XLA has no fused attention kernel behind SDPA, so the call reaches
PyTorch's math implementation, which converts float16/bfloat16 q, k, v back
to float32 for accuracy (``_scaled_dot_product_attention_math``, unless the
process-wide ``allow_fp16_bf16_reduction_math_sdp`` is set): the region's
cast would be undone inside the op. The fused kernels the policies come from
(flash and cuDNN on CUDA, flash attention for CPU) compute the two matmuls
in the low dtype and the softmax in float32; this is that computation, made
of ATen ops, so autograd gives its backward (bf16/fp16 matmuls, a float32
softmax backward) and torch.compile traces it.

    attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        (q, k, v of one low dtype: the engine cast them, as it casts every
         floating argument of a lower_precision_fp op, the mask included)
        refuse what PyTorch's SDPA refuses, with PyTorch's own message
        s = scale or 1/sqrt(E); q * sqrt(|s|) (negated where s < 0), k * sqrt(|s|)
            (PyTorch's math path scales both before the matmul: no float16
            overflow in q @ k^T)
        enable_gqa and fewer key/value heads: repeat them (repeat_interleave)
        scores = (q @ k^T) in the low dtype, then float32
        is_causal: mask = ones(L, S).tril(); a boolean mask -> 0 / -inf
        scores + mask, in float32
        p = _safe_softmax(scores, -1)   (float32; a fully masked row -> 0)
        dropout_p > 0: dropout(p) with the device's generator (the region's
            RNG, what activation checkpointing saves and replays)
        -> p in the low dtype @ v      (the low dtype)

Engines reach it as ``torch.ops.xla_amp.attention`` (SDPA's schema, made from
the running torch's): the native kernels (csrc/, AutocastXLA and
AutocastPrivateUse1) call it for SDPA instead of the op itself when they
cast to a low dtype; the Python PrivateUse1 kernels and the torchax engine
call ``attention`` directly. Under float32 (an fp32 rule, or the dtype a
promote rule picks) the engines run PyTorch's own SDPA.
"""
from __future__ import annotations

import math

import torch

OP = "aten::scaled_dot_product_attention"  # the op this computes, where cast low
IMPL = "xla_amp::attention"                # the op the native kernels call instead
LOW = (torch.float16, torch.bfloat16)


def _refuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Raises PyTorch's own error for a call plain SDPA refuses (it is
    re-run on meta tensors, only once a check below has failed: ~4 ms a
    call, never on the common path); the checks are the cases the
    computation would otherwise run through silently."""
    def meta(t):
        return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")
    with torch.no_grad():
        torch.ops.aten.scaled_dot_product_attention.default(
            meta(query), meta(key), meta(value), meta(attn_mask), dropout_p, is_causal,
            scale=scale, enable_gqa=enable_gqa)
    raise RuntimeError(  # PyTorch let it pass on meta tensors: ours, naming the call
        "xla_amp: scaled_dot_product_attention in the region's dtype got query "
        f"{tuple(query.shape)} {query.dtype}, key {tuple(key.shape)} {key.dtype}, value "
        f"{tuple(value.shape)} {value.dtype}, attn_mask "
        f"{None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)}, "
        f"is_causal={is_causal}, enable_gqa={enable_gqa}")


def _accepted(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    if not (query.dtype == key.dtype == value.dtype and query.dtype in LOW):
        return False
    if min(query.dim(), key.dim(), value.dim()) < 2 or not 0.0 <= dropout_p <= 1.0:
        return False
    if attn_mask is not None and (is_causal or attn_mask.dtype not in (
            torch.bool, torch.float32, query.dtype)):
        return False
    if query.dim() >= 3 and key.dim() >= 3 and value.dim() >= 3:
        heads_q, heads_k, heads_v = query.size(-3), key.size(-3), value.size(-3)
        if enable_gqa and (heads_q % heads_k or heads_q % heads_v):
            return False
    return True


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
              scale=None, enable_gqa=False):
    """See the module docstring."""
    if not _accepted(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        _refuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    low = query.dtype
    s = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    root = math.sqrt(abs(s))
    q = query * (-root if s < 0 else root)
    k = key * root
    v = value
    if enable_gqa and query.dim() >= 3 and q.size(-3) != k.size(-3):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    scores = torch.matmul(q, k.transpose(-2, -1)).float()
    if is_causal:
        attn_mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool,
                               device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, float("-inf"))  # float32
        scores = scores + attn_mask.float()
    p = torch.ops.aten._safe_softmax.default(scores, -1)
    if dropout_p > 0.0:
        p = torch.dropout(p, dropout_p, True)
    return torch.matmul(p.to(low), v)


def lower_precision_impl(op: "torch._ops.OpOverload"):
    """What computes overload `op` once its inputs are cast to a low dtype,
    where that is not `op` itself (the Python kernels' side of the native
    kernels' set_lower_precision_impl); None otherwise."""
    schema = op._schema
    return attention if schema.name == OP and not schema.overload_name else None


_library: list = []  # the torch.library.Library defining IMPL (kept alive)


def register() -> None:
    """Defines ``torch.ops.xla_amp.attention`` (once): SDPA's schema, its
    kernel ``attention`` for every backend (CompositeImplicitAutograd)."""
    if _library:
        return
    schema = str(torch.ops.aten.scaled_dot_product_attention.default._schema)
    lib = torch.library.Library("xla_amp", "FRAGMENT")
    lib.define(schema.replace(OP, IMPL.split("::")[1], 1))
    lib.impl(IMPL.split("::")[1], attention, "CompositeImplicitAutograd")
    _library.append(lib)
