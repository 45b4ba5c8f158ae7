"""Attention in a low dtype, written out by hand: the control the engines'
scaled_dot_product_attention is compared with under a policy that casts it
(bf16/fp16 matmuls, a float32 softmax; xla_amp/policies/_attention.py's docstring
states the rule). Plain tensors in, no autocast: call it outside any region.

    reference(q, k, v, low, mask=None, is_causal=False, scale=None, gqa=False)
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
