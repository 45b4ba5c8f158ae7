"""xla_amp under torch.compile(backend="openxla"): the region's policy, dtype
and switches reach the trace; guards re-trace once per policy; graph breaks,
nesting, the decorator form and bad arguments behave as eagerly."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import xla_amp
from xla_amp import _engine


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    xla_amp.set_default_policy(None)


def _ab(device):
    torch.manual_seed(0)
    return torch.randn(8, 16).to(device), torch.randn(16, 4).to(device)


def _same(got, want):
    assert got.dtype == want.dtype
    assert torch.equal(got.cpu(), want.cpu())


def test_region_policy_reaches_the_trace(device):
    """log_softmax: fp32 under the tpu rules, bf16 under the cpu rules (the
    device default on XLA:CPU) - the compiled graph follows the region."""
    a, b = _ab(device)

    def f(a, b, policy):
        with xla_amp.autocast(device, policy=policy):
            return F.log_softmax(a @ b, -1)
    for policy, dtype in (("tpu", torch.float32), ("cpu", torch.bfloat16)):
        eager = f(a, b, policy)
        assert eager.dtype == dtype
        _same(torch.compile(f, backend="openxla")(a, b, policy), eager)


def test_policy_read_from_a_global_retraces_once_per_policy(device):
    a, b = _ab(device)
    cnt = CompileCounterWithBackend("openxla")
    state = {"policy": "tpu"}

    def f(a, b):
        with xla_amp.autocast(device, policy=state["policy"]):
            return F.log_softmax(a @ b, -1)
    cf = torch.compile(f, backend=cnt)
    for policy in ("tpu", "cpu", "tpu", "cpu", "cuda", "tpu"):
        state["policy"] = policy
        _same(cf(a, b), f(a, b))
    assert cnt.frame_count == 3  # tpu, cpu, cuda: each traced once, then reused


def test_overrides_object(device):
    a, b = _ab(device)
    p = xla_amp.policies.get("tpu").with_overrides(name="tpu-mm-fp32", fp32=["aten::mm", "aten::matmul"])

    def f(a, b, p):
        with xla_amp.autocast(device, policy=p):
            return a @ b
    assert f(a, b, p).dtype == torch.float32
    _same(torch.compile(f, backend="openxla")(a, b, p), f(a, b, p))
    _same(torch.compile(f, backend="openxla")(a, b, "tpu"), f(a, b, "tpu"))


@pytest.mark.parametrize("how", ["outer_region", "set_default_policy"])
def test_ambient_policy_is_guarded(device, how):
    """No region inside: plain torch.autocast("xla") in the compiled code
    follows the policy around the call; switching it re-traces once."""
    a, b = _ab(device)
    cnt = CompileCounterWithBackend("openxla")

    def f(a, b):
        with torch.autocast("xla"):
            return F.log_softmax(a @ b, -1)
    cf = torch.compile(f, backend=cnt)

    def call(fn, policy):
        if how == "outer_region":
            with xla_amp.autocast(device, policy=policy, enabled=False):
                return fn(a, b)
        xla_amp.set_default_policy(policy)
        return fn(a, b)
    for policy, dtype in (("tpu", torch.float32), ("cpu", torch.bfloat16),
                          ("tpu", torch.float32), ("cpu", torch.bfloat16)):
        got, want = call(cf, policy), call(f, policy)
        assert want.dtype == dtype
        _same(got, want)
    assert cnt.frame_count == 2


def test_nested_and_disabled_regions(device):
    a, b = _ab(device)

    def f(a, b):
        with xla_amp.autocast(device, policy="cpu"):
            x = a @ b                                  # bf16
            with xla_amp.autocast(device, policy="tpu"):
                y = F.log_softmax(x.float() @ b.t() @ b, -1)  # tpu: log_softmax fp32
                with xla_amp.autocast(device, enabled=False):
                    z = a @ b                          # fp32: autocast off
            w = F.log_softmax(x, -1)                   # back under cpu: bf16
        return x, y, z, w
    eager = f(a, b)
    assert [t.dtype for t in eager] == [torch.bfloat16, torch.float32, torch.float32,
                                        torch.bfloat16]
    for g, w in zip(torch.compile(f, backend="openxla")(a, b), eager):
        _same(g, w)


def test_graph_break_keeps_the_policy_on_both_sides(device):
    a, b = _ab(device)
    cnt = CompileCounterWithBackend("openxla")

    def f(a, b):
        with xla_amp.autocast(device, policy="tpu"):
            x = F.log_softmax(a @ b, -1)
            torch._dynamo.graph_break()
            y = F.log_softmax(a @ b, -1)
        return x, y
    eager = f(a, b)
    got = torch.compile(f, backend=cnt)(a, b)
    assert cnt.frame_count == 2
    for g, w in zip(got, eager):
        _same(g, w)
        assert g.dtype == torch.float32  # tpu rules on both sides of the break


def test_decorator_and_prebuilt_region(device):
    a, b = _ab(device)

    @xla_amp.autocast(device, policy="tpu")
    def decorated(a, b):
        return F.log_softmax(a @ b, -1)
    region = xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16)

    def uses_region(a, b):
        with region:
            return a.norm(dim=1)  # cuda rules: fp32_append_dtype -> fp32
    for fn in (decorated, uses_region):
        eager = fn(a, b)
        assert eager.dtype == torch.float32
        _same(torch.compile(fn, backend="openxla")(a, b), eager)


def test_plain_torch_autocast_after_import(device):
    a, b = _ab(device)

    def f(a, b):
        with torch.autocast("xla", dtype=torch.bfloat16):
            return a @ b, F.log_softmax(a @ b, -1)
    for g, w in zip(torch.compile(f, backend="openxla")(a, b), f(a, b)):
        _same(g, w)


def test_dynamic_shapes(device):
    cnt = CompileCounterWithBackend("openxla")

    def f(a, b):
        with xla_amp.autocast(device, policy="tpu"):
            return F.log_softmax(a @ b, -1)
    cf = torch.compile(f, backend=cnt, dynamic=True)
    for n in (4, 6, 9):
        a, b = torch.randn(n, 16).to(device), torch.randn(16, 4).to(device)
        _same(cf(a, b), f(a, b))


@pytest.mark.parametrize("bad,match", [
    (dict(device="cpu"), "no xla_amp engine serves device .cpu."),
    (dict(device="xla", dtype=torch.int32), "dtype must be a floating"),
    (dict(device="xla", policy="no-such-policy"), "no-such-policy"),
])
def test_bad_arguments_raise_the_eager_error(device, bad, match):
    a, b = _ab(device)
    kw = dict(bad)
    dev = kw.pop("device")

    def f(a, b):
        with xla_amp.autocast(dev, **kw):
            return a @ b
    with pytest.raises(Exception, match=match):
        f(a, b)
    with pytest.raises(Exception, match=match):
        torch.compile(f, backend="openxla")(a, b)
    assert not torch.is_autocast_enabled("xla")
    with pytest.raises((torch._dynamo.exc.Unsupported, ValueError), match=match):
        torch.compile(f, backend="openxla", fullgraph=True)(a, b)


def test_no_state_leaks_after_compiled_regions(device):
    a, b = _ab(device)
    before = _engine.active_policy_name()

    def f(a, b):
        with xla_amp.autocast(device, policy="tpu"):
            return a @ b
    torch.compile(f, backend="openxla")(a, b)
    assert not torch.is_autocast_enabled("xla")
    assert _engine.active_policy_name() == before


class _MM(torch.autograd.Function):
    """fp32 forward whatever the region (cast_inputs); backward autocast."""
    @staticmethod
    @xla_amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @xla_amp.custom_bwd
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.t(), a.t() @ g


class _AutocastMM(_MM):
    """Forward and backward under the region's rules."""
    @staticmethod
    @xla_amp.custom_fwd
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b


@pytest.mark.parametrize("policy", ["tpu", "cpu"])
def test_custom_fwd_bwd_compiled_in_one_graph(device, policy):
    cnt = CompileCounterWithBackend("openxla")

    def f(a, b):
        with xla_amp.autocast(device, policy=policy):
            x = a @ b
            y, z = _MM.apply(x, b.t()), _AutocastMM.apply(a, b)
        return y.float().sum() + z.float().sum(), y, z
    results = []
    for fn in (f, torch.compile(f, backend=cnt)):
        torch.manual_seed(0)
        a = torch.randn(4, 4).to(device).requires_grad_()
        b = torch.randn(4, 4).to(device).requires_grad_()
        out = fn(a, b)
        out[0].backward()
        results.append([*out, a.grad, b.grad])
    assert [t.dtype for t in results[0][1:3]] == [torch.float32, torch.bfloat16]
    for g, w in zip(results[1], results[0]):
        _same(g, w)
    assert cnt.frame_count == 1 and cnt.op_count > 0


_lib = torch.library.Library("xla_amp_ctest", "DEF")
_lib.define("scaled_mm(Tensor a, Tensor b, float scale) -> Tensor")
_lib.impl("scaled_mm", lambda a, b, scale: torch.mm(a, b) * scale, "CompositeExplicitAutograd")


@torch.library.custom_op("xla_amp_ctest::pair_dist", mutates_args=())
def _pair_dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).pow(2).sum(-1)


@_pair_dist.register_fake
def _(a, b):
    return a.new_empty(a.shape[:-1])


_lib.impl("scaled_mm", lambda a, b, scale: a.new_empty(a.shape[0], b.shape[1]), "Meta")


def test_custom_ops_listed_by_a_policy_compiled(device):
    p = xla_amp.policies.get("tpu").with_overrides(
        name="tpu-custom", fp32=["xla_amp_ctest::pair_dist"],
        lower_precision_fp=["xla_amp_ctest::scaled_mm"])
    a, b = _ab(device)

    def f(a, b):
        with xla_amp.autocast(device, policy=p):
            return (torch.ops.xla_amp_ctest.scaled_mm(a, b @ b.t(), 0.5),
                    torch.ops.xla_amp_ctest.pair_dist(a.bfloat16(), a.bfloat16() + 1))
    eager = f(a, b)
    assert [t.dtype for t in eager] == [torch.bfloat16, torch.float32]
    for g, w in zip(torch.compile(f, backend="openxla")(a, b), eager):
        _same(g, w)


def _attention_and_grads(device, policy, masked, compiled):
    torch.manual_seed(0)
    qkv = [torch.randn(2, 4, 6, 8).to(device).requires_grad_() for _ in range(3)]
    mask = torch.ones(6, 6, dtype=torch.bool).tril().to(device) if masked else None

    def f(q, k, v):
        with xla_amp.autocast(device, policy=policy or "tpu", enabled=policy is not None):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = (torch.compile(f, backend="openxla") if compiled else f)(*qkv)
    grads = torch.autograd.grad(out, qkv, torch.ones_like(out))
    return out.cpu(), [g.cpu() for g in grads]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("policy", ["tpu", "cuda", "cpu", "hpu", "xpu"])
def test_attention_compiled_matches_eager(device, policy, masked):
    """scaled_dot_product_attention on XLA runs its math path, whose softmax
    step (_safe_softmax) is an op of its own: eagerly its inner softmax gets
    the policy's softmax rule, so the trace must see that rule too (under
    the tpu rules it used not to: bf16 softmax compiled, fp32 eagerly).
    Output bit for bit; gradients within the float32 run's compiled-vs-eager
    gap (the backward's graphs are cut elsewhere: docs/engine.md)."""
    _, fp32 = _attention_and_grads(device, None, masked, False)
    _, fp32_c = _attention_and_grads(device, None, masked, True)
    fp32_gap = max((a - b).abs().max().item() for a, b in zip(fp32, fp32_c))
    out, grads = _attention_and_grads(device, policy, masked, False)
    out_c, grads_c = _attention_and_grads(device, policy, masked, True)
    _same(out_c, out)
    for g, gc in zip(grads, grads_c):
        assert gc.dtype == g.dtype
        gap = (g - gc).abs().max().item()
        assert gap <= 4 * fp32_gap + 1e-6 * g.abs().max().item(), (gap, fp32_gap)
