"""PyTorch/XLA 2.9 lowering defects behind the engine's XLA adaptations
(xla_amp/policies/_xla_adaptations.toml), pinned without autocast.

Each test reproduces the defect with plain torch_xla (the mislabelling ones
never run the graph: some of them XLA would refuse) and fails once the
defect is gone: then drop the adaptation entry that cites it (see
docs/policies.md, "XLA adaptations").
"""
import re

import pytest
import torch
import torch.nn.functional as F
import torch_xla

_HLO_TYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def hlo_dtype(t):
    """The element type the HLO computes for `t` (not its aten label)."""
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([t])
    return _HLO_TYPES[re.search(r"ROOT %\S+ = \((\w+)\[", hlo).group(1)]


def _stats(device):
    return torch.zeros(4, device=device), torch.ones(4, device=device)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_batch_norm_mixed_input_mislabelled(device, low):
    """A bf16/fp16 input with fp32 weights (what the cuda and cpu rules give
    a BatchNorm): the output and the input gradient are labelled with the
    input's dtype while the HLO computes them in f32."""
    w = torch.ones(4, device=device, requires_grad=True)
    x = torch.randn(2, 4, 5, 5, device=device).to(low).requires_grad_()
    y = F.batch_norm(x, *_stats(device), w, None, True)
    assert y.dtype == low and hlo_dtype(y) == torch.float32
    g, = torch.autograd.grad(y.float().sum(), x)
    assert g.dtype == low and hlo_dtype(g) == torch.float32


def test_batchnorm_bf16_input_then_maxpool_backward_fails(device):
    """The consequence in a ResNet: max_pool2d's backward after that
    BatchNorm builds a select-and-scatter mixing f32 and bf16, which XLA's
    verifier rejects at the sync."""
    bn = torch.nn.BatchNorm2d(4).to(device)
    x = torch.randn(2, 4, 8, 8, device=device).bfloat16().requires_grad_()
    y = F.max_pool2d(bn(x), 2)
    y.float().sum().backward()
    with pytest.raises((RuntimeError, ValueError), match="mixed precision is disallowed"):
        torch_xla.sync()
    del bn, x, y  # drop the unrunnable graph so later syncs do not retry it
    z = torch.ones(2, device=device) * 2  # the runtime is still usable
    assert z.cpu().tolist() == [2.0, 2.0]


def test_where_mixed_mislabelled(device):
    """where(cond, bf16, fp32): eager promotes to float32; PyTorch/XLA's HLO
    does too but labels the result bfloat16."""
    a = torch.randn(4).bfloat16()
    b = torch.randn(4)
    assert torch.where(a > 0, a, b).dtype == torch.float32  # eager, CPU
    y = torch.where(a.to(device) > 0, a.to(device), b.to(device))
    assert y.dtype == torch.bfloat16 and hlo_dtype(y) == torch.float32


def test_remainder_mixed_mislabelled(device):
    a = torch.randn(4).bfloat16()
    b = torch.rand(4) + 1
    assert torch.remainder(a, b).dtype == torch.float32  # eager, CPU
    y = torch.remainder(a.to(device), b.to(device))
    assert y.dtype == torch.bfloat16 and hlo_dtype(y) == torch.float32


def test_unscale_bf16_grads_mixed_multiply(device):
    """torch._amp_foreach_non_finite_check_and_unscale_ on bf16 gradients
    (bf16 weights, xla_amp.cast_module) multiplies them by the f32 inverse
    scale without a convert: XLA refuses the graph. xla_amp.GradScaler
    unscales such gradients in f32 (grad_scaler.py); drop that once this
    test fails."""
    grads = [torch.randn(4, 4).bfloat16().to(device)]
    found = torch.zeros((), device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor(0.5).to(device))
    assert grads[0].dtype == torch.bfloat16
    hlo = torch_xla._XLAC._get_xla_tensors_hlo(grads)
    assert re.search(r"f32\[4,4\]\S* multiply\(bf16\[4,4\]", hlo), hlo


def test_amax_without_dims_reduces_nothing(device):
    """Tensor.amax() with no dim: CPU eager reduces over every dimension,
    PyTorch/XLA 2.9 over none (the tensor comes back whole). xla_amp.fp8's
    amax uses .abs().max() (fp8/_quant.py); switch back once this fails."""
    x = torch.randn(3, 4)
    assert x.amax().shape == torch.Size([])
    assert x.to(device).amax().shape == torch.Size([3, 4])
    assert x.to(device).max().shape == torch.Size([])


_CPU_BACKWARD_FIRST = """
import torch, torch_xla
a = torch.randn(3, requires_grad=True)
(a * 2).sum().backward()             # the process's first backward, on the CPU
w = torch.randn(4, device=torch_xla.device(), requires_grad=True)
try:
    (w * 2).sum().backward()
    print("ok")
except RuntimeError as e:
    print("failed:", str(e)[:120])
"""


def test_xla_backward_after_a_first_cpu_backward_fails():
    """The autograd engine sizes its per-device queues at the first backward
    of the process; when that one runs on the CPU before the XLA runtime has
    started, a later XLA backward hits an internal assert. Tests that run a
    CPU backward take the `device` fixture first (test_torchax_step.py).
    When this fails, that precaution can go."""
    import os
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _CPU_BACKWARD_FIRST], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PJRT_DEVICE="CPU"))
    assert "device_ready_queues_" in proc.stdout, proc.stdout + proc.stderr[-2000:]
