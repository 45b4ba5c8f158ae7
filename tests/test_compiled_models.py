"""Real models compiled (forward + loss + backward through
torch.compile(backend="openxla")) match the lazy run under the tpu and cpu
rules: the loss bit for bit, every gradient in dtype and to within what
compiling already changes in float32 (PyTorch's decompositions of the
backward ops differ from PyTorch/XLA's lowerings in the last bits; that
float32 difference is measured in the same test)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import xla_amp


def _mnist_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 11 * 11, 32), nn.ReLU(), nn.Linear(32, 10))


MODELS = {
    "mnist_cnn": (_mnist_cnn, (4, 1, 28, 28)),
    # resnet18 and a transformer block: next (issue #13 note) - the block's
    # compiled loss differed from lazy by 1e-4 under tpu, not yet diagnosed.
}


def _grads(model, device, policy, compiled):
    torch.manual_seed(0)
    x = torch.randn(*MODELS[model][1]).to(device)
    y = torch.randint(0, 10, (x.shape[0],)).to(device)
    torch.manual_seed(1)
    net = MODELS[model][0]().to(device)

    def loss_fn(x, y):
        with xla_amp.autocast(device, policy=policy or "tpu", enabled=policy is not None):
            return F.cross_entropy(net(x), y)
    if compiled:
        torch._dynamo.reset()
        loss_fn = torch.compile(loss_fn, backend="openxla")
    loss = loss_fn(x, y)
    loss.backward()
    return loss.detach().cpu(), [p.grad.cpu() for p in net.parameters()]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_compiled_model_matches_lazy(device, model):
    base_loss, base = _grads(model, device, None, False)
    _, base_c = _grads(model, device, None, True)
    fp32_gap = max((a - b).abs().max().item() for a, b in zip(base, base_c))
    for policy in ("tpu", "cpu"):
        loss, grads = _grads(model, device, policy, False)
        loss_c, grads_c = _grads(model, device, policy, True)
        assert loss_c.dtype == loss.dtype == torch.float32
        assert torch.equal(loss_c, loss), (policy, loss_c, loss)
        assert not torch.equal(loss, base_loss)  # autocast really changed the numbers
        for i, (g, gc) in enumerate(zip(grads, grads_c)):
            assert gc.dtype == g.dtype
            gap = (g - gc).abs().max().item()
            assert gap <= 4 * fp32_gap + 1e-6 * g.abs().max().item(), (policy, i, gap, fp32_gap)
