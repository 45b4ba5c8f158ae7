"""Small real models for the PrivateUse1 engine's training tests (torch
only): a pre-norm transformer block LM and a CNN, seeded, on any device."""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=32, heads=4, vocab=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))

    def forward(self, x):
        return self.body(x)


def batches(kind: str, steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if kind == "block":
            t = torch.randint(0, 64, (4, 9), generator=g)
            yield t[:, :-1], t[:, 1:]
        else:
            x = torch.randn(8, 1, 8, 8, generator=g)
            yield x, (x.mean((1, 2, 3)) > 0).long() * 3


def build(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Block() if kind == "block" else CNN()


def loss_of(model, kind, x, y):
    out = model(x)
    if kind == "block":
        out = out.reshape(-1, out.shape[-1])
        y = y.reshape(-1)
    return nn.functional.cross_entropy(out.float(), y)
