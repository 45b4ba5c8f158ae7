"""Glue between Policy objects and the native engine (xla_amp._C).

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
"""
from __future__ import annotations

import logging
import threading
import weakref

import torch

from xla_amp import _engines

_engines.require("torch_xla", "xla_amp's native engine (xla_amp._C)")

from xla_amp import _C  # noqa: E402
from xla_amp.policies import _ops as ops  # noqa: E402
from xla_amp.policies._policy import ADAPTATIONS, CATEGORIES, Policy

log = logging.getLogger("xla_amp")

_CATEGORY_CODE = {name: code for code, name in enumerate(_C.categories())}
assert set(CATEGORIES) | set(ADAPTATIONS) <= set(_CATEGORY_CODE), \
    "csrc/autocast/cast_category.h and policies/_policy.py disagree"

_lock = threading.Lock()
_compiled: "weakref.WeakKeyDictionary[Policy, _C.CompiledPolicy]" = weakref.WeakKeyDictionary()
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
        names = sorted(per_overload)
        slots, _ = _C.register_ops(names)
        guarded = sorted({m for op in policy.categories for m in ops.mutating_overloads(op)})
        _C.register_ops(guarded)  # pass-through: keeps in-place/out= uncast
        rows = []
        for name, slot in zip(names, slots):
            cat = per_overload[name]
            reason = _banned_reason(policy, name) if cat == "banned" else ""
            target = ops.append_dtype_target(name) if cat == "fp32_append_dtype" else ""
            rows.append((slot, _CATEGORY_CODE[cat], reason, target))
        table = _C.compile_policy(policy.name, rows)
        _compiled[policy] = table
        return table


def _banned_reason(policy: Policy, overload: str) -> str:
    base = overload.split(".")[0]
    return policy.banned_reasons.get(overload) or policy.banned_reasons.get(base, "")


push_compiled = _C.push_policy  # push_compiled(compile(policy))
pop = _C.pop_policy
policy_depth = _C.policy_depth  # regions open on the calling thread
enter_region = _C.enter_region
exit_region = _C.exit_region
active_policy = _C.active_policy  # the calling thread's compiled policy, or None
collect_grads = _C.collect_grads  # the sync-free optimizers' per-step pass
Recorder = _C.Recorder            # .rows(): the decisions counted while active
set_recorder = _C.set_recorder    # the calling thread's recorder (or None); returns the old one
push_module = _C.push_module      # the innermost module running, as rows name it
pop_module = _C.pop_module


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
    xla_ops = [n for n in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastXLA")
               if n not in set(_C.registered_ops())]
    _, replaced_kernels = _C.register_ops(sorted(xla_ops))
    _C.set_default_resolver(_resolve_default)
    log.info("xla_amp: native autocast engine replaces PyTorch/XLA's AutocastXLA "
             "kernels (%d ops); the dispatcher's override warnings were silenced",
             replaced_kernels)
