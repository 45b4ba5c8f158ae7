"""Conformance of the cuda, cpu, xpu and hpu policies (eager): every op a
policy names computes what a hand cast computes, and what PyTorch's own
autocast gives. Cases: tests.support.conformance_cases; machinery: tests.support.conformance.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import xla_amp

from tests.support.conformance import (CRASHES, HOST_LIMITS, LOW, NON_CONFORMANT, PARAMS, RAISES,
                                 RANDOM, assert_bitwise, build, build_float32, input_dtypes,
                                 run_xla, seed, skipped, tensors)
from tests.support.conformance_cases import CASES


@pytest.mark.parametrize("policy,entry,category,key", PARAMS)
def test_matches_manual_cast(device, policy, entry, category, key):
    """Under the policy the op computes exactly what a hand cast computes."""
    if skipped(policy, key, category):
        pytest.skip(skipped(policy, key, category))
    if (policy, key) == ("cuda", "py::cross_entropy"):
        pytest.skip("not a single cast under CUDA rules: test_cuda_cross_entropy_composes_like_pytorch")
    if category == "banned":
        case, floats, extra = build_float32(key, device)
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            with xla_amp.autocast(device, policy=policy):
                case.call(*floats, *extra)
        return
    got, want = run_xla(device, policy, category, key, LOW)
    assert_bitwise(got, want, key)
    if category == "lower_precision_fp":
        assert got and got[0].dtype == LOW
    elif category in ("fp32", "fp32_set_opt_dtype", "fp32_append_dtype"):
        floating = [t for t in got if t.is_floating_point() or t.is_complex()]
        # (an op with only integer outputs, e.g. a rank, is checked by value)
        assert all(t.dtype in (torch.float32, torch.complex64) for t in floating)
    elif category is None:
        assert all(t.dtype == LOW for t in got if t.is_floating_point())


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_cuda_cross_entropy_composes_like_pytorch(device, low):
    """PyTorch has no CUDA autocast kernel for cross_entropy_loss: its
    composite calls log_softmax with dtype= the input's dtype (explicit, so
    not widened) and then nll_loss (fp32). The cuda policy computes exactly
    that, which is not the same as casting the input to fp32 first."""
    seed()
    x = torch.randn(3, 5, device=device).to(low)
    t = torch.tensor([1, 0, 4], device=device)
    with xla_amp.autocast(device, policy="cuda", dtype=low):
        got = F.cross_entropy(x, t)
    want = F.nll_loss(torch.log_softmax(x, 1, dtype=low).float(), t)
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), want.cpu())


# ---- PyTorch's own autocast as the reference --------------------------------

def _cpu_autocast_result(category, key, dtype):
    case, floats, extra = build(key, input_dtypes(category, len(CASES[key].inputs())),
                                 lambda t: t)
    seed()
    with torch.autocast("cpu", dtype=dtype):
        return tensors(case.call(*floats, *extra))


CPU_PARAMS = [p for p in PARAMS if p.values[0] == "cpu"]


@pytest.mark.parametrize("policy,entry,category,key", CPU_PARAMS)
def test_cpu_policy_matches_torch_cpu_autocast(device, policy, entry, category, key):
    """'cpu' gives the dtypes torch.autocast('cpu') gives, and close values."""
    if skipped(policy, key, category, cpu_reference=True):
        pytest.skip(skipped(policy, key, category, cpu_reference=True))
    ref = _cpu_autocast_result(category, key, LOW)
    got, _ = run_xla(device, policy, category, key, LOW)
    assert [t.dtype for t in got] == [t.dtype for t in ref]
    if key in RANDOM or key in XLA_WRONG_VALUES:
        return
    for g, r in zip(got, ref):
        if not (g.is_floating_point() or g.is_complex()):
            continue
        tol = {torch.bfloat16: 5e-2, torch.float16: 1e-2}.get(g.dtype, 2e-3)
        torch.testing.assert_close(g.cpu(), r, rtol=tol, atol=tol, equal_nan=True)


def _fake_autocast_dtypes(device_type, category, key, dtype):
    """Output dtypes of PyTorch's own autocast for `device_type` ('cuda'),
    measured on fake tensors of that device (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    with mode:
        case, floats, extra = build(
            key, input_dtypes(category, len(CASES[key].inputs())),
            lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device_type))
        prev = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        torch.set_autocast_enabled(device_type, True)
        torch.set_autocast_dtype(device_type, dtype)
        try:
            return [t.dtype for t in tensors(case.call(*floats, *extra))]
        finally:
            torch.set_autocast_enabled(device_type, prev[0])
            torch.set_autocast_dtype(device_type, prev[1])
            torch.clear_autocast_cache()


CUDA_PARAMS = [p for p in PARAMS if p.values[0] == "cuda"]
# Calls PyTorch cannot trace on fake CUDA tensors (no meta kernel / data-
# dependent shapes); their category is checked against the manual cast only.
FAKE_UNSUPPORTED = {
    "aten::conv2d", "aten::conv_transpose2d", "aten::_convolution",
    "aten::_convolution.deprecated",           # cuDNN availability checks
    "aten::scaled_dot_product_attention",      # picks a CUDA backend kernel
    "aten::gru_cell",                          # _thnn_fused_gru_cell: no meta kernel
    "aten::grid_sampler", "py::grid_sample",   # cuDNN availability checks
    # the recurrent networks: cuDNN's RNN asks the CUDA driver (_cudnn_rnn, cast
    # whole by AutocastCUDA; docs/policies.md, "Recurrent networks")
    *(f"aten::{op}.{form}" for op in ("lstm", "gru", "rnn_tanh", "rnn_relu")
      for form in ("input", "data")),
}


@pytest.mark.parametrize("policy,entry,category,key", CUDA_PARAMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_cuda_policy_matches_torch_cuda_autocast(device, policy, entry, category, key, dtype):
    """'cuda' gives the dtypes PyTorch's CUDA autocast gives (and raises where
    it raises), measured with PyTorch's AutocastCUDA kernels on fake tensors."""
    if skipped(policy, key, category):
        pytest.skip(skipped(policy, key, category))
    if category == "banned":
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            _fake_autocast_dtypes("cuda", category, key, dtype)
        return
    if key in FAKE_UNSUPPORTED:
        with pytest.raises(Exception):
            _fake_autocast_dtypes("cuda", category, key, dtype)
        return
    ref = _fake_autocast_dtypes("cuda", category, key, dtype)
    got, _ = run_xla(device, policy, category, key, dtype)
    assert [t.dtype for t in got] == ref





_CRASH_SCRIPT = """
import torch, torch_xla
d = torch_xla.device()
x = torch.randn(1, 2, 4, 4).to(d)
g = (torch.rand(1, 3, 3, 2) * 2 - 1).to(d)
print(torch.ops.aten.{op}(x, g, 0, 0, False).cpu().shape)
"""


@pytest.mark.parametrize("policy,key", [(p, k) for p, ks in NON_CONFORMANT.items() for k in ks])
def test_non_conformant_pinned(device, policy, key):
    """Today these ops fail on XLA with and without autocast; if one starts
    to work, move it back to the conformance tests and out of docs/policies.md."""
    if key in CRASHES:   # plain torch_xla, in a child process
        import os
        import subprocess
        import sys
        op = key.split("::")[1]
        r = subprocess.run([sys.executable, "-c", _CRASH_SCRIPT.format(op=op)],
                           env={**os.environ, "PJRT_DEVICE": "CPU"},
                           capture_output=True, text=True, timeout=300)
        assert r.returncode < 0 and "torch.Size" not in r.stdout, (r.returncode, r.stdout)
        return
    case, floats, extra = build_float32(key, device)
    exc, match = RAISES.get(key, (NotImplementedError, "Could not run"))
    with pytest.raises(exc, match=match):
        case.call(*floats, *extra)
    with pytest.raises(exc, match=match):
        with xla_amp.autocast(device, policy=policy):
            case.call(*floats, *extra)


@pytest.mark.parametrize("key", sorted(HOST_LIMITS))
def test_host_limits_pinned(key):
    """Where a host limit was detected, plain CPU eager in bfloat16 -- no
    XLA, no autocast -- raises; when torch computes it, the case runs again."""
    case = CASES[key]
    with pytest.raises(RuntimeError, match="primitive descriptor"):
        case.call(*[t.to(torch.bfloat16) for t in case.inputs()])


def test_non_conformance_documented():
    text = (Path(__file__).parents[2] / "docs" / "policies.md").read_text()
    for policy, keys in NON_CONFORMANT.items():
        for key in keys:
            assert f"`{key}`" in text and f"`{policy}`" in text, (policy, key)


# PyTorch/XLA lowerings that compute wrong values whatever the dtype: the
# policy casts as PyTorch does (bit-equal to the manual cast), but the op's
# values differ from ATen's. Listed in docs/policies.md; pinned below.
XLA_WRONG_VALUES = {
    "aten::conv_tbc": "PyTorch/XLA 2.9's conv_tbc lowering returns wrong values "
                      "(also in float32 without autocast)",
}


def test_xla_conv_tbc_wrong_values_pinned(device):
    """conv_tbc with a width-1 kernel is x @ w[0] + b; XLA's result is not.
    When this starts failing, XLA fixed it: drop the entry and the doc line."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 2, 4), torch.randn(1, 4, 5), torch.randn(5)
    ref = x @ w[0] + b
    assert torch.allclose(torch.conv_tbc(x, w, b), ref, atol=1e-5)
    xla = torch.conv_tbc(x.to(device), w.to(device), b.to(device)).cpu()
    assert not torch.allclose(xla, ref, atol=1e-2)


def test_xla_wrong_values_documented():
    text = (Path(__file__).parents[2] / "docs" / "policies.md").read_text()
    for key in XLA_WRONG_VALUES:
        assert f"`{key}`" in text

