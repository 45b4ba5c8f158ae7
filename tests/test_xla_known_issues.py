"""PyTorch/XLA 2.9 defects that shape xla_amp's defaults, pinned without autocast.

Each test reproduces the defect with plain torch_xla and fails once the
defect is gone, so the workaround can be removed (see docs/policies.md).
"""
import pytest
import torch
import torch_xla


def test_batchnorm_bf16_input_then_maxpool_backward_fails(device):
    """bf16 activations into a BatchNorm with fp32 weights (what the cpu and
    cuda rules give a ResNet), then max_pool2d: the backward HLO mixes f32
    and bf16 in select-and-scatter and XLA's verifier rejects it. The
    ImageNet launcher therefore uses the tpu rules (batch_norm in fp32) on
    XLA:CPU."""
    bn = torch.nn.BatchNorm2d(4).to(device)
    x = torch.randn(2, 4, 8, 8, device=device).bfloat16().requires_grad_()
    y = torch.nn.functional.max_pool2d(bn(x), 2)
    y.float().sum().backward()
    with pytest.raises((RuntimeError, ValueError), match="mixed precision is disallowed"):
        torch_xla.sync()
    del bn, x, y  # drop the unrunnable graph so later syncs do not retry it
    z = torch.ones(2, device=device) * 2  # the runtime is still usable
    assert z.cpu().tolist() == [2.0, 2.0]
