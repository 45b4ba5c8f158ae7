"""A policy compiled for torchax: which call gets which cast.

torchax sees two kinds of calls (see _hook.py): aten overloads, keyed here
by the overload itself, and Python-level functions (``F.linear``,
``Tensor.softmax``, ``torch.conv1d``), keyed by name: PyTorch's Python API
names its functions after the aten operators they reach, so a name takes
the category of its operator when the policy puts every functional overload
of the operator in that one category. Otherwise (``pow`` under "tpu" lists
only ``pow.Tensor_Scalar``) the name decides nothing: the call reaches the
aten level as one overload, and that overload's entry decides (a name never
widens a policy to overloads it does not list). A few Python names differ
from their operator (`ALIASES`). Casts follow the torch_xla engine's kernel
(csrc/autocast/autocast_kernel.cpp), category for category::

    eligible(t)         t lives in JAX, is floating and not float64
    leave alone         in-place (name ends in "_"), out=, or dtype= given
    lower_precision_fp  eligible inputs -> the region's dtype
    fp32                eligible inputs -> float32
    promote             eligible inputs -> widest (float32 wins, else the
                        region's dtype)
    fp32_set_opt_dtype  first input eligible -> inputs to float32 (what
    fp32_append_dtype   dtype=float32 does; torchax's sum and norm lowerings
                        ignore dtype=)
    banned              raise the policy's explanation
    then                the op runs with autocast suspended: nothing it
                        decomposes into is cast again

The policy's XLA adaptations apply here too (an op in no category): JAX
computes a batch norm of a low-precision input with float32 parameters in
the input's type, and its float16 backward overflows at small batch
variance (ResNet-18's last block: every gradient non-finite), as PyTorch/XLA's
lowering does::

    fp32_compute   a low-precision eligible input and a float32 one ->
                   inputs to float32, first output back to the input's type
    promote_mixed  eligible inputs of mixed types -> float32
"""
from __future__ import annotations

import dataclasses
import functools
import types
from typing import Mapping

import torch
from torch.utils import _pytree as pytree

from xla_amp import policies
from xla_amp.policies import _ops as ops
from xla_amp.policies._policy import Policy
from xla_amp.torchax import _hook

# Python-level name -> the aten operator it is (where the names differ).
ALIASES = types.MappingProxyType({
    "__matmul__": "matmul", "__rmatmul__": "matmul",
    "__pow__": "pow", "__rpow__": "pow",
    "__truediv__": "div", "__rtruediv__": "div", "__div__": "div", "__rdiv__": "div",
    "true_divide": "div",
})
# C++ composites (CompositeImplicitAutograd) the Python API reaches as
# builtins, each built around one op the policies list: PyTorch's dispatcher
# decomposes them before torchax's dispatch mode sees the op inside, while
# torch_xla's AutocastXLA key sees that op. In no category themselves, they
# take its category (tests/torchax/test_torchax_paths.py checks each against
# PyTorch: a composite whose decomposition runs the op named).
COMPOSES = types.MappingProxyType({
    "cross_entropy_loss": "log_softmax",   # LossNLL.cpp: log_softmax, then nll_loss_nd
    "instance_norm": "batch_norm",          # Normalization.cpp: batch_norm on a reshape
    "nll_loss_nd": "nll_loss",              # LossNLL.cpp: nll_loss or nll_loss2d
})
# Python names whose operator takes its operands the other way round.
REVERSED = frozenset({"__rmatmul__", "__rpow__", "__rtruediv__", "__rdiv__"})


def overload_of(name: str) -> torch._ops.OpOverload:
    """The OpOverload object a dispatcher name (``aten::mm``, ``aten::pow.Scalar``) names."""
    ns, base, overload = ops.split(name)
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


@dataclasses.dataclass(frozen=True, eq=False)
class Rules:
    """`policy` compiled: aten overload -> category, Python name -> category."""

    policy: Policy
    by_overload: Mapping[object, str]
    by_name: Mapping[str, str]
    partial: frozenset               # operators the policy lists some overloads of
    adapt_overload: Mapping[object, str]     # XLA adaptations, same keys
    adapt_name: Mapping[str, str]

    def lookup(self, func, args=(), kwargs=None) -> str | None:
        if isinstance(func, torch._ops.OpOverload):
            return self.by_overload.get(func)
        name = _python_name(func)
        for base in dict.fromkeys((name, ALIASES.get(name, name))):
            # the name's own entry first (an override naming true_divide wins
            # over div's, as on torch_xla), then the operator it aliases
            category = self.by_name.get(base)
            if category is None and base in self.partial:
                overload = resolve(base, name, args, kwargs or {})
                category = None if overload is None else self.by_overload.get(overload)
            if category is None and base in COMPOSES and base not in self.partial:
                category = self.by_name.get(COMPOSES[base])
            if category is not None:
                return category
        return None

    def partial_name(self, func) -> bool:
        """Whether a Python-level `func` names an operator the policy lists
        only some overloads of."""
        name = _python_name(func)
        return ALIASES.get(name, name) in self.partial

    def adaptation(self, func) -> str | None:
        if isinstance(func, torch._ops.OpOverload):
            return self.adapt_overload.get(func)
        return self.adapt_name.get(_python_name(func))

    def banned_message(self, func) -> str:
        name = func.name() if isinstance(func, torch._ops.OpOverload) else func.__name__
        short = name.split("::")[-1].split(".")[0]
        base = ALIASES.get(short, short)
        reason = (self.policy.banned_reasons.get(name.replace("aten.", "aten::"))
                  or self.policy.banned_reasons.get(f"aten::{base}", ""))
        return (f"xla_amp: {name} is banned in autocast regions under policy "
                f"'{self.policy.name}'. {reason}")


def resolve(base: str, name: str, args, kwargs):
    """The aten overload of ``aten::<base>`` a Python-level call `name` with
    these arguments reaches (PyTorch's own schema matching), or None when
    its Python signature is not the operator's (the aten level decides)."""
    if name in REVERSED and len(args) >= 2:
        args = (args[1], args[0], *args[2:])
    try:
        overload = torch._C._jit_resolve_packet(f"aten::{base}", *args, **kwargs)
        return getattr(getattr(torch.ops.aten, base), overload or "default")
    except (RuntimeError, TypeError, AttributeError):
        return None


def dispatched(overloads) -> list[str]:
    """The overloads (``ns::op[.overload]``) the dispatcher has a kernel for
    (not TorchScript-only ones such as ``einsum.sublist``)."""
    out = []
    for name in overloads:
        try:
            if torch._C._dispatch_has_kernel(name):
                out.append(name)
        except RuntimeError:
            continue
    return out


_SOFTMAXES = frozenset({"softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"})


def is_softmax(func) -> bool:
    """A softmax of any spelling (aten overload or Python-level)."""
    if isinstance(func, torch._ops.OpOverload):
        return func.overloadpacket.__name__ in _SOFTMAXES
    return _python_name(func) in _SOFTMAXES


def is_attention(func) -> bool:
    """An attention op of any spelling (scaled_dot_product_attention and its
    kernels' overloads, multi_head_attention_forward)."""
    if isinstance(func, torch._ops.OpOverload):
        return "attention" in func.overloadpacket.__name__
    return "attention" in (_python_name(func) or "")


def _python_name(func) -> str | None:
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else None


@functools.lru_cache(maxsize=64)
def _compile_cached(policy: Policy, generation: int) -> Rules:
    expanded = policy.expanded()
    by_overload = {overload_of(name): cat for name, cat in expanded.items()}
    by_name: dict[str, str] = {}
    partial: set[str] = set()
    for name in policy.categories:
        ns, base, _ = ops.split(name)
        if ns != "aten":
            continue
        cats = {expanded.get(o) for o in dispatched(ops.overloads(f"{ns}::{base}"))}
        if len(cats) == 1 and None not in cats:
            by_name[base] = cats.pop()
        else:  # the call's own overload decides (Rules.lookup)
            partial.add(base)
    adapt_overload: dict[object, str] = {}
    adapt_name: dict[str, str] = {}
    for name, kind in policy.adaptations.items():
        if name in policy.categories:
            continue
        for overload in ops.overloads(name):
            if overload not in expanded:
                adapt_overload[overload_of(overload)] = kind
        if "." not in name:
            adapt_name[ops.split(name)[1]] = kind
    frozen = types.MappingProxyType
    return Rules(policy, frozen(by_overload), frozen(by_name), frozenset(partial),
                 frozen(adapt_overload), frozen(adapt_name))


def compile(policy: Policy) -> Rules:
    """`policy` as torchax rules (cached per policy); ValueError on a bad one."""
    return _compile_cached(policy, policies._generation)


def _eligible(value) -> bool:
    return (_hook.is_device_tensor(value) and value.dtype.is_floating_point
            and value.dtype != torch.float64)


def _cast_all(tree, dtype):
    return pytree.tree_map_only((torch.Tensor,) + (_hook.View,),
                                lambda t: _hook.cast(t, dtype) if _eligible(t) else t, tree)


def _widest(tree, dtype):
    widest = dtype
    for leaf in pytree.tree_leaves(tree):
        if _eligible(leaf) and leaf.dtype != widest:
            widest = torch.float32
    return widest


def _first_tensor(args):
    for a in args:
        if isinstance(a, (torch.Tensor, _hook.View)):
            return a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], (torch.Tensor, _hook.View)):
            return a[0]
        return None
    return None


def _dtype_given(func, args, kwargs) -> bool:
    """Whether the call states its own dtype= (autocast leaves it alone)."""
    if kwargs.get("dtype") is not None:
        return True
    if isinstance(func, torch._ops.OpOverload):
        names = [a.name for a in func._schema.arguments]
        i = names.index("dtype") if "dtype" in names else len(args)
        return i < len(args) and args[i] is not None
    return any(isinstance(a, torch.dtype) for a in args)


def _mutates(func, kwargs) -> bool:
    if isinstance(func, torch._ops.OpOverload):
        return func._schema.is_mutable
    name = getattr(func, "__name__", "")
    return kwargs.get("out") is not None or (name.endswith("_") and not name.endswith("__"))


def apply(rules: Rules, category: str, func, args, kwargs, dtype):
    """(func, args, kwargs) to run for a call in `category`, or None when the
    call is left alone (it runs as written, autocast still on inside)."""
    if category == "banned":
        raise RuntimeError(rules.banned_message(func))
    if _mutates(func, kwargs):
        return None
    if _dtype_given(func, args, kwargs):
        return None
    if category == "lower_precision_fp":
        args, kwargs = _cast_all((args, kwargs), dtype)
    elif category == "fp32":
        args, kwargs = _cast_all((args, kwargs), torch.float32)
    elif category == "promote":
        args, kwargs = _cast_all((args, kwargs), _widest((args, kwargs), dtype))
    elif category in ("fp32_set_opt_dtype", "fp32_append_dtype"):
        # dtype=float32 means "cast the input to float32 first" (PyTorch's
        # documentation of the argument); torchax's lowerings of sum and the
        # norms ignore dtype=, so the cast is made here
        if not _eligible(_first_tensor(args)):
            return None
        args, kwargs = _cast_all((args, kwargs), torch.float32)
    return func, args, kwargs


def adapt(kind: str, args, kwargs):
    """(args, kwargs, dtype of the first output or None) for an XLA
    adaptation, or None when the inputs need none."""
    types_ = {leaf.dtype for leaf in pytree.tree_leaves((args, kwargs)) if _eligible(leaf)}
    if len(types_) < 2:
        return None
    args, kwargs = _cast_all((args, kwargs), torch.float32)
    if kind == "fp32_compute" and torch.float32 in types_:
        low = [t for t in types_ if t != torch.float32]
        first = _first_tensor(args)
        return args, kwargs, (low[0] if len(low) == 1 and first is not None else None)
    return args, kwargs, None
