"""The paths torchax takes, generated, with a call for each.

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

from tests.support import op_samples
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


HAND = op_samples.HAND
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


_opinfos = op_samples.opinfos
samples = op_samples.samples
qualname = op_samples.qualname


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
