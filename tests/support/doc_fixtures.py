"""The names the docs' Python examples take as given (a model, a loader, a
loss, a device ...), so a page reads as the user's script would and still
runs: tests/suite/test_doc_examples.py executes every Python block of
README.md and docs/*.md with these in its namespace. Small on purpose: a
4-class MLP on XLA:CPU, three batches."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def setup(namespace: dict) -> None:
    """Fill `namespace` (one page's, shared by its blocks in order)."""
    import torch_xla

    import xla_amp
    from xla_amp import GradScaler, autocast, policies, syncfree

    device = torch_xla.device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    loader = [(torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device))
              for _ in range(3)]
    optimizer = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = loader[0]
    namespace.update(
        torch=torch, torch_xla=torch_xla, nn=nn, F=F, xla_amp=xla_amp, autocast=autocast,
        GradScaler=GradScaler, syncfree=syncfree, policies=policies, device=device,
        model=model, loader=loader, loss_fn=F.cross_entropy, optimizer=optimizer, opt=optimizer,
        scaler=GradScaler(), x=x, y=y)
