"""Attention in a low dtype, written out by hand: the control the engines'
scaled_dot_product_attention is compared with under a policy that casts it
(bf16/fp16 matmuls, a float32 softmax; xla_amp/policies/_attention.py's docstring
states the rule). Plain tensors in, no autocast: call it outside any region.

    reference(q, k, v, low, mask=None, is_causal=False, scale=None, gqa=False)
    case(form, length, dim) -> q, k, v, SDPA kwargs, reference kwargs (CPU)
"""
from __future__ import annotations

import math

import torch


def reference(q, k, v, low, mask=None, is_causal=False, scale=None, gqa=False):
    q, k, v = q.to(low), k.to(low), v.to(low)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    half = math.sqrt(abs(scale))  # PyTorch's math path: both sides scaled by the root
    q = q * (half if scale >= 0 else -half)
    k = k * half
    if gqa:
        groups = q.shape[-3] // k.shape[-3]
        k = torch.repeat_interleave(k, groups, dim=-3)
        v = torch.repeat_interleave(v, groups, dim=-3)
    scores = (q @ k.transpose(-1, -2)).to(torch.float32)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if is_causal:
        mask = torch.tril(torch.ones(n_q, n_k, dtype=torch.bool, device=q.device))
    if mask is not None:
        if mask.dtype == torch.bool:
            additive = torch.where(mask, 0.0, float("-inf"))
        else:
            additive = mask.to(low).to(torch.float32)  # the region casts a float mask too
        scores = scores + additive
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # a row with every key masked: zeros
    return probs.to(low) @ v


def case(form: str, length: int, dim: int):
    """(q, k, v, SDPA's keyword arguments, `reference`'s) of one mask form
    ("causal", "bool_mask", "additive_mask", "gqa"), all on the CPU: 4 query
    heads, 2 key/value heads under "gqa"; a boolean mask keeps every row's
    first key (no row fully masked)."""
    torch.manual_seed(0)
    heads_kv = 2 if form == "gqa" else 4
    qkv = [torch.randn(2, 4, length, dim), torch.randn(2, heads_kv, length, dim),
           torch.randn(2, heads_kv, length, dim)]
    if form == "causal":
        return (*qkv, {"is_causal": True}, {"is_causal": True})
    if form == "gqa":
        return (*qkv, {"enable_gqa": True}, {"gqa": True})
    if form == "bool_mask":
        mask = torch.rand(length, length) > 0.3
        mask[:, 0] = True
    else:
        mask = torch.randn(length, length)
    return (*qkv, {"attn_mask": mask}, {"mask": mask})
