"""Custom operators (torch.library) autocast when a policy lists them."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import xla_amp
from xla_amp import policies

# Defined with the low-level torch.library API: a composite kernel serves XLA.
_lib = torch.library.Library("xla_amp_test", "DEF")
_lib.define("scaled_mm(Tensor a, Tensor b, float scale) -> Tensor")
_lib.impl("scaled_mm", lambda a, b, scale: torch.mm(a, b) * scale,
          "CompositeExplicitAutograd")


# Defined with the torch.library.custom_op decorator.
@torch.library.custom_op("xla_amp_test::pair_dist", mutates_args=())
def pair_dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).pow(2).sum(-1)


def _mats(device):
    torch.manual_seed(0)
    return torch.randn(4, 4).to(device), torch.randn(4, 4).to(device)


_lib.define("unlisted_mm(Tensor a, Tensor b) -> Tensor")
_lib.impl("unlisted_mm", lambda a, b: torch.mm(a, b) + 1, "CompositeExplicitAutograd")
_lib.define("once_listed_mm(Tensor a, Tensor b) -> Tensor")
_lib.impl("once_listed_mm", lambda a, b: torch.mm(a, b) + 1, "CompositeExplicitAutograd")


def test_unlisted_custom_op_is_not_autocast_but_its_inner_ops_are(device):
    """As in PyTorch: no cast at the custom op; the aten ops it calls are
    autocast by the policy (mm in bf16, the + in bf16 by type promotion)."""
    a, b = _mats(device)
    with xla_amp.autocast(device, policy="cpu"):
        got = torch.ops.xla_amp_test.unlisted_mm(a, b)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), (torch.mm(a.bfloat16(), b.bfloat16()) + 1).cpu())


def test_custom_op_listed_by_another_policy_keeps_inner_autocast(device):
    """An op with an engine kernel, unlisted in the active policy, behaves as
    if no kernel were there: its inner ops are autocast."""
    a, b = _mats(device)
    other = policies.get("cpu").with_overrides(fp32=["xla_amp_test::once_listed_mm"])
    with xla_amp.autocast(device, policy=other):
        pass   # compiling `other` registers a kernel for the op
    with xla_amp.autocast(device, policy="cpu"):
        assert torch.ops.xla_amp_test.once_listed_mm(a, b).dtype == torch.bfloat16


def test_custom_op_in_lower_precision(device):
    a, b = _mats(device)
    p = policies.get("cpu").with_overrides(lower_precision_fp=["xla_amp_test::scaled_mm"])
    assert p.category("xla_amp_test::scaled_mm") == "lower_precision_fp"
    with xla_amp.autocast(device, policy=p):
        got = torch.ops.xla_amp_test.scaled_mm(a, b, 0.5)
    want = torch.ops.xla_amp_test.scaled_mm(a.bfloat16(), b.bfloat16(), 0.5)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), want.cpu())
    # the op's inner mm ran below autocast: it was cast once, at the custom op
    with xla_amp.autocast(device, policy=p.with_overrides(fp32=["aten::mm"])):
        assert torch.ops.xla_amp_test.scaled_mm(a, b, 0.5).dtype == torch.bfloat16


def test_custom_op_decorator_in_fp32_and_promote(device):
    a, b = _mats(device)
    p = policies.get("cuda").with_overrides(fp32=["xla_amp_test::pair_dist"])
    with xla_amp.autocast(device, policy=p, dtype=torch.bfloat16):
        got = pair_dist(a.bfloat16(), b.bfloat16())
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), pair_dist(a.bfloat16().float(), b.bfloat16().float()).cpu())
    q = policies.get("cuda").with_overrides(promote=["xla_amp_test::pair_dist"])
    with xla_amp.autocast(device, policy=q, dtype=torch.bfloat16):
        assert pair_dist(a.bfloat16(), b).dtype == torch.float32
        assert pair_dist(a.bfloat16(), b.bfloat16()).dtype == torch.bfloat16


def test_unknown_custom_op_is_an_error():
    with pytest.raises(ValueError, match="unknown op 'xla_amp_test::scaled_mmm'.*"
                                         "xla_amp_test::scaled_mm"):
        policies.get("cpu").with_overrides(fp32=["xla_amp_test::scaled_mmm"])


def test_custom_op_defined_later_is_found(device):
    with pytest.raises(ValueError, match="xla_amp_test::late_op"):
        policies.get("cpu").with_overrides(fp32=["xla_amp_test::late_op"])
    lib = torch.library.Library("xla_amp_test", "FRAGMENT")
    lib.define("late_op(Tensor a) -> Tensor")
    lib.impl("late_op", lambda a: a * 2, "CompositeExplicitAutograd")
    p = policies.get("cpu").with_overrides(fp32=["xla_amp_test::late_op"])
    x = torch.randn(3).to(device).bfloat16()
    with xla_amp.autocast(device, policy=p):
        assert torch.ops.xla_amp_test.late_op(x).dtype == torch.float32


def test_custom_op_from_environment_file(tmp_path):
    """A custom op defined before `import xla_amp` can be listed in an env file."""
    f = tmp_path / "lower.txt"
    f.write_text("mylib::scaled_mm\naten::mm\n")
    script = textwrap.dedent("""
        import torch, torch_xla
        lib = torch.library.Library("mylib", "DEF")
        lib.define("scaled_mm(Tensor a, Tensor b, float scale) -> Tensor")
        lib.impl("scaled_mm", lambda a, b, s: torch.mm(a, b) * s, "CompositeExplicitAutograd")
        import xla_amp
        d = torch_xla.device()
        a = torch.randn(4, 4).to(d)
        with xla_amp.autocast(d):
            print("DTYPE", torch.ops.mylib.scaled_mm(a, a, 2.0).dtype)
    """)
    env = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_AMP_LOWER_PRECISION_OPS_LIST": str(f)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DTYPE torch.bfloat16" in r.stdout
