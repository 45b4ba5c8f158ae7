"""Small models the numerics tools are tested on, on any device (XLA in
tests/numerics, the stand-in PrivateUse1 device in tests/privateuse1)."""
import torch
from torch import nn


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


class Risky(nn.Module):
    """block.up's activations exceed float16's range (~1.4e5); the LayerNorm
    after it brings them back."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.block = nn.Sequential()
        self.block.add_module("up", nn.Linear(16, 16))
        self.block.add_module("norm", nn.LayerNorm(16))
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.block.up.weight.mul_(1e5)

    def forward(self, x):
        return self.head(self.bn(self.block(self.inp(x))))
