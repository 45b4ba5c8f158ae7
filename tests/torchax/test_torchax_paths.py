"""The policy reaches the arithmetic on every path torchax takes.

From the traced program (jaxprs: each instruction keeps the name stack of
the calls it came from), for a generated list of paths:

  * every Python-level function torchax runs as Python ("body": MHA,
    F.softmin, Tensor.norm, ...) or lowers in JAX while PyTorch composes it
    ("composite": torch.einsum, linalg_matrix_power, ...):
    tests.support.torchax_paths.python_paths();
  * every overload of every op in the policy tables (decompositions such as
    baddbmm's included): the parity sweep's cases;

under each lower-precision policy (tpu/bf16, cuda/f16, cpu/bf16), with
float32 inputs: every dot and convolution an op in lower_precision_fp
governs computes in the region's dtype, and every dot, convolution,
exponential and reduction an op in an fp32 category governs computes in
float32. The governing op is the outermost call on the name stack the
policy puts in a category (as on torch_xla, where the outermost cast op
runs its insides with autocast off). The issue's model (MultiheadAttention
with a causal mask) is checked forward and backward.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torchax
from torch.utils import _pytree as pytree

from tests.support import torchax_paths as tp
from tests.support.torchax_env import ENV, TORCHAX_CANNOT_RUN
from tests.torchax.test_torchax_parity import CASES, SWEEP

import xla_amp.torchax as xt
from xla_amp import policies
from xla_amp.torchax import _rules

pytestmark = pytest.mark.torchax
FP32 = {"fp32", "fp32_set_opt_dtype", "fp32_append_dtype"}
MATH = {"dot_general", "conv_general_dilated"}
REDUCE = {"exp", "log", "reduce_max", "reduce_sum"}
JNP = {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16}


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def violations(closed, policy: str, dtype: torch.dtype) -> list[str]:
    """Instructions computing in another type than their governing op's category."""
    p = policies.get(policy)
    rules = _rules.compile(p)
    low, bad = jnp.dtype(JNP[dtype]), []
    for eqn in _eqns(closed.jaxpr):
        name = eqn.primitive.name
        if name not in MATH | REDUCE:
            continue
        types = {jnp.dtype(v.aval.dtype) for v in eqn.invars
                 if jnp.issubdtype(v.aval.dtype, jnp.floating)}
        if not types:
            continue
        stack = str(eqn.source_info.name_stack)
        category = tp.governing(stack, p, rules)
        if category == "lower_precision_fp" and name in MATH:
            want = low
        elif category in FP32:
            want = jnp.dtype(jnp.float32)
        else:
            continue
        if types != {want}:
            bad.append(f"{name} {sorted(map(str, types))} under {stack!r} ({category})")
    return bad


def _trace(call, floats, policy, dtype, grad=False):
    arrays = [jnp.asarray(t.numpy()) for t in floats]

    def torch_fn(*xs):
        with xt.autocast("jax", policy=policy, dtype=dtype):
            out = call(*xs)
        leaves = [t for t in pytree.tree_leaves(out)
                  if isinstance(t, torch.Tensor) and t.dtype.is_floating_point]
        return sum(t.float().sum() for t in leaves) if grad else leaves

    fn = torchax.interop.jax_view(torch_fn)
    if grad:
        fn = jax.grad(fn, argnums=tuple(range(len(arrays))))
    with ENV, _own_key():
        return jax.make_jaxpr(fn)(*arrays)


def _own_key():
    """A key of the trace's own for what draws (dropout, rrelu): torchax
    rotates its key in place, so a trace drawing from the process-wide one
    would leave a tracer there for every later test."""
    return ENV.override_property(prng=jax.random.key(0))


def _python_params():
    out = []
    for func in sorted(tp.python_paths(), key=tp.qualname):
        for policy, dtype in tp.LOW_RULES:
            out.append(pytest.param(func, policy, dtype,
                                    id=f"{policy}-{tp.qualname(func)}-{tp.python_paths()[func]}"))
    return out


def test_the_generated_list_has_every_kind_of_path():
    """The list comes from PyTorch's overridable functions and torchax's
    registries; the paths the issue names are on it."""
    import torch.nn.functional as F
    paths = tp.python_paths()
    assert paths[F.multi_head_attention_forward] == "body"
    assert paths[F.softmin] == "body" and paths[torch.Tensor.norm] == "body"
    assert paths[torch.linalg.matrix_power] == "composite"
    assert len(paths) > 100, len(paths)
    unsampled = {tp.qualname(f) for f in paths if tp.sample(f) is None}
    assert unsampled == set(tp.NO_SAMPLE), unsampled ^ set(tp.NO_SAMPLE)


@pytest.mark.parametrize("func,policy,dtype", _python_params())
def test_python_level_paths_compute_in_the_policy_dtype(func, policy, dtype):
    found = tp.sample(func)
    if found is None:
        pytest.skip(tp.NO_SAMPLE[tp.qualname(func)])
    floats, call = found
    try:
        plain = _trace(call, floats, policy, dtype)  # noqa: F841 - it runs at all
    except Exception as refused:  # noqa: BLE001 - torchax's own limit, compared below
        if "banned in autocast regions" in str(refused):
            return  # the policy refuses it (binary_cross_entropy under "cuda")
        with pytest.raises(type(refused)):
            with ENV, _own_key():
                arrays = [jnp.asarray(t.numpy()) for t in floats]
                jax.make_jaxpr(torchax.interop.jax_view(call))(*arrays)
        return
    assert violations(plain, policy, dtype) == []


def _table_params():
    seen, out = set(), []
    for param in SWEEP:
        policy, category, key, start = param.values
        if start is torch.float32 or (start is None and category == "lower_precision_fp"):
            if (policy, key) not in seen and key not in TORCHAX_CANNOT_RUN:
                seen.add((policy, key))
                out.append(pytest.param(policy, key, id=f"{policy}-{key}"))
    return out


@pytest.mark.parametrize("policy,key", _table_params())
def test_table_ops_compute_in_the_policy_dtype(policy, key):
    dtype = dict(tp.LOW_RULES)[policy]
    case = CASES[key]
    torch.manual_seed(0)
    floats = [t.float() for t in case.inputs()]
    extra = list(case.extra())
    try:
        closed = _trace(lambda *xs: case.call(*xs, *[e.to("jax") for e in extra]),
                        floats, policy, dtype)
    except Exception:  # noqa: BLE001 - an op that refuses float32 inputs here
        pytest.skip("the call refuses these inputs on torchax (parity pins it)")
    assert violations(closed, policy, dtype) == []


@pytest.mark.parametrize("policy,dtype", tp.LOW_RULES, ids=[p for p, _ in tp.LOW_RULES])
def test_multihead_attention_forward_and_backward(policy, dtype):
    """The issue's model: MHA with a causal mask; its baddbmm dots (forward
    and both backward) in the region's dtype, its softmax in float32 where
    the policy lists softmax in an fp32 category (tpu, cuda; the cpu
    policy, like PyTorch's CPU autocast, leaves it alone)."""
    floats, call = tp.HAND["multi_head_attention_forward"]
    closed = _trace(call, floats(), policy, dtype, grad=True)
    dots = [e for e in _eqns(closed.jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) >= 12, len(dots)
    assert {jnp.dtype(v.aval.dtype) for e in dots for v in e.invars} == {jnp.dtype(JNP[dtype])}
    exps = [e for e in _eqns(closed.jaxpr) if e.primitive.name == "exp"]
    fp32 = _rules.compile(policies.get(policy)).by_name.get("softmax") in FP32
    want = jnp.dtype(jnp.float32) if fp32 else jnp.dtype(JNP[dtype])
    assert exps and {jnp.dtype(e.invars[0].aval.dtype) for e in exps} == {want}
    assert fp32 == (policy != "cpu")
    assert violations(closed, policy, dtype) == []


_COMPOSES_CALLS = {
    "cross_entropy_loss": lambda: torch._C._nn.cross_entropy_loss(
        torch.randn(3, 5), torch.tensor([0, 2, 4])),
    "instance_norm": lambda: torch.instance_norm(torch.randn(2, 3, 4), None, None, None, None,
                                                 True, 0.1, 1e-5, False),
    "nll_loss_nd": lambda: torch._C._nn.nll_loss_nd(torch.randn(3, 5).log_softmax(1),
                                                   torch.tensor([0, 2, 4])),
}


@pytest.mark.parametrize("name", sorted(_rules.COMPOSES))
def test_composes_names_the_op_inside_each_composite(name):
    """_rules.COMPOSES against PyTorch: each entry is a CompositeImplicitAutograd
    op whose decomposition (recorded below the dispatcher) runs the op it
    names, and the policies list that op (so it has a category to give)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    inner = _rules.COMPOSES[name]
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}",
                                                          "CompositeImplicitAutograd")
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Record():
        _COMPOSES_CALLS[name]()
    assert any(inner in op for op in seen), (name, seen)
    assert name not in seen  # decomposed: the dispatch mode never sees it
    assert any(_rules.compile(policies.get(p)).by_name.get(inner) for p, _ in tp.LOW_RULES)
