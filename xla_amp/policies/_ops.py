"""Operator names: validation and expansion to dispatcher overloads.

Policies name ops as ``namespace::name`` (every autocastable overload) or
``namespace::name.overload`` (that one; ``namespace::name.default`` is the
overload without a name, alone). Python-level and informal names
from the reference documents (``__matmul__``, ``reflection_pad``) are mapped
to aten names in the policy files, not here.

An overload is *autocastable* when it neither mutates an argument (in-place,
``out=``) nor requires an explicit ScalarType (``addmm.dtype``'s
``out_dtype``, ``norm.ScalarOpt_dtype``): those calls state their own
precision, so autocast leaves them alone.
"""
from __future__ import annotations

import difflib
import functools

import torch


def split(name: str) -> tuple[str, str, str]:
    """``"aten::pow.Scalar"`` -> ``("aten", "pow", "Scalar")``; overload "" if absent."""
    if not isinstance(name, str) or "::" not in name:
        raise ValueError(
            f"op name {name!r} is not of the form 'namespace::name' or "
            "'namespace::name.overload'")
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    if not ns or not base:
        raise ValueError(f"op name {name!r} is malformed")
    return ns, base, overload


def _packet(ns: str, base: str):
    try:
        namespace = getattr(torch.ops, ns)
        return getattr(namespace, base)
    except (AttributeError, RuntimeError):
        return None


def _all_names() -> list[str]:
    return sorted(set(torch._C._dispatch_get_all_op_names()))


def unknown_op_error(name: str) -> ValueError:
    """The error for a name the dispatcher does not know, with near names."""
    known = {n.split(".")[0] for n in _all_names()}
    close = difflib.get_close_matches(name.split(".")[0], known, n=4, cutoff=0.6)
    hint = f"; closest known names: {', '.join(close)}" if close else ""
    return ValueError(f"unknown op {name!r}{hint}")


def _type_name(arg) -> str:
    # TorchScript shows ScalarType as int; real_type keeps the declared type.
    return str(getattr(arg, "real_type", arg.type))


def _is_autocastable(schema) -> bool:
    if schema.is_mutable:
        return False
    types = [_type_name(a) for a in schema.arguments]
    if "ScalarType" in types:
        return False  # a required dtype: the caller chose the precision
    return any("Tensor" in t for t in types)  # skip scalar-only overloads


def validate(name: str) -> None:
    """Raises ValueError naming `name` (and near names) if no such op exists."""
    overloads(name)


@functools.lru_cache(maxsize=None)
def _overloads_cached(name: str) -> tuple[str, ...]:
    ns, base, overload = split(name)
    packet = _packet(ns, base)
    if packet is None:
        raise unknown_op_error(name)
    available = packet.overloads()
    if overload:
        if overload not in available:
            raise unknown_op_error(name)
        # The dispatcher spells the unnamed overload without a suffix.
        return (f"{ns}::{base}",) if overload == "default" else (name,)
    full = []
    for ov in available:
        if _is_autocastable(getattr(packet, ov)._schema):
            full.append(f"{ns}::{base}" if ov == "default" else f"{ns}::{base}.{ov}")
    return tuple(full)


def overloads(name: str) -> tuple[str, ...]:
    """Dispatcher overloads a policy entry covers, as ``ns::name[.overload]``.

    Not cached while the op is unknown, so an op defined later (a custom op
    made with torch.library) is found once it exists.
    """
    return _overloads_cached(name)


def canonical(name: str) -> str:
    """The dispatcher's spelling of one overload: ``aten::mm.default`` -> ``aten::mm``."""
    ns, base, overload = split(name)
    return f"{ns}::{base}" if overload in ("", "default") else name


def schema(name: str):
    """The FunctionSchema of one overload (``ns::name`` is the default one)."""
    ns, base, overload = split(name)
    return getattr(_packet(ns, base), overload or "default")._schema


def append_dtype_target(name: str) -> str:
    """For fp32_append_dtype: the overload taking this one's args plus a dtype.

    ``aten::norm.Scalar`` -> ``aten::norm.ScalarOpt_dtype``. Raises ValueError
    when there is none (the op cannot be in that category).
    """
    ns, base, _ = split(name)
    mine = schema(name)
    want = [a.name for a in mine.arguments] + ["dtype"]
    packet = _packet(ns, base)
    for ov in packet.overloads():
        s = getattr(packet, ov)._schema
        if s.is_mutable or [a.name for a in s.arguments] != want:
            continue
        if _type_name(s.arguments[-1]) == "ScalarType":
            return f"{ns}::{base}" if ov == "default" else f"{ns}::{base}.{ov}"
    raise ValueError(
        f"{name} has no overload that appends a dtype argument, so it cannot be "
        "in category 'fp32_append_dtype'")


@functools.lru_cache(maxsize=None)
def mutating_overloads(name: str) -> tuple[str, ...]:
    """The in-place (``name_``) and ``out=`` overloads beside op `name`.

    The engine registers a pass-through kernel for these: on XLA,
    functionalization rewrites ``a.addmm_(b, c)`` into a fresh ``addmm`` call
    that would otherwise meet the autocast kernel; the pass-through runs it
    with AutocastXLA excluded, so in-place and out= calls stay uncast.
    """
    ns, base, overload = split(name)
    found = []
    for op_name in (base, base + "_"):
        packet = _packet(ns, op_name)
        if packet is None:
            continue
        for ov in packet.overloads():
            if getattr(packet, ov)._schema.is_mutable:
                found.append(f"{ns}::{op_name}" if ov == "default" else f"{ns}::{op_name}.{ov}")
    return tuple(found)
