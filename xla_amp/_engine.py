"""Glue between Policy objects and the native engine (xla_amp._C), the one
module that imports _C. One library, two dispatch keys (csrc/autocast/
engine_key.h): AutocastXLA for the torch_xla engine, AutocastPrivateUse1 for
the PrivateUse1 engine (xla_amp.privateuse1, TorchTPU's "tpu").

The torch_xla engine (torch 2.9 + torch_xla; these names need it)::

    compile(policy)  -> CompiledPolicy   (registers kernels for its ops once)
    push_compiled(table) / pop()          the calling thread's active policy
    enter_region(table, enabled, dtype, cache_enabled) / exit_region()
                                          push/pop plus torch.amp.autocast's
                                          XLA state changes, one call each
    install()                             at import: take over AutocastXLA
    Recorder() / set_recorder(rec)        record=True: the kernels count their
    push_module(name) / pop_module()      decisions per innermost module

On `install()` the engine registers its kernel for every op PyTorch/XLA
registered under AutocastXLA, replacing those kernels (an op a policy does
not list then runs uncast, as the policy says), and one log line says so.

The PrivateUse1 engine (importable without torch_xla)::

    privateuse1_native()   -> _C, or None: then privateuse1_problem() says
                              why in one line (no build for this Python, a
                              build for another torch, XLA_AMP_PRIVATEUSE1_
                              KERNELS=python); XLA_AMP_PRIVATEUSE1_KERNELS=
                              native turns that line into an ImportError
    pu1_compile(policy)    -> CompiledPolicy for AutocastPrivateUse1 (no XLA
                              adaptations), kernels registered once
    pu1_push(table) / pu1_pop() / pu1_set_default(table) / pu1_register(names)
"""
from __future__ import annotations

import logging
import os
import threading
import weakref

import torch

from xla_amp import engines
from xla_amp.policies import _attention

TORCH_XLA = engines.available("torch_xla")
if TORCH_XLA:  # torch 2.9 + torch_xla: _C loads, after torch_xla (its AutocastXLA kernels
    import torch_xla  # noqa: F401  (must exist before ours) and the build check
    from xla_amp import _version_check  # noqa: F401  (ImportError if _C was built for another torch)
    from xla_amp import _C
else:
    _C = None  # loaded by privateuse1_native(), where a build for this torch exists

from xla_amp.policies import _ops as ops  # noqa: E402
from xla_amp.policies._policy import ADAPTATIONS, CATEGORIES, Policy  # noqa: E402

log = logging.getLogger("xla_amp")

_CATEGORY_CODE: dict = {}
_lock = threading.Lock()
_compiled: "weakref.WeakKeyDictionary[Policy, object]" = weakref.WeakKeyDictionary()
replaced_kernels = 0  # how many PyTorch/XLA kernels install() displaced


def compile(policy: Policy) -> "_C.CompiledPolicy":
    """The engine's table for `policy`, built on first use and cached."""
    table = _compiled.get(policy)  # lock-free fast path: entering a region
    if table is not None:
        return table
    with _lock:
        table = _compiled.get(policy)
        if table is not None:
            return table
        per_overload = policy.expanded()
        # XLA adaptations act only where the policy leaves the op uncast.
        adapted = {overload: kind
                   for op, kind in sorted(policy.adaptations.items(), key=lambda kv: "." in kv[0])
                   for overload in ops.overloads(op)}
        for overload, kind in adapted.items():
            per_overload.setdefault(overload, kind)
        table = _C.compile_policy(policy.name, _rows(policy, per_overload, sorted(per_overload)))
        _compiled[policy] = table
        return table


def _rows(policy: Policy, per_overload: dict, names: list, *engine) -> list:
    """The engine's kernels registered for `names` (and, as pass-throughs
    keeping them uncast, the in-place/out= overloads of the policy's ops);
    the compiled table's rows (slot, category code, banned reason, target)."""
    slots, _ = _C.register_ops(names, *engine)
    guarded = sorted({m for op in policy.categories for m in ops.mutating_overloads(op)})
    _C.register_ops(guarded, *engine)
    rows = []
    for name, slot in zip(names, slots):
        cat = per_overload[name]
        reason = _banned_reason(policy, name) if cat == "banned" else ""
        target = ops.append_dtype_target(name) if cat == "fp32_append_dtype" else ""
        rows.append((slot, _CATEGORY_CODE[cat], reason, target))
    return rows


def _banned_reason(policy: Policy, overload: str) -> str:
    base = overload.split(".")[0]
    return policy.banned_reasons.get(overload) or policy.banned_reasons.get(base, "")




def _bind(c) -> None:
    """The module-level names over the loaded library `c` (once)."""
    global _C, push_compiled, pop, policy_depth, enter_region, exit_region, active_policy
    global collect_grads, Recorder, set_recorder, push_module, pop_module
    _C = c
    _attention.register()
    c.set_lower_precision_impl(_attention.OP, _attention.IMPL)
    _CATEGORY_CODE.update({name: code for code, name in enumerate(c.categories())})
    assert set(CATEGORIES) | set(ADAPTATIONS) <= set(_CATEGORY_CODE), \
        "csrc/autocast/cast_category.h and policies/_policy.py disagree"
    push_compiled = c.push_policy  # push_compiled(compile(policy))
    pop = c.pop_policy
    policy_depth = c.policy_depth  # regions open on the calling thread
    enter_region = c.enter_region
    exit_region = c.exit_region
    active_policy = c.active_policy  # the calling thread's compiled policy, or None
    collect_grads = c.collect_grads  # the sync-free optimizers' per-step pass
    Recorder = c.Recorder            # .rows(): the decisions counted while active
    set_recorder = c.set_recorder    # the calling thread's recorder (or None); returns the old one
    push_module = c.push_module      # the innermost module running, as rows name it
    pop_module = c.pop_module


def __getattr__(name):
    # a name over _C looked up where no library is loaded
    if name in ("push_compiled", "pop", "policy_depth", "enter_region", "exit_region",
                "active_policy", "collect_grads", "Recorder", "set_recorder", "push_module",
                "pop_module"):
        engines.require("torch_xla", "xla_amp's native engine (xla_amp._C)")
        raise AttributeError(f"xla_amp._engine.{name}: xla_amp._C is not loaded "
                             f"({privateuse1_problem()})")
    raise AttributeError(f"module 'xla_amp._engine' has no attribute {name!r}")


def active_policy_name() -> str | None:
    """The policy the calling thread's kernels use now (None: not resolved yet)."""
    return _C.active_policy_name()


def _resolve_default():
    # Runs inside a kernel, the first time plain torch.autocast("xla") needs
    # a policy on a thread that never entered xla_amp.autocast.
    import torch_xla
    import torch_xla.core.xla_model as xm
    from xla_amp import policies
    return compile(policies.for_hardware(xm.xla_device_hw(torch_xla.device())))


def set_default_policy(policy: Policy | None) -> None:
    """The policy of plain ``torch.autocast("xla")``; None: by device hardware."""
    _C.set_default_policy(compile(policy) if policy is not None else None)


def install() -> None:
    global replaced_kernels
    engines.require("torch_xla", "xla_amp's native engine (xla_amp._C)")
    xla_ops = [n for n in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastXLA")
               if n not in set(_C.registered_ops())]
    _, replaced_kernels = _C.register_ops(sorted(xla_ops))
    _C.set_default_resolver(_resolve_default)
    log.info("xla_amp: native autocast engine replaces PyTorch/XLA's AutocastXLA "
             "kernels (%d ops); the dispatcher's override warnings were silenced",
             replaced_kernels)


# -- the PrivateUse1 engine's native kernels (AutocastPrivateUse1) ---------

KERNELS_VAR = "XLA_AMP_PRIVATEUSE1_KERNELS"  # auto (default) | native | python
_pu1: list = []  # [(library or None, problem or None)] once decided
_pu1_compiled: "weakref.WeakKeyDictionary[Policy, object]" = weakref.WeakKeyDictionary()


def _load_for_privateuse1():
    choice = os.environ.get(KERNELS_VAR, "auto") or "auto"
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"{KERNELS_VAR}={choice!r}: expected auto, native or python")
    if choice == "python":
        return None, f"{KERNELS_VAR}=python"
    problem = None
    if _C is None:
        from xla_amp import _version_check
        problem = _version_check.native_problem(torch.__version__)
        if problem is None:
            try:
                from xla_amp import _C as library
                _bind(library)
            except ImportError as e:
                problem = f"xla_amp._C does not load here ({str(e).splitlines()[0]})"
    if problem is not None and choice == "native":
        raise ImportError(f"{KERNELS_VAR}=native, but {problem}")
    return (None, problem) if problem else (_C, None)


def privateuse1_native():
    """The native library serving AutocastPrivateUse1, or None (decided once)."""
    if not _pu1:
        with _lock:
            if not _pu1:
                _pu1.append(_load_for_privateuse1())
    return _pu1[0][0]


def privateuse1_problem() -> str | None:
    """Why the PrivateUse1 engine runs Python kernels, in one line (None: native)."""
    privateuse1_native()
    return _pu1[0][1]


def pu1_register(names) -> int:
    """Native kernels under AutocastPrivateUse1 for `names`; returns how many
    displaced another library's kernel (TorchTPU's compiled table)."""
    return _C.register_ops(sorted(names), _C.ENGINE_PRIVATEUSE1)[1]


def pu1_compile(policy: Policy, names) -> object:
    """The native table of `policy` for AutocastPrivateUse1 over the overloads
    `names` (the policy's, as the dispatcher knows them), cached per policy."""
    table = _pu1_compiled.get(policy)
    if table is not None:
        return table
    with _lock:
        per_overload = policy.expanded()
        rows = _rows(policy, per_overload, sorted(names), _C.ENGINE_PRIVATEUSE1)
        table = _pu1_compiled[policy] = _C.compile_policy(policy.name, rows)
        return table


def pu1_push(table) -> None:
    _C.push_policy(table, _C.ENGINE_PRIVATEUSE1)


def pu1_pop() -> None:
    _C.pop_policy(_C.ENGINE_PRIVATEUSE1)


def pu1_set_default(table) -> None:
    """The table of plain torch.autocast(<PrivateUse1 device>) (None: none)."""
    _C.set_default_policy(table, _C.ENGINE_PRIVATEUSE1)


def pu1_policy_depth() -> int:
    return _C.policy_depth(_C.ENGINE_PRIVATEUSE1)


if TORCH_XLA:
    _bind(_C)
