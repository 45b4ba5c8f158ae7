"""xla_amp.cast_module: bf16 weights in place, kept modules untouched."""
import pytest
import torch
from torch import nn

import xla_amp
from xla_amp import autocast

from tests.support import assert_same


def _model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Sequential(nn.Flatten(), nn.LayerNorm(8 * 6 * 6)),
                         nn.Linear(8 * 6 * 6, 4)).to(device)


def test_casts_params_and_float_buffers_except_kept(device):
    model = _model(device)
    ref = {n: t.clone() for n, t in model.state_dict().items()}
    assert xla_amp.cast_module(model, torch.bfloat16, keep=(nn.BatchNorm2d, nn.Sequential)) \
        is model
    # the root is an nn.Sequential too: keep covers a module and all inside it
    assert {t.dtype for t in model.state_dict().values()} == {torch.float32, torch.int64}

    model = _model(device)
    ids = {n: id(p) for n, p in model.named_parameters()}
    xla_amp.cast_module(model, torch.bfloat16, keep=(nn.BatchNorm2d,))
    for name, t in model.state_dict().items():
        if name.startswith("1."):  # the BatchNorm
            assert t.dtype == ref[name].dtype, name
        elif name.endswith("num_batches_tracked"):
            assert t.dtype == torch.int64
        else:
            assert t.dtype == torch.bfloat16, name
            assert_same(t, ref[name].to(torch.bfloat16), name)
    assert {n: id(p) for n, p in model.named_parameters()} == ids  # same Parameters


def test_bf16_model_trains_with_kept_norm_under_autocast(device):
    """bf16 weights, BatchNorm kept fp32, tpu rules: forward and backward
    run (the XLA adaptation computes the mixed batch norm in fp32) and each
    gradient has its parameter's dtype."""
    model = xla_amp.cast_module(_model(device), torch.bfloat16, keep=(nn.BatchNorm2d, nn.LayerNorm))
    x = torch.randn(2, 3, 8, 8).to(device)
    with autocast(device, policy="tpu"):
        out = model(x)
    out.float().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad.dtype == p.dtype, name
        assert torch.isfinite(p.grad.cpu()).all(), name


def test_bad_arguments_name_the_culprit(device):
    model = _model(device)
    with pytest.raises(ValueError, match="torch.int8"):
        xla_amp.cast_module(model, torch.int8)
    with pytest.raises(ValueError, match="keep entry 'norm'"):
        xla_amp.cast_module(model, torch.bfloat16, keep=(nn.BatchNorm2d, "norm"))
    with pytest.raises(TypeError, match="nn.Module"):
        xla_amp.cast_module([model], torch.bfloat16)
    assert {t.dtype for t in model.state_dict().values()} == {torch.float32, torch.int64}
