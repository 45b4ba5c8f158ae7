"""xla_amp.module_policies: per-module precision without editing the model."""
import pickle
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xla_amp
from xla_amp import _C, autocast, policies

from tests.support import assert_same

LINEAR_FP32 = policies.get("tpu").with_overrides(name="linear-fp32", fp32=["aten::linear"])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, x):
        return self.mlp(self.norm(self.attn(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.fixture
def net(device):
    torch.manual_seed(0)
    return Net().to(device)


@pytest.fixture
def x(device):
    torch.manual_seed(1)
    return torch.randn(3, 8).to(device)


def _outputs(model):
    """name -> output dtype of every module on the next forward."""
    seen, hooks = {}, []
    for name, m in model.named_modules():
        hooks.append(m.register_forward_hook(
            lambda mod, a, out, name=name: seen.__setitem__(
                name, (out[0] if isinstance(out, tuple) else out).dtype)))
    return seen, hooks


def test_dtypes_per_module_and_bitwise_control(device, net, x):
    """LayerNorm "fp32", head by a Policy object, the rest tpu rules: the
    output equals a manually cast control bit for bit."""
    handle = xla_amp.module_policies(net, {nn.LayerNorm: "fp32", "head": LINEAR_FP32})
    assert handle.ruled == {"blocks.0.norm": "fp32", "blocks.1.norm": "fp32",
                            "head": "linear-fp32"}
    seen, hooks = _outputs(net)
    with autocast(device, policy="tpu"):
        out = net(x)
    assert seen["blocks.0.attn"] == seen["blocks.1.mlp"] == torch.bfloat16
    assert seen["blocks.0.norm"] == seen["blocks.1.norm"] == torch.float32
    assert out.dtype == torch.float32  # linear in fp32 under the head's policy

    h = x
    for b in net.blocks:
        with autocast(device, policy="tpu"):
            a = F.linear(h, b.attn.weight, b.attn.bias)
        n = F.layer_norm(a.float(), (8,), b.norm.weight, b.norm.bias)
        with autocast(device, policy="tpu"):
            h = F.linear(n, b.mlp.weight, b.mlp.bias)
    control = F.linear(h.float(), net.head.weight, net.head.bias)
    assert_same(out, control)
    for h_ in hooks:
        h_.remove()


def test_outside_autocast_nothing_changes(device, net, x):
    plain = net(x)
    handle = xla_amp.module_policies(net, {nn.LayerNorm: "fp32", "head": "cuda"})
    seen, _ = _outputs(net)
    out = net(x)
    assert set(seen.values()) == {torch.float32}
    assert_same(out, plain)
    handle.remove()


def test_inheritance_first_match_and_nested_rules(device, net, x):
    """A module without a rule runs in its parent's region; the first
    matching rule wins; a rule inside an "fp32" module still applies."""
    xla_amp.module_policies(net, {"blocks.0": LINEAR_FP32, "blocks.1.mlp": "tpu",
                                  nn.Linear: "fp32", "blocks.1": "fp32"})
    seen, _ = _outputs(net)
    with autocast(device, policy="tpu"):
        net(x)
    # blocks.0.attn matches nn.Linear -> "fp32" rule (its own), so fp32
    assert seen["blocks.0.attn"] == torch.float32
    # blocks.1 is "fp32"; blocks.1.mlp's own rule (first match, before
    # nn.Linear's) puts linear back in bf16
    assert seen["blocks.1.mlp"] == torch.bfloat16
    assert seen["blocks.1.norm"] == torch.float32

    torch.manual_seed(0)
    fresh = Net().to(device)
    xla_amp.module_policies(fresh, {"blocks.*": LINEAR_FP32})  # no rule on the linears
    seen, _ = _outputs(fresh)
    with autocast(device, policy="tpu"):
        fresh(x)
    assert seen["blocks.0.attn"] == seen["blocks.1.mlp"] == torch.float32  # inherited
    assert seen["head"] == torch.bfloat16  # not under blocks.*


def test_remove_restores_plain_autocast(device, net, x):
    with autocast(device, policy="tpu"):
        before = net(x)
    handle = xla_amp.module_policies(net, {nn.Linear: "fp32"})
    with autocast(device, policy="tpu"):
        assert net(x).dtype == torch.float32
    handle.remove()
    assert "forward" not in net.head.__dict__
    with autocast(device, policy="tpu"):
        after = net(x)
    assert after.dtype == torch.bfloat16
    assert_same(after, before)


def _run(device, net, x):
    with autocast(device, policy="tpu"):
        return net(x)


@pytest.mark.parametrize("order", ["install order", "reverse order"])
def test_two_installs_stack_in_either_removal_order(device, net, x, order):
    """A second install on the same modules overrides the first while both
    are in; each remove() takes its own rules out; after both, every module
    has its own forward back and computes as before (it used to keep the
    first install's LayerNorm wrapper for good)."""
    first_only = {nn.LayerNorm: "fp32"}
    second_only = {nn.LayerNorm: LINEAR_FP32, "head": "fp32"}
    plain = _run(device, net, x)

    def alone(rules):
        h = xla_amp.module_policies(net, rules)
        out = _run(device, net, x)
        h.remove()
        return out

    want_first, want_second = alone(first_only), alone(second_only)
    assert not torch.equal(want_first.cpu(), want_second.cpu())
    h1 = xla_amp.module_policies(net, first_only)
    h2 = xla_amp.module_policies(net, second_only)
    assert_same(_run(device, net, x), want_second)  # the latest install decides
    first, second = (h1, h2) if order == "install order" else (h2, h1)
    first.remove()
    assert_same(_run(device, net, x), want_second if first is h1 else want_first)
    first.remove()  # a second call does nothing
    second.remove()
    assert not any("forward" in m.__dict__ for m in net.modules())
    assert_same(_run(device, net, x), plain)


def test_remove_under_a_foreign_wrapper_passes_through(device, net, x):
    """A forward wrapped by someone else after the install cannot be put
    back; remove() turns the rule off inside it."""
    plain = _run(device, net, x)
    h = xla_amp.module_policies(net, {nn.LayerNorm: "fp32", "head": "fp32"})
    ruled = net.head.forward
    net.head.forward = lambda *a, **k: ruled(*a, **k)
    h.remove()
    assert "forward" not in net.blocks[0].norm.__dict__
    assert_same(_run(device, net, x), plain)  # the head's fp32 rule is gone


def test_backward_dtypes_and_values_match_control(device, net, x):
    xla_amp.module_policies(net, {nn.LayerNorm: "fp32"})
    grads_in = {}
    net.blocks[0].norm.register_full_backward_hook(
        lambda m, gi, go: grads_in.__setitem__("norm", (gi[0].dtype, go[0].dtype)))
    with autocast(device, policy="tpu"):
        net(x).float().sum().backward()
    got = {n: p.grad.clone() for n, p in net.named_parameters()}
    assert {g.dtype for g in got.values()} == {torch.float32}
    # the gradient to the module's bf16 input is bf16, from its fp32 output's
    assert grads_in["norm"] == (torch.bfloat16, torch.float32)

    net.zero_grad(set_to_none=True)
    h = x
    for b in net.blocks:
        with autocast(device, policy="tpu"):
            a = b.attn(h)
        n = F.layer_norm(a.float(), (8,), b.norm.weight, b.norm.bias)
        with autocast(device, policy="tpu"):
            h = b.mlp(n)
    with autocast(device, policy="tpu"):
        out = net.head(h)
    out.float().sum().backward()
    for n, p in net.named_parameters():
        assert_same(got[n], p.grad)


def test_per_thread_and_exception_safe(device, net, x):
    xla_amp.module_policies(net, {"head": "fp32"})
    seen = {}

    def worker():
        with autocast(device, policy="tpu"):
            seen["thread"] = net(x).dtype

    with autocast(device, policy="tpu"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        seen["main"] = net.blocks[0](x).dtype
    assert seen == {"thread": torch.float32, "main": torch.bfloat16}

    def boom(*a, **k):
        raise KeyError("boom")
    net.blocks[1].mlp.register_forward_pre_hook(boom)
    with pytest.raises(KeyError):
        with autocast(device, policy="tpu"):
            net(x)
    assert _C.policy_depth() == 0 and not torch.is_autocast_enabled("xla")


def test_bad_rules_name_the_culprit_and_install_nothing(device, net):
    cases = [({nn.LayerNorm: "fp32", "head": "no-such-policy"}, "no-such-policy"),
             ({nn.LayerNorm: "fp32", 3: "tpu"}, "rule key 3"),
             ({nn.LayerNorm: "fp32", torch.Tensor: "tpu"}, "Tensor"),
             ({"head": 1.5}, "value 1.5")]
    for rules, match in cases:
        with pytest.raises(ValueError, match=match):
            xla_amp.module_policies(net, rules)
        assert all("forward" not in m.__dict__ for m in net.modules())
    with pytest.raises(TypeError, match="mapping"):
        xla_amp.module_policies(net, [("head", "fp32")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xla_amp.module_policies(net, {"nothing.*": "tpu", nn.Conv2d: "fp32", "head": "fp32"})
    msgs = [str(w.message) for w in caught]
    assert any("'nothing.*' matches no module" in m for m in msgs)
    assert any("Conv2d matches no module" in m for m in msgs)
    assert not any("head" in m for m in msgs)


def test_model_pickles_with_rules(device, net, x):
    xla_amp.module_policies(net, {nn.LayerNorm: "fp32", "head": "cuda"})
    copy = pickle.loads(pickle.dumps(net.cpu())).to(device)
    net.to(device)
    with autocast(device, policy="tpu"):
        assert_same(copy(x), net(x))


def test_compiled_matches_eager_without_graph_breaks(device, net, x):
    """The rules are plain Python over prebuilt regions: Dynamo traces them
    into the one graph (no break), with eager's dtypes and values."""
    xla_amp.module_policies(net, {nn.LayerNorm: "fp32", "head": LINEAR_FP32,
                                  "blocks.1.attn": "cuda"})

    def f(x):
        with autocast(device, policy="tpu"):
            return net(x)
    eager = f(x)
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="openxla")(x)
    assert_same(compiled, eager)
    torch._dynamo.reset()


@pytest.mark.parametrize("policy", ["tpu", "cuda", "cpu", "xpu", "hpu"])
def test_transformer_layer_every_policy(device, policy):
    """A real transformer layer, LayerNorm in fp32 and attention under the
    cuda rules, forward and backward under every built-in policy: norms
    give fp32, every gradient has its parameter's dtype and is finite."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True).to(device)
    xla_amp.module_policies(layer, {nn.LayerNorm: "fp32", "self_attn": "cuda"})
    seen, _ = _outputs(layer)
    x = torch.randn(2, 8, 32).to(device)
    with autocast(device, policy=policy):
        out = layer(x)
    out.float().sum().backward()
    assert seen["norm1"] == seen["norm2"] == out.dtype == torch.float32
    assert seen["linear1"] == policies.get(policy).default_dtype
    for name, p in layer.named_parameters():
        assert p.grad.dtype == p.dtype and torch.isfinite(p.grad.cpu()).all(), name


def test_fp32_rule_on_bf16_weights_computes_in_fp32(device, x):
    """An "fp32" module whose weights cast_module made bf16: its float32
    input meets bf16 weights, which the rule promotes to float32 (plain
    PyTorch would refuse the mix) - bit-equal to an fp32 linear on the
    upcast weights."""
    torch.manual_seed(0)
    head = xla_amp.cast_module(nn.Linear(8, 4).to(device), torch.bfloat16)
    xla_amp.module_policies(head, {"": "fp32"})
    with autocast(device, policy="tpu"):
        out = head(x.bfloat16())
    assert out.dtype == torch.float32
    assert_same(out, F.linear(x.bfloat16().float(), head.weight.float(), head.bias.float()))
