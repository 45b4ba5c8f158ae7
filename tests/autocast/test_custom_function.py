"""custom_fwd / custom_bwd on XLA: casting, and backward under the forward's policy."""
import torch

import xla_amp
from xla_amp import autocast, policies


class ScaledMM(torch.autograd.Function):
    """mm whose backward records the dtype its own matmul ran in."""
    seen = {}

    @staticmethod
    @xla_amp.custom_fwd
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ScaledMM.seen["fwd_enabled"] = torch.is_autocast_enabled("xla")
        return torch.mm(a, b)

    @staticmethod
    @xla_amp.custom_bwd
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ScaledMM.seen["bwd_enabled"] = torch.is_autocast_enabled("xla")
        grad_a = torch.mm(grad.float(), b.t().float())
        ScaledMM.seen["bwd_mm_dtype"] = grad_a.dtype
        return grad_a.float(), torch.mm(a.t().float(), grad.float()).float()


class FP32Only(torch.autograd.Function):
    @staticmethod
    @xla_amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, a):
        FP32Only.inside = (torch.is_autocast_enabled("xla"), a.dtype)
        return a * 2

    @staticmethod
    @xla_amp.custom_bwd
    def backward(ctx, grad):
        return grad * 2


def test_backward_runs_with_forward_autocast_and_policy(device):
    a = torch.randn(4, 4, device=device, requires_grad=True)
    b = torch.randn(4, 4, device=device, requires_grad=True)
    # A policy where mm stays fp32: if backward used the default (hardware)
    # policy instead of this one, its mm would run in bf16.
    p = policies.get("tpu").with_overrides(name="mm-fp32", fp32=["aten::mm"])
    with autocast(device, policy=p):
        out = ScaledMM.apply(a, b)
    out.float().sum().backward()
    assert ScaledMM.seen == {"fwd_enabled": True, "bwd_enabled": True,
                             "bwd_mm_dtype": torch.float32}
    with autocast(device, policy="tpu"):
        out = ScaledMM.apply(a, b)
    out.float().sum().backward()
    assert ScaledMM.seen["bwd_mm_dtype"] == torch.bfloat16


def test_cast_inputs_runs_forward_in_fp32_without_autocast(device):
    x = torch.randn(3, device=device).bfloat16().requires_grad_()
    with autocast(device, policy="tpu"):
        y = FP32Only.apply(x)
    assert FP32Only.inside == (False, torch.float32)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_outside_autocast_is_transparent(device):
    x = torch.randn(3, device=device, requires_grad=True)
    y = FP32Only.apply(x)
    assert FP32Only.inside == (False, torch.float32)
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
