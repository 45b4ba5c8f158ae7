"""torch_xla 2.9 replaces `torch.nn.GRU` at import with its scan-based GRU
(torch_xla/_patched_functions.py, pytorch/xla#9010), which runs only on XLA
tensors: in a process that imported torch_xla, an `nn.GRU` on CPU tensors (a
CPU reference run, CPU evaluation) raises. The upstream class stays at
`nn.GRU._orig`. Pinned: fails once upstream changes, then update
docs/upstream/torch_xla_scan_gru_on_cpu.md. On XLA the scan's body is traced
inside the region, so its matmuls take the policy's dtype."""
import pytest
import torch
import torch.nn as nn
import torch_xla
from torch_xla.experimental.gru import GRU as ScanGRU

from tests.support.fp8 import dots

import xla_amp


def test_nn_gru_is_torch_xlas_scan_gru_and_refuses_cpu_tensors(device):
    # `device` first: the scan traces its step with autograd on the CPU, and a
    # process whose first backward runs there before the XLA runtime started
    # fails every later XLA backward (test_xla_known_issues.py)
    assert nn.GRU is ScanGRU and nn.GRU._orig.__module__ == "torch.nn.modules.rnn"
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="to be XLA tensors"):
        nn.GRU(8, 8)(torch.randn(5, 2, 8))
    out, h = nn.GRU._orig(8, 8)(torch.randn(5, 2, 8))  # the workaround
    assert out.shape == (5, 2, 8) and h.shape == (1, 2, 8)


@pytest.mark.parametrize("policy,low", [("tpu", "bf16"), ("cuda", "f16"), ("cpu", "bf16")])
def test_the_scan_grus_matmuls_take_the_policys_dtype(device, policy, low):
    """Both of its dots (the input projection, the recurrent one inside the
    while loop) in the region's dtype; the outputs float32, as the float32
    hidden state carries them (torch's CPU autocast gives a GRU float32 too;
    CUDA's gives float16, where the cuda rules' aten::gru entry never applies
    to this module: docs/policies.md, "Recurrent networks")."""
    torch.manual_seed(0)
    gru = nn.GRU(8, 8).to(device)
    with xla_amp.autocast(device, policy=policy):
        out, h = gru(torch.randn(5, 2, 8).to(device))
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([out, h])
    operands = [kinds for _, kinds, _, _ in dots(hlo)]
    assert " while(" in hlo and operands == [(low, low)] * 2, operands
    assert out.dtype == h.dtype == torch.float32
