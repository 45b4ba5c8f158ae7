"""Attention through jax.nn.dot_product_attention inside regions
(xla_amp/torchax/_attention.py): on a GPU cuDNN's fused kernel (on an H200
the LM step 10.58 -> 8.27 ms, docs/benchmarks.md "The LM on a GPU"), here XLA's implementation of the same call.
Taken for scaled_dot_product_attention in the region's low dtype without a
mask or dropout (GQA included), by default only on a GPU backend; its output
and a trained LM's losses equal torchax's own lowering's; everything else
keeps torchax's lowering; a bad value is refused by name."""
from __future__ import annotations

import re

import jax
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import tests.support.torchax_env as helpers_torchax
from tests.support.gpt_model import GPT, lm_loss

import xla_amp.torchax as xt
from xla_amp import policies

pytestmark = pytest.mark.torchax


@pytest.fixture
def calls(monkeypatch):
    """The calls the engine makes to jax.nn.dot_product_attention."""
    seen, real = [], jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        seen.append((tuple(a.shape for a in args), kwargs))
        return real(*args, **kwargs)
    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return seen


def _sdpa(fused, kv_heads=4, policy="tpu", **kw):
    torch.manual_seed(0)
    # the cuda rules cast attention's inputs; the tpu rules leave it uncategorized,
    # and its inputs come low from the linears before it
    dtype = torch.bfloat16 if policy == "tpu" else torch.float32
    q, k, v = helpers_torchax.to_jax([torch.randn(2, 4, 16, 8, dtype=dtype),
                                      torch.randn(2, kv_heads, 16, 8, dtype=dtype),
                                      torch.randn(2, kv_heads, 16, 8, dtype=dtype)])
    with helpers_torchax.ENV, xt.autocast("jax", policy=policy, fused_attention=fused):
        out = F.scaled_dot_product_attention(q, k, v, **kw)
    return np.asarray(out.jax().astype(np.float32)), str(out.dtype)


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
@pytest.mark.parametrize("kw,kv_heads", [({"is_causal": True}, 4), ({"scale": 0.3}, 4),
                                         ({"is_causal": True, "enable_gqa": True}, 2)],
                         ids=["causal", "scale", "gqa"])
def test_the_fused_call_equals_torchax_lowering(calls, policy, kw, kv_heads):
    got, got_dtype = _sdpa(True, kv_heads, policy, **kw)
    assert len(calls) == 1, calls
    shapes, options = calls[0]
    assert shapes == ((2, 16, 4, 8), (2, 16, kv_heads, 8), (2, 16, kv_heads, 8))  # B T N H
    assert options["implementation"] == "xla" and options["scale"] == kw.get("scale")
    assert options["is_causal"] == kw.get("is_causal", False)
    want, want_dtype = _sdpa(False, kv_heads, policy, **kw)
    assert len(calls) == 1  # fused_attention=False: torchax's own lowering
    assert got_dtype == want_dtype == ("torch.bfloat16" if policy == "tpu" else "torch.float16")
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", ["mask", "dropout", "float32", "float32_uncategorized",
                                  "gqa_without_flag"])
def test_what_the_kernel_cannot_take_keeps_torchax_lowering(calls, case):
    if case == "mask":
        with helpers_torchax.ENV:
            mask = torch.ones(16, 16, dtype=torch.bool).tril().to("jax")
        _sdpa(True, attn_mask=mask)
    elif case == "dropout":
        _sdpa(True, dropout_p=0.5)
    elif case == "float32":  # autocast off inside the region: float32 inputs
        q = helpers_torchax.to_jax([torch.randn(2, 4, 16, 8)])[0]
        with helpers_torchax.ENV, xt.autocast("jax", fused_attention=True), \
                xt.autocast("jax", enabled=False):
            F.scaled_dot_product_attention(q, q, q)
    elif case == "float32_uncategorized":  # rules that leave it uncast, float32 inputs
        rules = policies.get("tpu").with_overrides(
            name="tpu-sdpa-uncast", remove=["aten::scaled_dot_product_attention"])
        with helpers_torchax.ENV, xt.autocast("jax", policy=rules, fused_attention=True):
            q = torch.randn(2, 4, 16, 8, device="jax")
            F.scaled_dot_product_attention(q, q, q)
    else:
        with pytest.raises(RuntimeError):
            _sdpa(True, kv_heads=2)  # torch's own error: heads differ without enable_gqa
    assert calls == [], calls


def test_on_by_default_on_a_gpu_backend_only():
    assert xt.autocast("jax", backend="gpu", policy="cuda").fused_attention is True
    assert xt.autocast("jax", backend="cpu").fused_attention is False
    assert xt.autocast("jax", backend="tpu").fused_attention is False
    assert xt.autocast("jax", backend="cpu", fused_attention=True).fused_attention is True
    assert xt.autocast("jax", backend="gpu", policy="cuda",
                       fused_attention=False).fused_attention is False
    with pytest.raises(ValueError, match="fused_attention must be a bool or None, got 'cudnn'"):
        xt.autocast("jax", fused_attention="cudnn")


def test_a_trained_lm_takes_it_forward_and_backward(calls):
    """GPT (tests/support/gpt_model.py: causal SDPA), bf16 under the tpu rules, 3
    AdamW steps: fused and torchax's lowering give the same losses."""
    def losses(fused):
        torch.manual_seed(0)
        net = GPT(128, 16, 32, 4, 2, tied=True)
        g = torch.Generator().manual_seed(1)
        toks = torch.randint(0, 128, (4, 17), generator=g)
        step = xt.make_train_step(net, lambda o, y: lm_loss(o.float(), y), optax.adamw(1e-3),
                                  policy="tpu", fused_attention=fused)
        batch = step.place_batch(toks[:, :-1], toks[:, 1:])
        return [float(step(*batch)) for _ in range(3)]
    fused = losses(True)
    assert len(calls) == 2  # one per layer, traced once
    plain = losses(False)
    assert len(calls) == 2
    np.testing.assert_allclose(fused, plain, rtol=2e-3)
    assert fused[2] < fused[0]


# -- attention in the region's dtype: the computation every engine runs ----

def _lowered(policy, fused=False, **kw):
    """StableHLO of SDPA's forward and backward under `policy`, float32 inputs."""
    torch.manual_seed(0)
    q, k, v = helpers_torchax.to_jax([torch.randn(2, 4, 16, 8) for _ in range(3)])

    def loss(a, b, c):
        with helpers_torchax.ENV:
            ta, tb, tc = helpers_torchax.ENV.j2t_iso((a, b, c))
            with xt.autocast("jax", policy=policy, fused_attention=fused):
                out = F.scaled_dot_product_attention(ta, tb, tc, **kw)
            return helpers_torchax.ENV.t2j_iso(out).astype(np.float32).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q.jax(), k.jax(), v.jax()).as_text()


def _dot_types(text):
    elem = r"tensor<(?:[0-9?]+x)*(\w+)>"
    return re.findall(rf"stablehlo\.dot_general[^\n]*?: \({elem}, {elem}\) -> {elem}", text)


@pytest.mark.parametrize("policy,low", [("tpu", "bf16"), ("cuda", "f16")])
@pytest.mark.parametrize("kw", [{"is_causal": True}, {"scale": -0.2}], ids=["causal", "scale"])
def test_every_dot_in_the_regions_dtype_through_the_shared_computation(monkeypatch, policy,
                                                                       low, kw):
    """xla_amp/policies/_attention.py, the one the native and Python kernels call,
    runs here too: forward and backward dots in the region's dtype, the
    softmax's exponentials in float32."""
    from xla_amp.policies import _attention as shared
    calls, real = [], shared.attention
    monkeypatch.setattr(shared, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    text = _lowered(policy, **kw)
    assert calls == [1]
    dots = _dot_types(text)
    assert len(dots) >= 5 and set(dots) == {(low, low, low)}, dots
    exps = re.findall(r"stablehlo\.exponential[^\n]*?tensor<(?:[0-9?]+x)*(\w+)>", text)
    assert set(exps) == {"f32"}, exps


def test_an_fp32_rule_gets_float32_dots():
    rules = policies.get("tpu").with_overrides(
        name="tpu-sdpa-fp32", fp32=["aten::scaled_dot_product_attention"])
    dots = _dot_types(_lowered(rules, is_causal=True))
    assert dots and set(dots) == {("f32", "f32", "f32")}, dots


@pytest.mark.parametrize("form", ["causal", "bool_mask", "additive_mask", "gqa"])
def test_values_equal_the_hand_written_control(form):
    """Against tests/support/attention_reference.py run on torchax too, no
    region (the same backend: bit for bit, or one bf16 ulp where XLA fuses
    otherwise)."""
    from tests.support.attention_reference import case, reference
    *cpu, kw, ref = case(form, 16, 8)
    if "attn_mask" in kw:
        mask = helpers_torchax.to_jax([kw["attn_mask"]])[0]
        kw, ref = {"attn_mask": mask}, {"mask": mask}
    q, k, v = helpers_torchax.to_jax(cpu)
    with helpers_torchax.ENV:
        with xt.autocast("jax", policy="tpu"):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
        want = reference(q, k, v, torch.bfloat16, **ref)
    assert out.dtype == want.dtype == torch.bfloat16
    got, want = (torch.from_numpy(np.asarray(t.jax().astype(np.float32))) for t in (out, want))
    ulp = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(2 ** -20)
    assert ((got - want).abs() <= ulp).all(), (got - want).abs().max()
