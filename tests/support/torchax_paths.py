"""The paths torchax takes, generated, with a call for each (issue #44).

    python_paths()    every Python-level function PyTorch lets a mode
                      override whose torchax path is "body" (a Python
                      function torchax has no lowering for) or "composite"
                      (a JAX lowering of a CompositeImplicitAutograd op)
    sample(func)      a small float32 call of `func`: PyTorch's OpInfo
                      sample inputs (torch.testing), else HAND below
    governing(stack, policy)
                      the category that governs an instruction traced under
                      JAX name stack `stack`: the outermost scope naming an
                      op the policy puts in a category (torchax names each
                      call's scope after the call; xla_amp's body and
                      composite runs keep the function's name)

No test here runs the functions in NO_SAMPLE; each is named with why.
"""
from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F

from tests.support.torchax_env import ENV
from xla_amp.policies import _ops as ops
from xla_amp.torchax import _paths, _rules

LOW_RULES = (("tpu", torch.bfloat16), ("cuda", torch.float16), ("cpu", torch.bfloat16))


@functools.lru_cache(maxsize=1)
def python_paths() -> dict:
    """{function: "body" | "composite"} over torch.overrides' functions."""
    out = {}
    for fns in torch.overrides.get_overridable_functions().values():
        for func in fns:
            way = _paths.path(ENV, func)
            if way in ("body", "composite"):
                out[func] = way
    return out


def _r(*shape):
    return torch.randn(*shape)


def _mha_inputs():
    """Query, MultiheadAttention(12, 2)'s weights, a causal mask (the issue's model)."""
    layer = torch.nn.MultiheadAttention(12, 2, batch_first=True)
    weights = [p.detach().clone() for p in (layer.in_proj_weight, layer.in_proj_bias,
                                             layer.out_proj.weight, layer.out_proj.bias)]
    return [_r(3, 7, 12), *weights, torch.nn.Transformer.generate_square_subsequent_mask(7)]


def _mha(q, w, b, ow, ob, mask):
    qt = q.transpose(0, 1)
    return F.multi_head_attention_forward(qt, qt, qt, 12, 2, w, b, None, None, False, 0.0,
                                          ow, ob, training=False, attn_mask=mask)[0]


# func qualname -> (inputs, call) for what OpInfo has no sample of
HAND = {
    "multi_head_attention_forward": (_mha_inputs, _mha),
    "chain_matmul": (lambda: [_r(3, 4), _r(4, 5), _r(5, 2)], torch.chain_matmul),
    "softmax": (lambda: [_r(3, 5)], lambda x: F.softmax(x, -1)),
    "log_softmax": (lambda: [_r(3, 5)], lambda x: F.log_softmax(x, -1)),
    "gumbel_softmax": (lambda: [_r(3, 5)], lambda x: F.gumbel_softmax(x, tau=0.5)),
    "affine_grid": (lambda: [_r(2, 2, 3)], lambda t: F.affine_grid(t, [2, 1, 4, 4],
                                                                    align_corners=False)),
    "fold": (lambda: [_r(1, 4, 9)], lambda x: F.fold(x, (4, 4), (2, 2))),
    "dropout1d": (lambda: [_r(2, 3, 4)], lambda x: F.dropout1d(x, 0.5)),
    "lp_pool1d": (lambda: [_r(1, 2, 6)], lambda x: F.lp_pool1d(x, 2.0, 2)),
    "lp_pool2d": (lambda: [_r(1, 2, 6, 6)], lambda x: F.lp_pool2d(x, 2.0, 2)),
    "lp_pool3d": (lambda: [_r(1, 2, 4, 4, 4)], lambda x: F.lp_pool3d(x, 2.0, 2)),
    "max_pool1d_with_indices": (lambda: [_r(1, 2, 6)], lambda x: F.max_pool1d(x, 2)),
    "max_pool2d_with_indices": (lambda: [_r(1, 2, 6, 6)], lambda x: F.max_pool2d(x, 2)),
    "max_pool3d_with_indices": (lambda: [_r(1, 2, 4, 4, 4)], lambda x: F.max_pool3d(x, 2)),
    "adaptive_max_pool1d_with_indices": (lambda: [_r(1, 2, 6)],
                                         lambda x: F.adaptive_max_pool1d(x, 3)),
    "adaptive_max_pool2d_with_indices": (lambda: [_r(1, 2, 6, 6)],
                                         lambda x: F.adaptive_max_pool2d(x, 3)),
    "adaptive_max_pool3d_with_indices": (lambda: [_r(1, 2, 4, 4, 4)],
                                         lambda x: F.adaptive_max_pool3d(x, 2)),
    "Tensor.__floordiv__": (lambda: [_r(3, 4), _r(3, 4) + 3], lambda a, b: a // b),
    "Tensor.__rfloordiv__": (lambda: [_r(3, 4) + 3], lambda a: 2.0 // a),
    "TensorBase.pow": (lambda: [_r(3, 4).abs() + 0.5], lambda a: a.pow(2.5)),
    "TensorBase.pow_": (lambda: [_r(3, 4).abs() + 0.5], lambda a: a.clone().pow_(2.5)),
}
# func qualname -> why no call of it runs here
NO_SAMPLE = {
    "Tensor.__rlshift__": "integer shifts: no floating arithmetic for a policy",
    "Tensor.__rrshift__": "integer shifts: no floating arithmetic for a policy",
    "fractional_max_pool2d_with_indices": "torchax 0.0.13 has no lowering "
                                          "(tests.support.torchax_env.TORCHAX_CANNOT_RUN)",
    "fractional_max_pool3d_with_indices": "torchax 0.0.13 has no lowering "
                                          "(tests.support.torchax_env.TORCHAX_CANNOT_RUN)",
    "lobpcg": "an iterative eigensolver with host-side convergence checks: no jitted trace",
}


@functools.lru_cache(maxsize=1)
def _opinfos() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    out = {}
    for info in op_db:
        named = torch
        for part in info.name.split("."):
            named = getattr(named, part, None)
        for variant in (info.op, info.method_variant, named, getattr(torch.Tensor, info.name, None)):
            if variant is not None:
                try:
                    out.setdefault(variant, info)
                except TypeError:
                    pass
    return out


def samples(info):
    """`info`'s float32 CPU samples, untracked: OpInfo.sample_inputs wraps
    them in torch.testing's TrackedInputIter, which calls inspect.stack() per
    call (under pytest's deep stack 0.3 s each: 760 ops took 7 minutes)."""
    return iter(info.sample_inputs_func(info, "cpu", torch.float32, False))


def qualname(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))


def sample(func):
    """(float32 inputs, call) for `func`, or None (then it is in NO_SAMPLE)."""
    name = qualname(func)
    if name in HAND:
        make, call = HAND[name]
        torch.manual_seed(0)
        return make(), call
    info = _opinfos().get(func)
    if info is None:
        return None
    for s in samples(info):
        leaves = [s.input, *s.args, *s.kwargs.values()]
        if all(not (isinstance(t, torch.Tensor) and t.is_complex()) for t in leaves):
            return _bind(info.op, s)
    return None


def _bind(op, s):
    """The OpInfo sample as (floating tensors, call on them)."""
    flat = [s.input, *s.args]
    where = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and
             t.dtype.is_floating_point]

    def call(*floats):
        args = list(flat)
        for i, t in zip(where, floats):
            args[i] = t
        return op(*args, **{k: _moved(v, floats) for k, v in s.kwargs.items()})
    return [flat[i] for i in where], call


def _moved(value, floats):
    if isinstance(value, torch.Tensor):  # a tensor kwarg (weights): beside the inputs
        return value.to(floats[0].device) if floats else value
    return value


_WRAPPER = re.compile(r"^(?:\w+\()+|\)+$")


def governing(stack: str, policy, rules) -> str | None:
    """The category governing an instruction traced under `stack`."""
    expanded = policy.expanded()
    for part in stack.split("/"):
        name = _WRAPPER.sub("", part)
        if "::" in name:
            try:
                category = expanded.get(ops.canonical(name))
            except ValueError:
                category = None
        else:
            category = rules.by_name.get(_rules.ALIASES.get(name, name))
            if category is None and name in _rules.COMPOSES:
                category = rules.by_name.get(_rules.COMPOSES[name])
        if category is not None:
            return category
    return None
