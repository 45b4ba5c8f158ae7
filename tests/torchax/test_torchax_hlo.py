"""What the torchax backend puts in the jitted program: every matmul of a
forward + backward step (nn.Linear included) in the policy's dtype, softmax
and layer norm arithmetic in float32, no host callbacks, no transfers, one
program reused step after step. Also pins the torchax internals _hook.py
uses, and torchax's own autocast leaving nn.Linear in float32 (the upstream
defect this backend replaces)."""
from __future__ import annotations

import re

import jax
import optax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.support.torchax_env import ENV

import xla_amp.torchax as xt
from xla_amp.torchax import _hook

pytestmark = pytest.mark.torchax
HLO_DTYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4)), torch.randn(8, 16), torch.randint(0, 4, (8,)), \
        F.cross_entropy


def block():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    return layer, torch.randn(2, 8, 32), torch.randn(2, 8, 32), F.mse_loss


def _ops(text, name):
    """(operand types, result type) of every `name` op in StableHLO text."""
    return re.findall(rf"stablehlo\.{name}\b[^\n]*?: \(([^)]*)\) -> (tensor<[^>]*>)", text) or \
        [((m,), m) for m in re.findall(rf"stablehlo\.{name}\b[^\n]*?: (tensor<[^>]*>)\n", text)]


def _dtype_of(tensor_type):
    return tensor_type.rstrip(">").split("x")[-1]


@pytest.mark.parametrize("policy,dtype", [("tpu", torch.bfloat16), ("cuda", torch.float16),
                                          ("cpu", torch.bfloat16)])
@pytest.mark.parametrize("build", [mlp, block], ids=["mlp", "transformer_block"])
def test_every_matmul_in_the_policy_dtype(build, policy, dtype):
    model, x, y, loss = build()
    text = xt.make_train_step(model, loss, optax.sgd(0.1), policy=policy,
                              dtype=dtype).lower(x, y).as_text()
    dots = _ops(text, "dot_general")
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    # forward, input gradient, weight gradient of each Linear (the first
    # layer's input gradient is not needed); attention adds its own
    assert len(dots) >= 3 * linears - 1, len(dots)
    want = HLO_DTYPE[dtype]
    for operands, result in dots:
        assert all(_dtype_of(t) == want for t in operands.split(", ")), (operands, result)


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
def test_softmax_and_layer_norm_compute_in_float32(policy):
    model, x, y, loss = block()
    text = xt.make_train_step(model, loss, optax.sgd(0.1), policy=policy).lower(x, y).as_text()
    exps = re.findall(r"stablehlo\.exponential [^\n]*: (tensor<[^>]*>)", text)
    rsqrts = re.findall(r"stablehlo\.rsqrt [^\n]*: (tensor<[^>]*>)", text)
    assert exps and rsqrts
    assert {_dtype_of(t) for t in exps + rsqrts} == {"f32"}, (exps, rsqrts)


def test_fp32_run_has_no_low_precision_matmul():
    model, x, y, loss = mlp()
    text = xt.make_train_step(model, loss, optax.sgd(0.1), enabled=False).lower(x, y).as_text()
    assert {_dtype_of(r) for _, r in _ops(text, "dot_general")} == {"f32"}


def test_one_program_no_callbacks_no_transfers():
    model, x, y, loss = mlp()
    step = xt.make_train_step(model, loss, optax.adamw(1e-3), policy="cuda",
                              dtype=torch.float16, scaler=xt.LossScaler())
    compiled = step.lower(x, y).compile().as_text()
    targets = re.findall(r'custom_call_target="([^"]*)"', compiled)
    assert not [t for t in targets if "callback" in t], targets
    opcodes = set(re.findall(r"= \S+ (\w[\w-]*)\(", compiled))
    assert not opcodes & {"outfeed", "infeed", "send", "recv", "send-done", "recv-done"}, opcodes
    xd, yd = step.place_batch(x, y)
    step(xd, yd)  # compile outside the guard
    with jax.transfer_guard("disallow"):
        for _ in range(3):
            loss_value = step(xd, yd)
    assert step._jitted._cache_size() == 1
    assert bool(jax.numpy.isfinite(loss_value))


def test_torchax_own_autocast_leaves_linear_in_float32():
    """Upstream reproducer (torchax 0.0.13): torchax.amp.autocast keys its
    table by aten overloads; nn.Linear reaches torchax as F.linear, so an MLP
    keeps every dot in float32. When this fails, torchax learned F.linear."""
    import torchax.amp
    model, x, y, loss = mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def forward(p, x):
        with ENV, torchax.amp.autocast("jax", torch.bfloat16, ENV):
            p, x = ENV.j2t_iso((p, x))
            return torch.func.functional_call(model, p, (x,)).jax()
    text = jax.jit(forward).lower(ENV.t2j_copy(params), ENV.t2j_copy(x)).as_text()
    assert {_dtype_of(r) for _, r in _ops(text, "dot_general")} == {"f32"}


def test_hook_pins_torchax_internals():
    """What _hook.py relies on, checked against the installed torchax: both
    torch modes call env.dispatch; _get_op_or_decomp raises OperatorNotFound
    for an op with no lowering and finds F.linear's; Tensor.apply_jax exists."""
    import inspect
    from torchax import tensor
    for mode in (tensor.XLAFunctionMode, tensor.XLADispatchMode):
        src = inspect.getsource(mode)
        assert "self.env.dispatch(func, types, args, kwargs)" in src, mode
    assert _hook.has_lowering(ENV, F.linear)
    assert not _hook.has_lowering(ENV, torch.ops.aten.conv_tbc.default)
    # its own lowerings (JAX code or torch ops) and PyTorch's decompositions
    assert _hook.lowered(ENV, F.linear) and _hook.lowered_in_jax(ENV, F.linear)
    sdpa = F.scaled_dot_product_attention
    assert _hook.lowered(ENV, sdpa) and not _hook.lowered_in_jax(ENV, sdpa)
    assert _hook.decomposed(ENV, torch.ops.aten._safe_softmax.default)
    assert not _hook.lowered(ENV, torch.ops.aten._safe_softmax.default)
    assert isinstance(_hook.function_mode(ENV), tensor.XLAFunctionMode)
    assert callable(tensor.Tensor.apply_jax)
    with ENV:  # a tensor's JAX array is its _elem, replaced by in-place ops
        t = torch.zeros(2, device="jax")
        t.add_(1)
    assert float(_hook.jax_value(t)[0]) == 1.0
    _hook.set_jax_value(t, _hook.jax_value(t) * 3)
    with ENV:
        assert t.cpu().tolist() == [3.0, 3.0]
    assert _hook.installed(ENV)  # this module's steps installed it


@pytest.mark.parametrize("rule", ["fp32", "cuda"])
def test_module_policies_rule_one_layer(rule):
    """xla_amp.torchax.module_policies: the last Linear under its own rule
    ("fp32": its dots stay float32; "cuda" with a tpu region: bf16, the
    region's dtype), the others under the region's tpu policy."""
    model, x, y, loss = mlp()
    handle = xt.module_policies(model, {"4": rule})
    try:
        text = xt.make_train_step(model, loss, optax.sgd(0.1), policy="tpu").lower(x, y).as_text()
    finally:
        handle.remove()
    dots = [_dtype_of(r) for _, r in _ops(text, "dot_general")]
    want_last = "f32" if rule == "fp32" else "bf16"
    assert dots.count(want_last) >= 2 and "bf16" in dots, dots
    if rule == "fp32":
        # the ruled layer's forward and weight gradient are f32, the rest bf16
        assert dots.count("f32") in (2, 3) and dots.count("bf16") >= 4, dots
    text = xt.make_train_step(model, loss, optax.sgd(0.1), policy="tpu").lower(x, y).as_text()
    assert {_dtype_of(r) for _, r in _ops(text, "dot_general")} == {"bf16"}  # removed
