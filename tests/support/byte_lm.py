"""The small language model of benchmarks/precision_modes.py and
benchmarks/memory.py: a byte-level causal transformer trained on the Python
standard library's own source files (shipped with Python; nothing is
downloaded). The Transformers and fp8 tests train on the same corpus."""
from __future__ import annotations

import os
import sysconfig

import torch
import torch.nn as nn

from xla_amp_launch import precision
from xla_amp_launch.precision import PRECISIONS

CONTEXT = 64
BATCH = 32


def corpus(chars: int) -> torch.Tensor:
    """The first `chars` bytes of the stdlib's top-level .py files, sorted by
    name, as int64 symbols 0..255."""
    lib = sysconfig.get_paths()["stdlib"]
    out = bytearray()
    for name in sorted(os.listdir(lib)):
        if name.endswith(".py"):
            with open(os.path.join(lib, name), "rb") as f:
                out += f.read()
            if len(out) >= chars:
                break
    return torch.frombuffer(bytearray(out[:chars]), dtype=torch.uint8).long()


def batch_at(src: torch.Tensor, gen: torch.Generator, device):
    """A batch of (input, next-byte target) windows at random offsets."""
    i = torch.randint(0, len(src) - CONTEXT - 1, (BATCH,), generator=gen).tolist()
    x = torch.stack([src[j:j + CONTEXT] for j in i])
    y = torch.stack([src[j + 1:j + CONTEXT + 1] for j in i])
    return x.to(device), y.to(device)


class LM(nn.Module):
    """2 pre-norm transformer layers (d=128, 4 heads), causal, 256 symbols."""

    def __init__(self, d: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(CONTEXT, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CONTEXT))

    def forward(self, x):
        h = self.embed(x) + self.pos
        h = self.blocks(h, mask=self.mask.to(h.dtype), is_causal=True)
        return self.head(self.norm(h))


MODES = PRECISIONS


def apply_mode(model: nn.Module, mode: str, lr: float, weight_decay: float = 0.01,
               state_dtype=None):
    """Casts `model` for `mode` as the launchers' --precision does (bf16
    modes: weights bf16, norms kept fp32 with an "fp32" rule) and returns
    (AdamW, scaler, autocast enabled)."""
    import xla_amp
    precision.prepare(model, mode, None)
    flags = precision.optimizer_options(mode)
    if flags.get("stochastic_rounding"):
        flags["state_dtype"] = state_dtype
    opt = xla_amp.syncfree.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, **flags)
    return opt, xla_amp.GradScaler(enabled=mode != "fp32"), mode != "fp32"
