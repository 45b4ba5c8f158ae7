"""Which engines exist, which can run here, and the one place that picks
the engine for a device.

    ENGINES                  name -> Engine (torch_xla, privateuse1, torchax)
    available(name)          -> bool: its runtime imports here (cheap: a spec lookup;
                             sys.modules[name] = None blocks it, as for import)
    require(name, feature)   EngineUnavailable (an ImportError), one line:
                             which package is missing and how to install it
    for_device(device)       the engine serving `device`; a device none serves:
                             ValueError naming the engines and how to install them
    for_module(module)       the engine of a module's parameters (a module on the
                             CPU: default())
    default()                torch_xla where it runs, else PrivateUse1
    set_default_policy(p)    plain torch.autocast's policy, on default()'s device
    install()                each available engine's import-time action, once
"""
from __future__ import annotations

import sys

import torch

from xla_amp import _devices
from xla_amp.engines._base import Engine, EngineUnavailable  # noqa: F401


def _privateuse1_types():
    name = _devices.privateuse1_device()  # not "privateuseone", not torchax's "jax"
    if not name and "torch_tpu" in sys.modules:  # TorchTPU without a TPU names nothing:
        return {"tpu"}  # its region says so in one line (privateuse1/_region.py)
    return {name} if name else ()


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("torch_xla", "torch_xla",
           "pip install torch==2.9.0 torch_xla==2.9.0 (torch_xla's last release pins torch 2.9.0)",
           ("2.9", "2.9"), lambda: {"xla"}, "xla_amp.autocast._implementation", at_import=True),
    Engine("privateuse1", "torch",
           "a PrivateUse1 backend such as TorchTPU: pip install torch-tpu (torch 2.11-2.15, "
           "docs/torchtpu.md)",
           ("2.9", "2.15"), _privateuse1_types, "xla_amp.privateuse1._implementation",
           at_import=True),
    # imported on its own (import xla_amp.torchax): nothing at xla_amp's import
    Engine("torchax", "torchax", "pip install torchax==0.0.13 jax (see docs/torchax.md)",
           ("2.9", "2.15"), lambda: {"jax"}, "xla_amp.torchax._implementation",
           at_import=False),
)}


def get(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown xla_amp engine {name!r}; engines: {', '.join(ENGINES)}")
    return ENGINES[name]


def problem(name: str) -> str | None:
    """Why engine `name` cannot run here, in one line; None when it can."""
    return get(name).problem()


def available(name: str) -> bool:
    return get(name).available()


def require(name: str, feature: str) -> None:
    """Raise EngineUnavailable naming `feature` unless engine `name` can run."""
    get(name).require(feature)


def _device_type(device, where: str) -> str:
    if isinstance(device, torch.device):
        return device.type
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        if isinstance(device, str) and device and device.split(":")[0].isidentifier():
            return device.split(":")[0]  # a backend torch has no name for in this process
        raise ValueError(f"{where}: {device!r} is not a device") from None


def for_device(device, where: str = "xla_amp") -> Engine:
    """The engine that serves `device` (a torch.device or a string such as
    "xla:0", "tpu", "jax"). It may not be able to run here: its region
    then raises EngineUnavailable naming what to install."""
    kind = _device_type(device, where)
    for engine in ENGINES.values():
        if kind in engine.device_types():
            return engine
    served = "; ".join(f"{e.name} ({', '.join(sorted(e.device_types())) or 'no device yet'}: "
                       f"{e.install_hint})" for e in ENGINES.values())
    raise ValueError(f"{where}: no xla_amp engine serves device '{device}'; engines: {served}")


def served_types() -> list[str]:
    """The device types some engine serves now, sorted (for one-line refusals)."""
    return sorted(t for e in ENGINES.values() for t in e.device_types())


def for_device_type(device_type: str) -> Engine | None:
    """The engine serving `device_type`, or None (no error: autograd's replay asks for any)."""
    for engine in ENGINES.values():
        if device_type in engine.device_types():
            return engine
    return None


def for_module(module: torch.nn.Module) -> Engine:
    """The engine of `module`'s first parameter; for a module on no engine's
    device, the first engine that can run here (torch_xla, then PrivateUse1)."""
    first = next(module.parameters(), None)
    if first is not None:
        engine = for_device_type(first.device.type)
        if engine is not None:
            return engine
    return default()


def default() -> Engine:
    """The engine of a call that names no device: torch_xla where it runs,
    else PrivateUse1 (set_default_policy, autocast(None), a module on the CPU)."""
    return ENGINES["torch_xla"] if available("torch_xla") else ENGINES["privateuse1"]


def set_default_policy(policy) -> None:
    """The policy plain ``torch.autocast(<device>)`` uses where no xla_amp
    region is open, for the default engine (torch_xla's "xla", else the
    PrivateUse1 device): a policy name, a `Policy`, or None (torch_xla: by
    the device's hardware; PrivateUse1: "tpu"). Raises before changing
    anything on a bad value."""
    default().set_default_policy(policy)


_installed: list[str] = []


def install() -> None:
    """What `import xla_amp` does: each engine that can run here installs
    itself (torch_xla: its kernels over AutocastXLA; PrivateUse1: over
    AutocastPrivateUse1 where the backend is named; torchax: nothing)."""
    for engine in ENGINES.values():
        if engine.at_import and engine.name not in _installed and engine.available():
            engine.install()
            _installed.append(engine.name)
