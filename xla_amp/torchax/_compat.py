"""torchax 0.0.13 on a torch that no longer has some ops it names.

torch >= 2.13 removed 21 Dimname overloads (``aten.prod.dim_Dimname``,
``aten.std.names_dim``, ...) and the ops ``aten.cholesky`` and ``aten.qr``;
torchax 0.0.13 names them as plain attribute accesses in module-level code
(``torchax.amp``'s autocast table, ``@op(...)`` arguments in
``torchax.ops.jaten``, the list ``torchax.decompositions`` hands to
``torch._decomp.get_decompositions``). The AttributeError comes from torch's
``OpOverloadPacket.__getattr__`` (a missing overload) or
``_OpNamespace.__getattr__`` (a missing op) while the argument is evaluated,
before any torchax registration function is called, so wrapping torchax's
``op`` decorator or ``ops_registry.register_torch_dispatch_op`` cannot help.

`apply()` therefore wraps those two ``__getattr__`` methods for one `window`:
while it imports torchax and the op modules torchax's ``Environment.load_ops``
would import on the first environment (in load_ops' order). Inside the window
an AttributeError is replaced by a `Skipped` placeholder only when all hold:

- the access comes from torchax's own code (the calling frame's module is
  ``torchax`` or ``torchax.*``),
- the op is in the ``aten`` namespace (torchax guards its optional
  ``torch.ops.torchvision.nms`` itself) and the name is not a dunder,
- torch really lacks it (the packet's ``overloads()`` has no such overload;
  for an op, the dispatcher has no schema ``ns::name``).

Anything else propagates unchanged. Each placeholder is recorded (`SKIPPED`:
name and ``module:line``); after the window the methods are restored and the
placeholders removed from every module-level dict (keys) and list of
torchax's modules (``amp.autocast_policy``, ``ops_registry.all_aten_ops``),
so torchax never registers or looks up an op that does not exist. On a torch
that has every name (2.9) nothing is replaced and `SKIPPED` stays empty
(``tests/torchax/test_current_torch_shim.py`` pins both). What changes
there: torchax's op modules are imported by ``import xla_amp.torchax``
rather than by the first ``torchax.default_env()``; what they register is
the same (pinned too).
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import threading

import torch
from torch import _ops

# What `import torchax` and Environment.load_ops (torchax/tensor.py) import,
# in that order: every module-level access torchax 0.0.13 makes to torch.ops.
MODULES = ("torchax", "torchax.ops.jaten", "torchax.ops.jc10d", "torchax.ops.jtorch",
           "torchax.ops.jtorchvision_nms", "torchax.decompositions")

SKIPPED: list[tuple[str, str]] = []   # (name, "module:line"), in the order torchax asked
REMOVED: dict[str, int] = {}          # "module.global" -> placeholders removed from it
_lock = threading.Lock()
_state = {"applied": False, "imported": ()}


class Skipped:
    """Stands where torchax named an op or overload this torch lacks. An
    attribute of it (``torch.ops.aten.cholesky.default``) is a placeholder too;
    it is never called, only used as a key or list item until `apply` removes it."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, key: str):
        if key.startswith("_"):
            raise AttributeError(key)
        return Skipped(f"{self.name}.{key}")

    def __repr__(self) -> str:
        return f"<op {self.name} skipped: not in torch {torch.__version__}>"


def _torchax_site(frame) -> str | None:
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    if module == "torchax" or module.startswith("torchax."):
        return f"{module}:{frame.f_lineno}"
    return None


def _skipping_getattr(original, record, lacks, name_of):
    """`original` __getattr__, except that an AttributeError raised for
    torchax's own access to a name this torch `lacks` becomes a placeholder."""
    def __getattr__(self, key):
        try:
            return original(self, key)
        except AttributeError:
            site = _torchax_site(sys._getframe(1))
            if site is None or key.startswith("__") or not lacks(self, key):
                raise
            name = name_of(self, key)
            record.append((name, site))
            return Skipped(name)
    return __getattr__


def _packet_getattr(original, record):
    """OpOverloadPacket: a missing overload of an aten op."""
    return _skipping_getattr(
        original, record,
        lambda packet, key: (packet._qualified_op_name.startswith("aten::")
                             and key not in packet.overloads()),
        lambda packet, key: packet._qualified_op_name.replace("::", ".") + "." + key)


def _namespace_getattr(original, record):
    """_OpNamespace: a missing aten op (the dispatcher has no schema for it)."""
    return _skipping_getattr(
        original, record,
        lambda ns, op: (ns.name == "aten"
                        and not torch._C._jit_get_schemas_for_operator(f"aten::{op}")),
        lambda ns, op: f"{ns.name}.{op}")


def _remove_placeholders() -> None:
    for modname in [m for m in sys.modules if m == "torchax" or m.startswith("torchax.")]:
        for gname, value in list(vars(sys.modules[modname]).items()):
            if isinstance(value, Skipped):
                raise RuntimeError(f"xla_amp.torchax: {modname}.{gname} is a skipped op "
                                   f"({value.name}); the shim cannot remove it")
            if isinstance(value, dict):
                gone = [k for k in value if isinstance(k, Skipped)]
                for k in gone:
                    del value[k]
            elif isinstance(value, list):
                gone = [v for v in value if isinstance(v, Skipped)]
                value[:] = [v for v in value if not isinstance(v, Skipped)]
            else:
                continue
            if gone:
                REMOVED[f"{modname}.{gname}"] = REMOVED.get(f"{modname}.{gname}", 0) + len(gone)


@contextlib.contextmanager
def window(record: list):
    """While open, torchax's accesses to missing aten ops and overloads give
    `Skipped` placeholders, each appended to `record` as (name, site); torch's
    own ``__getattr__`` methods are back in place when it closes."""
    classes = ((_ops.OpOverloadPacket, _packet_getattr), (_ops._OpNamespace, _namespace_getattr))
    originals = [(cls, cls.__dict__["__getattr__"]) for cls, _ in classes]
    try:
        for (cls, wrap), (_, original) in zip(classes, originals):
            cls.__getattr__ = wrap(original, record)
        yield record
    finally:
        for cls, original in originals:
            cls.__getattr__ = original


def apply() -> list[str]:
    """Imports torchax (and its op modules) with the shim; once per process.
    Returns `skipped_names()`."""
    with _lock:
        if _state["applied"]:
            return skipped_names()
        todo = [m for m in MODULES if m not in sys.modules]
        if todo:
            with window(SKIPPED):
                for module in todo:
                    importlib.import_module(module)
            if SKIPPED:
                _remove_placeholders()
        _state.update(applied=True, imported=tuple(todo))
        _device_guard()
        return skipped_names()


def _device_guard() -> None:
    """torch >= 2.13's torch.optim (Adam, AdamW, Adamax: their step's
    accelerator check) asks the current accelerator, PrivateUse1 "jax" once
    torchax is imported, for a device guard, which torchax registers none of:
    "PyTorch is not linked with support for jax devices", eager and in
    make_train_step alike. torch 2.11+ lets Python register one: torch's own
    stand-in hook and guard (what its _setup_privateuseone_for_python_backend
    registers), only while PrivateUse1 is torchax's "jax" (this process then
    has no other PrivateUse1 device: xla_amp.privateuse1 refuses "jax")."""
    acc = getattr(torch._C, "_acc", None)
    if acc is None or torch._C._get_privateuse1_backend_name() != "jax" or _state.get("guard"):
        return
    from torch.utils import backend_registration
    acc.register_python_privateuseone_hook(backend_registration._DummyPrivateUse1Hook())
    acc.register_python_privateuseone_device_guard(backend_registration._DummyDeviceGuard())
    _state["guard"] = True


def skipped_names() -> list[str]:
    """The ops and overloads torchax named that this torch lacks, sorted."""
    return sorted({name for name, _ in SKIPPED})


def skipped_sites() -> dict[str, list[str]]:
    """name -> where torchax names it (``module:line``)."""
    out: dict[str, list[str]] = {}
    for name, site in SKIPPED:
        out.setdefault(name, []).append(site)
    return {k: sorted(v) for k, v in sorted(out.items())}
