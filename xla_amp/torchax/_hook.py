"""The one door to torchax's internals (as _engine.py is to _C).

torchax 0.0.13 has no public hook that sees every op: its autocast table
(``torchax.amp.autocast_policy``) is a process-wide dict keyed by aten
overloads, consulted only when ``env.param.autocast_dtype`` is set, and it
never sees ``F.linear`` (torchax lowers it at the ``__torch_function__``
level). Both of torchax's torch modes, ``XLAFunctionMode`` (Python-level
functions) and ``XLADispatchMode`` (aten overloads), hand each call to
``Environment.dispatch(func, types, args, kwargs)``; wrapping that bound
method on one environment instance is the narrowest interception there is.
What else is private and used here: a tensor's ``_elem`` (its JAX array),
``Environment._get_op_or_decomp`` (does
torchax lower an op?), ``Environment._ops`` / ``_decomps`` (its own
lowerings / PyTorch's decompositions), ``Environment._function_mode`` (the
mode a Python-level call reaches torchax through),
``torchax.tensor.OperatorNotFound`` (it does not)
and ``torchax.view.View`` (a lazy view, materialised before a cast).
tests/torchax/test_torchax_hlo.py::test_hook_pins_torchax_internals pins each of these against the installed torchax.
Upstream note (docs/torchax.md): a public per-environment dispatch hook would
make this file unnecessary.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from torchax import tensor as _tensor
from torchax.ops import mappings as _mappings
from torchax.view import View

OperatorNotFound = _tensor.OperatorNotFound
Tensor = _tensor.Tensor
Environment = _tensor.Environment


class _Hooked:
    """Stands in for ``env.dispatch``: ``on_dispatch(original, func, types,
    args, kwargs)`` decides, ``original`` is torchax's own bound method."""

    def __init__(self, original, on_dispatch):
        self.original = original
        self.on_dispatch = on_dispatch

    def __call__(self, func, types, args, kwargs):
        return self.on_dispatch(self.original, func, types, args, kwargs)


def install(env, on_dispatch) -> None:
    """Routes every op `env` dispatches through `on_dispatch`; a second call
    on the same environment does nothing."""
    if not isinstance(env, Environment):
        raise TypeError(f"xla_amp.torchax: expected a torchax Environment, got "
                        f"{type(env).__name__}")
    if isinstance(env.__dict__.get("dispatch"), _Hooked):
        return
    env.dispatch = _Hooked(env.dispatch, on_dispatch)


def installed(env) -> bool:
    return isinstance(env.__dict__.get("dispatch"), _Hooked)


def has_lowering(env, func) -> bool:
    """Whether torchax can run `func` itself (a lowering or a decomposition)."""
    try:
        env._get_op_or_decomp(func)
        return True
    except OperatorNotFound:
        return False


def environment_of(dispatch) -> Environment:
    """The environment whose (unwrapped) ``dispatch`` method this is."""
    return dispatch.__self__


def lowered(env, func) -> bool:
    """Whether torchax has a lowering of its own for `func` (not a decomposition)."""
    return _lookup(env._ops, func) is not None


def lowered_in_jax(env, func) -> bool:
    """Whether torchax's own lowering of `func` is JAX code (no torch op
    inside it meets autocast), not torch ops it dispatches again."""
    found = _lookup(env._ops, func)
    return found is not None and found.is_jax_function


def decomposed(env, func) -> bool:
    """Whether torchax runs `func` through one of PyTorch's decompositions."""
    return _lookup(env._ops, func) is None and _lookup(env._decomps, func) is not None


def _lookup(table, func):
    # as Environment._get_op_or_decomp looks an op up (overload, then its packet)
    found = table.get(func)
    if found is None and isinstance(func, torch._ops.OpOverloadPacket):
        found = table.get(func.default)
    if found is None and isinstance(func, torch._ops.OpOverload):
        found = table.get(func.overloadpacket)
    return found


def function_mode(env):
    """torchax's TorchFunctionMode of `env` (Python-level calls reach
    ``env.dispatch`` through it; it is popped while it handles a call)."""
    return env._function_mode


def is_device_tensor(value) -> bool:
    """A tensor that lives in JAX (autocast's "XLA tensor" on this backend)."""
    return isinstance(value, (Tensor, View))


def jax_value(value):
    """The JAX array behind a torchax tensor or view."""
    if isinstance(value, View):
        value = value.torch()
    return value._elem


def set_jax_value(tensor, array) -> None:
    """Writes `array` into a torchax tensor in place (as torchax's own
    in-place ops do: the tensor object keeps its identity)."""
    tensor._elem = array


def cast(value, dtype: torch.dtype):
    """`value` (a torchax tensor or view) converted to `dtype` in JAX: a
    ``convert_element_type`` in the traced program, differentiable by JAX."""
    if isinstance(value, View):
        value = value.torch()
    if value.dtype == dtype:
        return value
    return value.apply_jax(jnp.astype, _mappings.t2j_dtype(dtype))
