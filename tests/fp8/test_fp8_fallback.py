"""A shape that cannot take an fp8 GEMM falls back to the region's dtype:
a call with a token count not a multiple of 16, a layer
`convert(unaligned="keep")` leaves, an e5m2 x e5m2 pair, a float8 type the
backend cannot dot. Each is logged once, naming the layer, and listed in
`report(model).fallback`; the fallback call equals nn.Linear under the same
region bit for bit, and its HLO has no float8 in it."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
import torch_xla

import xla_amp
from xla_amp import fp8
from xla_amp.fp8 import _dot

from tests.support.fp8 import dots, fp8_dot

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _pair():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    converted = fp8.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)))
    converted.load_state_dict(plain.state_dict(), strict=False)
    return plain, converted


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
def test_a_call_with_unaligned_tokens_runs_in_the_region_dtype(device, policy, caplog):
    plain, converted = _pair()
    plain, converted = plain.to(device), converted.to(device)
    x = torch.randn(3, 8, 32, device=device)  # 24 tokens
    with caplog.at_level(logging.WARNING, logger="xla_amp"):
        with xla_amp.autocast(device, policy=policy):
            want, got = plain(x), converted(x)
            converted(x)  # a second call logs nothing more
    lines = [r.getMessage() for r in caplog.records if "xla_amp.fp8" in r.getMessage()]
    assert len(lines) == 2, lines  # one per layer
    assert "layer '0'" in lines[0] and "tokens=24" in lines[0] and "multiple of 16" in lines[0]
    entries = dots(torch_xla._XLAC._get_xla_tensors_hlo([got]))
    assert len(entries) == 2 and not any("f8" in "".join(e[1]) for e in entries), entries
    assert got.dtype == want.dtype == {"tpu": torch.bfloat16, "cuda": torch.float16}[policy]
    assert torch.equal(got.cpu(), want.cpu())
    rep = fp8.report(converted)
    assert [(f.layer, "tokens=24" in f.why) for f in rep.fallback] == [("0", True), ("2", True)]
    assert "fallback: tokens=24" in str(rep)
    # an aligned call afterwards is fp8 again; the report keeps what happened
    y = converted(torch.randn(16, 32, device=device))
    assert sum(fp8_dot(e) for e in dots(torch_xla._XLAC._get_xla_tensors_hlo([y]))) == 2


def test_convert_keep_logs_the_layer_and_report_lists_it(caplog):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    with caplog.at_level(logging.WARNING, logger="xla_amp"):
        fp8.convert(model, unaligned="keep")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "layer '2'" in lines[0] and "(10, 64)" in lines[0], lines
    assert type(model[2]) is nn.Linear and isinstance(model[0], fp8.Fp8Linear)
    rep = fp8.report(model)
    assert [f.layer for f in rep.fallback] == ["2"] and "(10, 64)" in rep.fallback[0].why
    # the default still refuses, naming the layer, the model unchanged
    odd = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 10))
    with pytest.raises(ValueError, match=r"layer '1' has weight shape \(10, 64\)"):
        fp8.convert(odd)
    assert type(odd[0]) is nn.Linear


def test_eligibility_names_each_reason():
    ok = ((E4M3, E4M3), (E5M2, E4M3), (E5M2, E4M3))
    assert _dot.eligible(32, 64, 16, ok, "xla") is None
    assert "tokens=24" in _dot.eligible(24, 64, 16, ok, "xla")
    assert "in=40, out=8" in _dot.eligible(32, 40, 8, ok, "xla")
    assert "e5m2 x e5m2" in _dot.eligible(32, 64, 16, ((E5M2, E5M2),), "xla")
    # a backend that cannot dot a pair (what xla_amp.torchax probes per JAX backend)
    _dot.register_dot("meta", lambda a, b, ca, cb, fast: None, lambda da, db: da != E5M2)
    try:
        why = _dot.eligible(32, 64, 16, ok, "meta")
        assert why == "the meta backend cannot dot float8_e5m2 x float8_e4m3fn", why
    finally:
        del _dot._dots["meta"]


def test_the_dot_is_exact_on_float8_values(device):
    """A product of two float8 values is exact in float32: the engine's dot
    equals the float64 product of the widened operands (up to f32 sums)."""
    torch.manual_seed(0)
    a = (torch.randn(16, 32) * 8).to(E4M3)
    b = (torch.randn(48, 32) * 8).to(E5M2)
    got = torch.ops.xla_amp.fp8_dot(a.to(device), b.to(device), 1, 1).cpu()
    ref = a.double() @ b.double().t()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-6 * ref.abs().max().item())
    assert torch.equal(torch.ops.xla_amp.fp8_dot(a, b, 1, 1), got)  # CPU eager: the same
