"""Float32 matmul precision on torchax: under a region, the
dots and convolutions whose inputs are float32 -- an "fp32" module rule's,
the fp32 category's, an op the policy leaves in float32 -- carry the
region's precision in the lowered program (HLO operand_precision), per
region, per policy and per module rule; low-precision dots carry none and
fp8 dots not the region's (their recipe's fast accumulation:
test_torchax_fp8.py); a bad name is refused in one line."""
from __future__ import annotations

import re

import optax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.support.torchax_env as helpers_torchax  # noqa: F401  (JAX on CPU)

import xla_amp.torchax as xt
from xla_amp import policies

pytestmark = pytest.mark.torchax


def _dots(hlo: str) -> set:
    """{(result type, operand_precision or '')} of every dot and convolution."""
    out = set()
    for line in hlo.splitlines():
        m = re.search(r"= (\w+)\[[^\]]*\]\S* (dot|convolution)\(", line)
        if m:
            p = re.search(r"operand_precision=\{(\w+)", line)
            out.add((m.group(1), p.group(1) if p else ""))
    return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.body, self.head = nn.Linear(64, 32), nn.Linear(32, 32)

    def forward(self, x):
        h = self.body(self.conv(x).flatten(1)[:, :64])
        # cholesky_inverse (a float32 dot in torchax): the fp32 category under
        # tpu and cpu, left in float32 (no category) under cuda
        tri = torch.eye(16, device=h.device) + h.detach().float()[:16, :16].tril() * 0.01
        return self.head(h) + torch.cholesky_inverse(tri).mean()


def _hlo(policy, rules=None, **kw):
    torch.manual_seed(0)
    model = Net()
    if rules:
        xt.module_policies(model, rules)
    step = xt.make_train_step(model, lambda o, y: F.mse_loss(o.float(), y), optax.sgd(0.1),
                              policy=policy, **kw)
    return _dots(step.lower(torch.randn(16, 2, 8, 8), torch.randn(16, 32)).as_text(dialect="hlo"))


@pytest.mark.parametrize("policy,low,want", [("cuda", "f16", "highest"), ("cpu", "bf16", "highest"),
                                             ("tpu", "bf16", "")])
def test_each_policy_gives_its_precision_to_float32_dots_only(policy, low, want):
    got = _hlo(policy, rules={"head": "fp32"})
    assert {p for t, p in got if t == low} == {""}, got       # low precision: none
    # the fp32 rule's head: highest; cholesky_inverse outside it: the policy's
    assert {p for t, p in got if t == "f32"} == {"highest", want}, got
    body = _hlo(policy)  # no module rule: cholesky_inverse's dot takes the policy's value
    assert {p for t, p in body if t == "f32"} == {want}, body


def test_per_region_override_and_bad_value():
    got = _hlo("tpu", fp32_matmul_precision="high")
    assert {p for t, p in got if t == "f32"} == {"high"} and {p for t, p in got if t == "bf16"} == {""}
    with pytest.raises(ValueError, match="fp32_matmul_precision must be one of highest, high, "
                                         "default, got 'ieee'"):
        xt.autocast("jax", fp32_matmul_precision="ieee")


def test_a_module_rule_carries_its_policys_precision():
    """A rule's policy decides inside its module: tpu outside (default), the
    head under the tpu rules at "highest"."""
    rule = policies.get("tpu").with_overrides(fp32_matmul_precision="highest",
                                              fp32=["aten::linear"])
    got = _hlo("tpu", rules={"head": rule})
    assert got == {("f32", "highest"), ("f32", ""), ("bf16", "")}, got  # "": cholesky_inverse


def test_the_rule_tuple_form_and_its_bad_options():
    """{module: ("fp32", {"fp32_matmul_precision": ...})}: the fp32 rule (inputs
    in float32) at the given precision; an unknown option or value is refused."""
    got = _hlo("tpu", rules={"head": ("fp32", {"fp32_matmul_precision": "high"})})
    assert ("f32", "high") in got and ("f32", "highest") not in got, got
    with pytest.raises(ValueError, match="rule 'head': unknown option 'precision'"):
        _hlo("tpu", rules={"head": ("fp32", {"precision": "high"})})
    with pytest.raises(ValueError, match="rule 'head': with_overrides: fp32_matmul_precision "
                                         "must be one of"):
        _hlo("tpu", rules={"head": ("tpu", {"fp32_matmul_precision": "fast"})})
