"""The GPT-2-shaped LM the benchmarks and tests train, written once as an nn.Module
(torch only: imported by torch_xla, torchax and native-CUDA workers alike).

GPT-2's layout: wte + wpe, pre-LN blocks (causal
F.scaled_dot_product_attention, a tanh-GELU MLP of two nn.Linear layers,
``c_fc`` and ``mlp_proj``), ln_f, a head tied to wte unless ``tied=False``;
GPT-2's init (std 0.02, the projections scaled by 1/sqrt(2 layers)).
"""
from __future__ import annotations

import math

import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2's shape: wte + wpe, pre-LN blocks, ln_f, head (tied to wte)."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int, tied: bool):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = None if tied else nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():  # GPT-2's init
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight if self.head is None else self.head.weight)


def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
