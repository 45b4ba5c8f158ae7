"""One fp8 training step of a two-layer MLP, run with XLA_FLAGS=--xla_dump_to
by tests/fp8/test_fp8.py (the optimized HLO must keep the float8 converts)."""
import torch, torch_xla, torch.nn as nn
import xla_amp
from xla_amp import fp8
dev = torch_xla.device()
torch.manual_seed(0)
m = fp8.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)), fp8.Fp8Recipe()).to(dev)
x = torch.randn(16, 32, device=dev)
with xla_amp.autocast(dev, policy="tpu"):
    loss = m(x).float().pow(2).mean()
loss.backward()
torch_xla.sync()
