"""ShardedPrecision's reduce_dtype: the covered modules' backward computes
weight gradients in float32 (xla_amp/sharded/_reduce.py), so XLA's
partitioner sums their partial sums in float32. Here, one device: the
forward is unchanged bit for bit, the gradients equal autograd's where
nothing is below float32, and the dtypes are the parameters'. The mesh
run (tests/sharded/_sharded_reduce.py, make sharded) checks the collectives."""
import dataclasses
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

from xla_amp.sharded import ShardedPrecision
from xla_amp.sharded import _reduce

HERE = os.path.dirname(os.path.abspath(__file__))


def _hf_conv1d():
    from transformers.pytorch_utils import Conv1D
    return Conv1D(6, 4)


MODULES = {
    "linear": (lambda: nn.Linear(4, 6), lambda: torch.randn(3, 5, 4)),
    "linear_nobias": (lambda: nn.Linear(4, 6, bias=False), lambda: torch.randn(3, 4)),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), lambda: torch.randn(2, 3, 8, 8)),
    "conv1d_groups": (lambda: nn.Conv1d(4, 4, 3, groups=2), lambda: torch.randn(2, 4, 9)),
    "embedding": (lambda: nn.Embedding(10, 4, padding_idx=0),
                  lambda: torch.tensor([[0, 3, 3], [9, 0, 1]])),
    "layer_norm": (lambda: nn.LayerNorm(4), lambda: torch.randn(3, 4)),
    "hf_conv1d": (_hf_conv1d, lambda: torch.randn(4, 8, 4)),
}


def _grads(module, x, device, autocast=False):
    module.zero_grad()
    x = x.to(device)
    if x.is_floating_point():
        x.requires_grad_(True)
    with torch.autocast("xla", enabled=autocast, dtype=torch.bfloat16):
        y = module(x)
    # weights exact in bf16: the gradient reaching the module is exact in either dtype
    c = ((torch.arange(y.numel(), device=device) % 5) - 2).reshape(y.shape) * 0.5
    (y.float() * c).sum().backward()
    out = {n: p.grad.cpu() for n, p in module.named_parameters()}
    if x.is_floating_point():
        out["input"] = x.grad.cpu()
    return y.detach().cpu(), out


@pytest.mark.parametrize("name", MODULES)
def test_covered_backward_matches_autograd_in_float32(name, device):
    make, data = MODULES[name]
    torch.manual_seed(0)
    plain, x = make().to(device), data()
    ours = _reduce_copy(plain)
    y0, g0 = _grads(plain, x, device)
    y1, g1 = _grads(ours, x, device)
    assert torch.equal(y0, y1)
    for k in g0:
        assert g1[k].dtype == g0[k].dtype
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=f"{name} {k}")


@pytest.mark.parametrize("name", ["linear", "conv2d", "hf_conv1d"])
def test_under_bf16_autocast_forward_unchanged_weight_grad_summed_in_float32(name, device):
    make, data = MODULES[name]
    torch.manual_seed(0)
    plain, x = make().to(device), data()
    ours = _reduce_copy(plain)
    y0, g0 = _grads(plain, x, device, autocast=True)
    y1, g1 = _grads(ours, x, device, autocast=True)
    assert y1.dtype == torch.bfloat16 and torch.equal(y0, y1)
    # float32 sums of the same bf16 operands: closer to a float64 reference
    ref = _grads(_to64(plain), _bf16_valued(x), "cpu")[1]
    for k in g0:
        assert g1[k].dtype == g0[k].dtype == torch.float32
        if k == "input":  # still the forward's dtype: equal up to one bf16 rounding
            # (XLA:CPU keeps one path's bf16 product in f32: excess precision)
            torch.testing.assert_close(g1[k], g0[k], rtol=2**-7, atol=1e-6)
    w = "weight"
    err_ours = (g1[w].double() - ref[w]).abs().max()
    err_plain = (g0[w].double() - ref[w]).abs().max()
    assert err_ours <= err_plain, (name, float(err_ours), float(err_plain))
    if name != "hf_conv1d":  # (XLA:CPU keeps addmm's bf16 gradient product in f32 too)
        assert err_ours < err_plain, (name, float(err_ours), float(err_plain))


def _reduce_copy(module):
    import copy
    ours = copy.deepcopy(module)
    assert _reduce.install(ours, torch.float32) == []
    return ours


def _to64(module):
    import copy
    m = copy.deepcopy(module).cpu().double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).double())
    return m


def _bf16_valued(x):
    return x.to(torch.bfloat16).double() if x.is_floating_point() else x


def test_precision_installs_once_and_names_what_it_does_not_cover(device):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).to(device)
    p = ShardedPrecision.bf16_master()
    assert p.summed_in is torch.float32
    with pytest.warns(UserWarning, match=r"1\.weight, 1\.bias are summed in the dtype"):
        p.cast(model)
    forward = model[0].forward
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p.cast(model)
    assert model[0].forward == forward  # not wrapped twice
    assert _reduce.uncovered(model) == ["1.weight", "1.bias"]
    # as computed: nothing installed
    plain = nn.Linear(2, 2)
    dataclasses.replace(p, reduce_dtype=torch.bfloat16).cast(plain)
    assert "forward" not in vars(plain)
    assert ShardedPrecision().summed_in is None
    with pytest.raises(ValueError, match="reduce_dtype=torch.float16"):
        dataclasses.replace(p, reduce_dtype=torch.float16)


@pytest.mark.sharded  # a 2-device subprocess with XLA's dumps: make sharded
def test_partitioner_sums_gradients_in_reduce_dtype():
    got = {}
    for rdt in ("float32", "bfloat16"):
        proc = subprocess.run([sys.executable, os.path.join(HERE, "_sharded_reduce.py"), rdt],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[rdt] = json.loads(proc.stdout.strip().splitlines()[-1])
    # the gradient partial sums XLA reduces (parameter-shaped all-reduces /
    # reduce-scatters of the partitioned step): float32 with the default,
    # bfloat16 when asked to sum as computed (so this test can fail)
    assert got["float32"]["param_sums"] and got["bfloat16"]["param_sums"], got
    assert all(d == "f32" for d, _ in got["float32"]["param_sums"]), got
    assert any(d == "bf16" for d, _ in got["bfloat16"]["param_sums"]), got
    assert abs(got["float32"]["loss"] - got["bfloat16"]["loss"]) < 1e-6  # the same forward
