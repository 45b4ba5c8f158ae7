"""The cast kernels, in Python: what xla_amp's native kernels do under
AutocastXLA and AutocastPrivateUse1 (csrc/autocast/autocast_kernel.cpp), for
AutocastPrivateUse1 where no native build for this torch exists (_install
says which serve the key). push/pop/active_table are the one door to a
thread's active table for both: with the native kernels they drive
xla_amp._C's per-thread stack too.

One kernel per op overload, registered once (``_install.register``); it reads
the calling thread's active table (``_state``) at each call::

    kernel(keyset, *args, **kwargs):
        rule = active_table().get(overload)
        no rule:        redispatch below AutocastPrivateUse1 (not excluded: the
                        ops a composite calls inside still meet autocast);
                        a Python number in a Tensor slot (t * 2) goes on as
                        ATen's own call does (pass_through)
        otherwise, with AutocastPrivateUse1 excluded (nothing inside is cast again):
        in-place/out=, or an explicit dtype= given: call as is
        lower_precision_fp  eligible tensors -> the region's dtype; SDPA then
                            computes in it (xla_amp/policies/_attention.py)
        fp32                eligible tensors -> float32
        promote             eligible tensors -> the widest eligible dtype,
                            starting from the region's (ATen's prioritize)
        fp32_set_opt_dtype  first argument eligible: dtype = float32
        fp32_append_dtype   first argument eligible: call the overload that
                            takes dtype, with float32
        banned              RuntimeError naming the op, the policy and why

An *eligible* tensor is a floating tensor on the PrivateUse1 device that is
not float64 (ATen's is_eligible); lists of tensors are cast element by
element. Casts are not cached across calls (ATen's weight cache is C++ only):
the numerics are the same, a weight used twice in a region is cast twice.
"""
from __future__ import annotations

import threading

import torch

from xla_amp.policies import _attention

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDED = torch._C.DispatchKeySet(_KEY)
BELOW = torch._C._dispatch_keyset_full_after(_KEY)
_FROM_KEY_UP = torch._C._dispatch_keyset_full() - BELOW  # the key and those before it
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_NUMBER = (bool, int, float, complex)
_DEVICE_KEYS = (torch._C.DispatchKey.PrivateUse1, torch._C.DispatchKey.AutogradPrivateUse1)


class _State(threading.local):
    def __init__(self):
        self.stack: list = []  # Table objects of the open xla_amp regions


state = _State()
default_table = [None]  # the table plain torch.autocast(<device>) uses (set by _install)


def active_table():
    """The table the kernels use on this thread now (the innermost region's,
    else plain torch.autocast's default)."""
    stack = state.stack
    return stack[-1] if stack else default_table[0]


# (push, pop) of the native kernels' per-thread stack (xla_amp._C), set by
# _install when they serve the key: then a table's `native` is what they read.
native_stack: list = [None]


def push(table) -> None:
    """Make `table` this thread's active one (a region's enter, custom_bwd)."""
    state.stack.append(table)
    native = native_stack[0]
    if native is not None:
        native[0](table.native)


def pop() -> None:
    """Undo the last push on this thread."""
    state.stack.pop()
    native = native_stack[0]
    if native is not None:
        native[1]()


def _device_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def _eligible(t, device_type: str) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype is not torch.float64 and t.device.type == device_type)


def _cast(v, to: torch.dtype, device_type: str):
    if isinstance(v, torch.Tensor):
        dtype = v.dtype
        if (dtype is not to and dtype is not torch.float64 and dtype.is_floating_point
                and v.device.type == device_type):
            return v.to(to)
        return v
    if isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
        return type(v)(_cast(e, to, device_type) for e in v)
    return v


def _cast_all(args, kwargs, to, device_type):
    return ([_cast(a, to, device_type) for a in args],
            {k: _cast(v, to, device_type) for k, v in kwargs.items()} if kwargs else kwargs)


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (e for e in v if isinstance(e, torch.Tensor))


def widest(args, kwargs, lower: torch.dtype, device_type: str) -> torch.dtype:
    """ATen's prioritize over the eligible inputs, from the region's dtype."""
    current = lower
    for t in _tensors(args, kwargs):
        if not _eligible(t, device_type):
            continue
        nxt = t.dtype
        if current is torch.float32 or nxt is torch.float32:
            current = torch.float32
        elif current is lower and nxt is lower:
            current = lower
        else:
            raise RuntimeError(f"xla_amp: unexpected floating dtype {nxt} in a promote op "
                               f"under an autocast region of {lower}")
    return current


class Rule:
    """How one overload is cast under one policy (a row of a Table)."""
    __slots__ = ("category", "op", "dtype_index", "mutates", "target", "reason", "policy",
                 "simple", "call", "to", "low")

    def __init__(self, category, op, *, target=None, reason="", policy=""):
        self.category = category
        self.op = op
        schema = op._schema
        self.mutates = schema.is_mutable
        self.dtype_index = next((i for i, a in enumerate(schema.arguments)
                                 if a.name == "dtype"), -1)
        self.target = target
        self.reason = reason
        self.policy = policy
        # what computes the op once cast to a low dtype, if not the op itself
        self.low = _attention.lower_precision_impl(op)
        # the common case, taken first: a plain cast of every argument
        self.simple = (category in ("lower_precision_fp", "fp32") and not self.mutates
                       and self.dtype_index < 0
                       and (self.low is None or category == "fp32"))
        self.call = op._op  # the dispatcher's callable, without OpOverload's frame
        self.to = torch.float32 if category == "fp32" else None  # None: the region's dtype

    def explicit_dtype(self, args, kwargs) -> bool:
        i = self.dtype_index
        if i < 0:
            return False
        return (i < len(args) and args[i] is not None) or kwargs.get("dtype") is not None

    def __call__(self, args, kwargs):
        if self.simple:
            device_type = _device_type()
            to = (torch.get_autocast_dtype(device_type)
                  if self.category == "lower_precision_fp" else torch.float32)
            args, kwargs = _cast_all(args, kwargs, to, device_type)
            return self.call(*args, **kwargs)
        op, category = self.op, self.category
        if category == "banned":
            raise RuntimeError(f"xla_amp: {op._schema.name} is banned in autocast regions "
                               f"under policy '{self.policy}'. {self.reason}")
        if self.mutates or self.explicit_dtype(args, kwargs):
            return op(*args, **kwargs)
        device_type = _device_type()
        if category in ("lower_precision_fp", "fp32", "promote"):
            to = torch.get_autocast_dtype(device_type)
            if category == "fp32":
                to = torch.float32
            elif category == "promote":
                to = widest(args, kwargs, to, device_type)
            args, kwargs = _cast_all(args, kwargs, to, device_type)
            if self.low is not None and to is not torch.float32:
                return self.low(*args, **kwargs)
        elif category == "fp32_set_opt_dtype":
            if args and _eligible(args[0], device_type) and self.dtype_index >= 0:
                if self.dtype_index < len(args):
                    args = list(args)
                    args[self.dtype_index] = torch.float32
                else:
                    kwargs = dict(kwargs, dtype=torch.float32)
        elif category == "fp32_append_dtype":
            if args and _eligible(args[0], device_type) and self.target is not None:
                # the dispatcher leaves trailing defaults out; the target needs them
                args, kwargs = list(args), dict(kwargs)
                for a in op._schema.arguments[len(args):]:
                    if a.kwarg_only:
                        break
                    args.append(kwargs.pop(a.name) if a.name in kwargs else a.default_value)
                return self.target(*args, **kwargs, dtype=torch.float32)
        return op(*args, **kwargs)


def tensor_slots(op) -> tuple:
    """(position, name) of the arguments `op`'s schema types as Tensor."""
    return tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                 if a.type.kind() == "TensorType")


def pass_through(op, slots, keyset, args, kwargs):
    """Run `op` below the key, uncast (no rule in the active table).

    The dispatcher hands a Python kernel ATen's wrapped numbers (the 2 of
    ``t * 2``, typed Tensor) as Python numbers, and ``redispatch`` refuses a
    number where the schema says Tensor. Such a call goes on the way ATen's
    own call path takes it, numbers made wrapped tensors again: a composite
    runs its decomposition (whose ops meet autocast again, as after a
    redispatch) unless the device has a kernel of its own; any other op is called with this key and those before it
    excluded (it has no ops inside that autocast could see).
    """
    numbers = False
    for i, arg_name in slots:
        v = args[i] if i < len(args) else kwargs.get(arg_name)
        if isinstance(v, _NUMBER):
            numbers = True
            break
    if not numbers:
        return op.redispatch(keyset & BELOW, *args, **kwargs)
    name = op.name()  # the dispatcher's own table (an OpOverload also counts Python kernels)
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, _COMPOSITE) and not any(
            torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in _DEVICE_KEYS):
        return op._op_dk(_COMPOSITE, *args, **kwargs)
    with torch._C._ExcludeDispatchKeyGuard(_FROM_KEY_UP):
        return op._op(*args, **kwargs)


def make_kernel(name: str, op):
    """The kernel registered for overload `name` (its OpOverload is `op`)."""
    slots = tensor_slots(op)

    def kernel(keyset, *args, **kwargs):
        stack = state.stack
        table = stack[-1] if stack else default_table[0]
        rule = table.rules.get(name) if table is not None else None
        if rule is None:
            return pass_through(op, slots, keyset, args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDED):
            if rule.simple:  # inlined: a plain cast of every argument (the common case)
                device_type = _device_type()
                to = rule.to or torch.get_autocast_dtype(device_type)
                if kwargs:
                    kwargs = {k: _cast(v, to, device_type) for k, v in kwargs.items()}
                return rule.call(*[_cast(a, to, device_type) for a in args], **kwargs)
            return rule(args, kwargs)
    kernel.__name__ = f"xla_amp_autocast_{name.replace('::', '_').replace('.', '_')}"
    return kernel


def fallback_kernel(keyset, op, *args, **kwargs):
    """The same rules as one boxed fallback for the whole key (the other way
    to register, measured by benchmarks/privateuse1_dispatch.py): every op
    of every call comes through Python, listed or not."""
    stack = state.stack
    table = stack[-1] if stack else default_table[0]
    schema = op._schema  # the dispatcher's spelling, as the tables key overloads
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    rule = table.rules.get(name) if table is not None else None
    if rule is None:
        return pass_through(op, tensor_slots(op), keyset, args, kwargs)
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDED):
        return rule(args, kwargs)
