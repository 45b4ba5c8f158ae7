"""The paths torchax takes for a call, and how the policy follows each one to
where the arithmetic happens.

torchax runs a call it is handed in one of these ways (``path``)::

    lowering       torchax's own code for the call (``env._ops``): JAX code,
                   or torch ops it dispatches again. The inputs the policy
                   cast reach it directly.
    decomposition  PyTorch's decomposition of an aten overload
                   (``env._decomps``), Python that stands for a C++ kernel.
                   In no category, where PyTorch builds that kernel from
                   other ops on every backend (CompositeExplicitAutograd,
                   no CPU kernel: ``_safe_softmax``), the decomposition runs
                   with torchax's function mode on, so its Python-level
                   calls (``torch.softmax``) meet the policy as the
                   kernel's ``at::softmax`` meets the AutocastXLA key on
                   torch_xla. Where backends have kernels of their own
                   (``trace``: CPU, CUDA, XLA), the op is one piece there:
                   path "kernel", its decomposition runs with autocast
                   suspended, as a categorized op's insides do.
                   In lower_precision_fp, many upcast low-precision inputs
                   to float32 before they compute ("opmath": baddbmm's
                   bmm); an inner op the policy puts in lower_precision_fp
                   is then cast again (_region.py), so the dot computes in
                   the region's dtype, as torch_xla's lowering does.
    body           a Python function torchax has no lowering for
                   (F.multi_head_attention_forward, F.softmin, Tensor.norm).
                   torchax calls it with its function mode popped, so the
                   calls inside it would reach torchax only as the aten ops
                   left after PyTorch's C++ composites decompose (F.softmax
                   as aten._softmax, which a policy need not list). Here the
                   body runs with torchax's function mode pushed again, so
                   every call inside it meets the policy under its own name,
                   as every call inside it meets the AutocastXLA key on
                   torch_xla.
    composite      a Python-level function torchax lowers in JAX code while
                   PyTorch builds its aten op from other ops
                   (CompositeImplicitAutograd), in no category of the
                   policy (torch.einsum under "cuda", which lists only
                   einsum.default; linalg_matrix_power). torch_xla
                   decomposes it with autocast on, so its matmuls compute
                   in the region's dtype; here PyTorch's composite runs on
                   torchax tensors too, and falls back to torchax's
                   lowering where an op inside it cannot run there.

A lowering made of torch ops (torchax's scaled_dot_product_attention)
meets the policy inside as it is. Where PyTorch's composite returns another
dtype than such a lowering, the result is converted (`SAME_AS_FIRST`).

A body runs as a copy of the function whose globals answer "no override"
to the function's own ``has_torch_function*`` check (the check that would
hand the call straight back to the mode); the functions it calls are the
module's own, checks included. The copy is made once per function.
"""
from __future__ import annotations

import functools
import inspect
import re
import threading
import types

import jax
import torch
from torch.utils import _pytree as pytree

from xla_amp.torchax import _hook, _rules

_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")


def _no_override(*_args) -> bool:
    return False


def path(env, func, partial: bool = False) -> str:
    """"lowering", "decomposition", "kernel" (a decomposition standing for
    backends' own kernels), "body", "composite" or "torch" (none of these: a
    builtin torchax hands back to PyTorch, which reaches torchax again as
    aten ops). `partial`: the policy lists some overloads of the
    function's operator and the call's arguments did not say which one it is
    (``torch.einsum(eq, *operands)``): a Python body runs even where torchax
    lowers the function, so the builtin inside it decides."""
    if partial and runs_as_body(func):
        return "body"
    if _hook.lowered(env, func):
        if (_hook.lowered_in_jax(env, func) and not isinstance(func, torch._ops.OpOverload)
                and not in_body(func) and composite_op(_name(func))):
            return "composite"
        return "lowering"
    if _hook.decomposed(env, func):
        return "decomposition" if built_from_ops(func) else "kernel"
    if runs_as_body(func):
        return "body"
    return "torch"


# Composites whose result PyTorch converts to their first input's dtype,
# where torchax's torch-level lowering returns what its last op gives:
# scaled_dot_product_attention's math path ends in ``.to(query dtype)``
# (measured on torch_xla under "tpu": float32 inputs, bfloat16 dots, a
# float32 result).
SAME_AS_FIRST = frozenset({"scaled_dot_product_attention"})


def as_composite_returns(func, args, out):
    """`out` in the dtype PyTorch's composite of `func` returns it in."""
    if _name(func) not in SAME_AS_FIRST or not args or not _hook.is_device_tensor(out):
        return out
    return _hook.cast(out, args[0].dtype)


# Python-level functions that compute nothing a policy governs (tensor
# bookkeeping, hooks, serialization): torchax runs them as it does.
_BOOKKEEPING = frozenset({
    "backward", "register_hook", "register_post_accumulate_grad_hook", "storage",
    "storage_type", "share_memory_", "is_shared", "module_load", "dim_order",
    "refine_names", "rename", "rename_", "align_to", "resize", "resize_as"})
_ARITHMETIC = re.compile(r"__r?(add|sub|mul|matmul|div|truediv|floordiv|mod|pow|lshift|"
                         r"rshift|and|or|xor)__")


def runs_as_body(func) -> bool:
    """A Python function whose body computes (not a protocol method, a
    symbolic-shape helper or bookkeeping), not running here already."""
    if not inspect.isfunction(func) or in_body(func):
        return False
    name = _name(func)
    if name.startswith("_"):
        return bool(_ARITHMETIC.fullmatch(name))
    return not name.startswith("sym_") and name not in _BOOKKEEPING


def scope_name(func) -> str:
    """The JAX scope name torchax gives a call of `func`."""
    return func.name() if isinstance(func, torch._ops.OpOverload) else _name(func) or "call"


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    return name if isinstance(name, str) else ""


@functools.lru_cache(maxsize=None)
def composite_op(name: str) -> bool:
    """Whether every overload of ``aten::<name>`` is a CompositeImplicitAutograd
    kernel (PyTorch builds it from other ops on every backend)."""
    if not name.isidentifier() or name.startswith("_"):
        return False
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return False
    names = _rules.dispatched(f"aten::{name}" + ("" if o == "default" else f".{o}")
                       for o in packet.overloads())
    return bool(names) and all(
        torch._C._dispatch_has_kernel_for_dispatch_key(n, "CompositeImplicitAutograd")
        for n in names)


def built_from_ops(func) -> bool:
    """Whether PyTorch's kernel of the aten overload `func` is made of other
    aten ops on every backend (CompositeExplicitAutograd and no CPU kernel)."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        func = func.default
    if not isinstance(func, torch._ops.OpOverload):
        return False
    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(name, "CompositeExplicitAutograd") and not has(name, "CPU")


def has_device_tensor(args, kwargs) -> bool:
    return any(_hook.is_device_tensor(leaf) for leaf in pytree.tree_leaves((args, kwargs)))


@functools.lru_cache(maxsize=None)
def _body(func):
    code = func.__code__
    if not any(name in code.co_names for name in _CHECKS):
        return func
    scope = dict(func.__globals__)
    scope.update(dict.fromkeys(_CHECKS, _no_override))
    body = types.FunctionType(code, scope, func.__name__, func.__defaults__, func.__closure__)
    body.__kwdefaults__ = func.__kwdefaults__
    return body


_running = threading.local()


def in_body(func) -> bool:
    """Whether `func`'s body (or composite) is running here already: PyTorch's C bindings
    hand a method's own builtin (``super().unflatten``) to the mode under the
    Python method's name, which must then go on to PyTorch, not into the body
    again."""
    return func in getattr(_running, "funcs", ())


def run_body(env, func, args, kwargs):
    """`func`'s body on `args`, with torchax's function mode on for every call
    inside it (under torchax's scope name for `func`)."""
    funcs = _running.__dict__.setdefault("funcs", [])
    funcs.append(func)
    try:
        with jax.named_scope(scope_name(func)), _hook.function_mode(env):
            return _body(func)(*args, **kwargs)
    finally:
        funcs.pop()


def run_decomposition(env, original, func, types, args, kwargs):
    """torchax's run of PyTorch's decomposition of `func`, with the function
    mode on for the Python-level calls inside it."""
    with _hook.function_mode(env):
        return original(func, types, args, kwargs)


def run_composite(func, args, kwargs):
    """PyTorch's composite of `func` on torchax tensors, torch function modes
    off (a second copy of torchax's mode may be on the stack): its aten ops
    reach torchax's dispatch mode one by one."""
    funcs = _running.__dict__.setdefault("funcs", [])
    funcs.append(func)
    try:
        with jax.named_scope(scope_name(func)):
            return func(*args, **kwargs)
    finally:
        funcs.pop()
