"""torch_xla 2.9 cannot differentiate batch norm in eval mode (running
statistics, pytorch/xla#3361, open since 2022): the backward raises "The
size of mean should be compatible with feature count", with or without
autocast (lazily here; through torch.compile's openxla backend too, measured
2026-11-29). Eval-mode forward works. Users meet it when they
freeze a model's BatchNorm layers (`.eval()`) while fine-tuning the rest, or
take input gradients of a model in eval mode. Pinned: the first test fails
once upstream changes; then update
docs/upstream/torch_xla_eval_batch_norm_backward.md."""
import copy

import pytest
import torch
import torch.nn as nn

import xla_amp

_MESSAGE = "size of mean should be compatible with feature count"


def _frozen_bn(device):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn.eval(), copy.deepcopy(bn).to(device)


@pytest.mark.parametrize("policy", [None, "tpu", "cuda", "cpu"])
def test_backward_through_eval_batch_norm_raises(device, policy):
    _, bn = _frozen_bn(device)
    x = torch.randn(2, 3, 4, 4).to(device).requires_grad_()
    if policy is None:
        y = bn(x)
    else:
        with xla_amp.autocast(device, policy=policy):
            y = bn(x)
    with pytest.raises(RuntimeError, match=_MESSAGE):
        torch.autograd.grad(y.float().sum(), [x])


def _eval_batch_norm(bn, x):
    """The workaround: eval-mode batch norm as elementwise ops, which torch_xla
    differentiates (docs/upstream/torch_xla_eval_batch_norm_backward.md)."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
    shift = bn.bias - bn.running_mean * scale
    return x * scale.reshape(shape) + shift.reshape(shape)


def test_the_elementwise_form_is_the_workaround(device):
    cpu_bn, bn = _frozen_bn(device)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    want = cpu_bn(x)
    want_grads = torch.autograd.grad((want * want).sum(), [x, cpu_bn.weight, cpu_bn.bias])
    xd = x.detach().to(device).requires_grad_()
    got = _eval_batch_norm(bn, xd)
    grads = torch.autograd.grad((got * got).sum(), [xd, bn.weight, bn.bias])
    assert torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, want_grads):
        assert torch.allclose(g.cpu(), w, rtol=1e-4, atol=1e-5), (g, w)
