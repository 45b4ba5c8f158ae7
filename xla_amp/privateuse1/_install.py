"""Registration of the cast kernels under AutocastPrivateUse1, and tables.

Which kernels: the native ones (xla_amp._C built for this torch, `make
current`; xla_amp/_engine.py) where they load, else the Python ones
(_kernels.py); install() says which in one log line (a warning where a
native build exists for another torch), ``kernels()`` returns it.

    install()           once per process (idempotent), for the PrivateUse1
                        backend as it is named then ("tpu" under TorchTPU):
                        a fallthrough for the whole key where none exists
                        (torch 2.15 has none: without one, every op on the
                        device fails inside torch.autocast); our kernel over
                        every op another library registered for the key
                        (TorchTPU's compiled table), so only xla_amp's policy
                        decides, said in one log line; the GradScaler's ops
                        where the device lacks them; the default table
    compile(policy)     -> Table (kernels registered for its ops on first use)

Clash rule (docs/torchtpu.md): where TorchTPU registered a kernel for an
op, xla_amp's replaces it and ``displaced`` names it; an op xla_amp's policy
does not list then runs uncast, as the policy says, not in TorchTPU's
dtype. A boxed fallback for the key, TorchTPU's, is kept.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import weakref

import torch

from xla_amp import _devices, engines
from xla_amp.policies import _ops as ops
from xla_amp.policies._policy import Policy
from xla_amp.privateuse1 import _amp_ops, _kernels

log = logging.getLogger("xla_amp")

KEY = "AutocastPrivateUse1"
_lock = threading.RLock()
_libs: dict[str, torch.library.Library] = {}  # namespace -> library (kept alive)
_registered: set[str] = set()
_tables: "weakref.WeakKeyDictionary[Policy, Table]" = weakref.WeakKeyDictionary()
displaced: list[str] = []    # ops whose kernel under the key (TorchTPU's) we replaced
installed_for: list[str] = []  # the backend name install() ran for
fallthrough_added = [False]


native: list = [None]  # xla_amp._engine when the native kernels serve the key


class Table:
    """One policy, compiled: overload -> Rule, and the native kernels'
    table (`native`, a CompiledPolicy) when they serve the key."""
    __slots__ = ("name", "rules", "native", "__weakref__")

    def __init__(self, name: str, rules: dict, native=None):
        self.name = name
        self.rules = rules
        self.native = native


def kernels() -> str:
    """"native" or "python": which kernels serve AutocastPrivateUse1 (install()
    decides; before it, what it would decide)."""
    if native[0] is not None:
        return "native"
    if installed_for:
        return "python"
    from xla_amp import _engine
    return "native" if _engine.privateuse1_native() is not None else "python"


def set_default_table(table: Table) -> None:
    """The table plain torch.autocast(<device>) uses, for either kernels."""
    _kernels.default_table[0] = table
    if native[0] is not None:
        native[0].pu1_set_default(table.native)


default: list = [None]  # set_default_policy's choice (None: the tpu rules)


def default_policy() -> Policy:
    from xla_amp import policies
    return default[0] or policies.get("tpu")


def backend_name() -> str:
    return torch._C._get_privateuse1_backend_name()


def _overload(name: str):
    ns, base, overload = ops.split(name)
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def register(name: str) -> None:
    """Our kernel for one overload under the key (once)."""
    if name in _registered:
        return
    ns, base, overload = ops.split(name)
    if native[0] is not None:
        if native[0].pu1_register([name]):
            displaced.append(name)
        _registered.add(name)
        return
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, KEY):
        displaced.append(name)
    lib = _libs.get(ns)
    if lib is None:
        lib = _libs[ns] = torch.library.Library(ns, "IMPL")
    lib.impl(f"{base}.{overload}" if overload else base,
             _kernels.make_kernel(name, _overload(name)), KEY, with_keyset=True)
    _registered.add(name)


def compile(policy: Policy) -> Table:
    """The kernels' table for `policy`, built (and its ops registered) once."""
    table = _tables.get(policy)
    if table is not None:
        return table
    with _lock:
        install()
        table = _tables.get(policy)
        if table is not None:
            return table
        rules = {}
        for name, category in policy.expanded().items():
            target = None
            if category == "fp32_append_dtype":
                target = _overload(ops.append_dtype_target(name))
            reason = ""
            if category == "banned":
                base = name.split(".")[0]
                reason = policy.banned_reasons.get(name) or policy.banned_reasons.get(base, "")
            rules[name] = _kernels.Rule(category, _overload(name), target=target,
                                        reason=reason, policy=policy.name)
        known = set(torch._C._dispatch_get_all_op_names())
        for name in list(rules):
            if name not in known:  # a Python-only overload (aten::einsum.sublist): never dispatched
                del rules[name]
            elif native[0] is None:
                register(name)
        table = Table(policy.name, rules)
        if native[0] is not None:
            table.native = native[0].pu1_compile(policy, rules)
            _registered.update(rules)
        _tables[policy] = table
        return table


def _check_backend(name: str) -> None:
    if name == "jax":
        raise RuntimeError(
            "xla_amp.privateuse1: PrivateUse1 is torchax's 'jax' device in this process; "
            "use xla_amp.torchax.autocast for torchax tensors")


def at_import() -> None:
    """What ``import xla_amp`` does for AutocastPrivateUse1, so that plain
    torch.autocast(<name>) follows xla_amp's default policy right away:

        named already (or TorchTPU loaded)   install()
        not yet named, native kernels here   the key taken now (kernels for
                                             the default policy, the
                                             fallthrough), the rest of
                                             install() when it is next
                                             called after the naming
        not yet named, Python kernels only   nothing (their per-call cost
                                             stays out of processes that
                                             never use the device): call
                                             install() after naming it
        torchax's "jax"                      nothing (xla_amp.torchax's own)

    (torch 2.9-2.15 register no fallback for the key, and a Python one
    cannot be registered on an Autocast key (PyTorch asserts), so where
    nothing is taken torch's own error is what plain torch.autocast gives.)"""
    name = backend_name()
    if not engines.available("privateuse1") or name == "jax":
        return
    if name != "privateuseone" or "torch_tpu" in sys.modules:
        install()
        return
    from xla_amp import _engine
    if os.environ.get(_engine.KERNELS_VAR, "auto") == "python":
        return
    try:
        native = _engine.privateuse1_native()
    except ImportError:  # native asked for, none loads: install() says so, not the import
        return
    if native is not None:
        install()


def install(default: Policy | None = None) -> None:
    """Take over AutocastPrivateUse1 for the backend as now named (once)."""
    with _lock:
        name = backend_name()
        if installed_for and installed_for[0] == "privateuseone" != name:
            # named since (TorchTPU names it once a TPU is up; other backends
            # at their import, after `import xla_amp` took the key)
            _check_backend(name)
            installed_for[0] = name
            _say_kernels(name)
            _take_over(name)
        if installed_for:
            if installed_for[0] != name:
                raise RuntimeError(
                    f"xla_amp.privateuse1: installed for PrivateUse1 as '{installed_for[0]}', "
                    f"which is now named '{name}'; rename the backend before using xla_amp on it")
            return
        engines.require("privateuse1", "xla_amp.privateuse1")  # a torch it is verified on
        _check_backend(name)
        installed_for.append(name)  # before compile() below, which calls install()
        _choose_kernels(name)
        key = getattr(torch._C.DispatchKey, KEY)
        if not torch._C._dispatch_has_backend_fallback(key):
            fallthrough = torch.library.Library("_", "IMPL")
            fallthrough.fallback(torch.library.fallthrough_kernel, KEY)
            _libs["_"] = fallthrough
            fallthrough_added[0] = True
        _take_over(name)
        set_default_table(compile(default or default_policy()))


def _take_over(name: str) -> None:
    """Our kernel over every op another library registered for the key
    (TorchTPU's compiled table), said in one line; for a backend that is
    named (or TorchTPU, which names it once a TPU is up), the GradScaler's
    ops where the device lacks them (Python kernels: not registered in
    every process that merely imports xla_amp)."""
    theirs = [op for op in sorted(set(torch._C._dispatch_get_all_op_names()))
              if torch._C._dispatch_has_kernel_for_dispatch_key(op, KEY) and op not in _registered]
    for op in theirs:
        register(op)
    if theirs:
        log.warning("xla_amp: %d AutocastPrivateUse1 kernels of another library "
                    "(TorchTPU's compiled table) replaced by xla_amp's: its policies "
                    "decide those ops on '%s' (docs/torchtpu.md)", len(theirs), name)
    if name != "privateuseone" or "torch_tpu" in sys.modules:
        _amp_ops.register()
        _devices.add(name)


def _choose_kernels(name: str) -> None:
    """Native kernels where this torch's build loads, else Python; one line
    (for a backend not named yet, when it is: `import xla_amp` says nothing)."""
    from xla_amp import _engine
    library = _engine.privateuse1_native()
    if library is not None:
        native[0] = _engine
        _kernels.native_stack[0] = (_engine.pu1_push, _engine.pu1_pop)
    if name != "privateuseone":
        _say_kernels(name)


def _say_kernels(name: str) -> None:
    from xla_amp import _engine
    library = _engine.privateuse1_native()
    if native[0] is not None:
        log.info("xla_amp: PrivateUse1 autocast kernels on '%s': native (xla_amp._C, "
                 "built against torch %s)", name, library.TORCH_VERSION)
        return
    problem = _engine.privateuse1_problem()
    (log.warning if "built against" in problem else log.info)(
        "xla_amp: PrivateUse1 autocast kernels on '%s': python (%s)", name, problem)
