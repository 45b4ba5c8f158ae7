"""The interface every engine implements, and the checks all of them share.

An engine is the code that applies an xla_amp policy on one runtime. The
registry (_registry.py) holds one `Engine` per runtime: what it is, and the
module of its package that implements the hooks below (an `Implementation`:
autocast/_implementation.py, privateuse1/_implementation.py,
torchax/_implementation.py), imported by name on first use, so the core
never imports an engine.

    name, device_types()      which engine, the device types it serves
    problem() / available()   whether its runtime can run here (one line why not)
    region(device, **args)    its autocast region, the same arguments on every engine
    region_class()            the class of that region
    compile(policy)           the policy in the engine's form (its "table")
    set_default_policy(p)     what plain torch.autocast(<device>) uses outside regions
    active() / push(t) / pop()  the calling thread's active table: what autograd's
                              replay (custom_bwd, activation checkpointing) restores
    active_dtype()            the enclosing region's dtype on this thread, or None
    regions(policy)           dtype -> a region of `policy` (module_policies)
    rng_restorer(device)      a function putting back the RNG state random ops draw from
    install()                 what `import xla_amp` does for it (once; where it runs)
"""
from __future__ import annotations

import importlib.util
import sys

import torch


class EngineUnavailable(ImportError):
    """An engine's runtime is not installed (or cannot run on this torch)."""


def torch_minor(version: str | None = None) -> tuple[int, int]:
    """(2, 15) for "2.15.0+cu132"."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


# What each engine's implementation supplies, reached through its Engine.
HOOKS = ("region_class", "region", "compile", "set_default_policy", "active", "push", "pop",
         "active_dtype", "regions", "default_device", "rng_restorer", "install")


_BY_NAME: dict[str, "Engine"] = {}  # every Engine made, by name (the registry's)


def _named(name: str) -> "Engine":
    return _BY_NAME[name]


class Engine:
    """One engine: what it is (name, runtime package, how to install it, the
    torch releases it runs on, the device types it serves) and, loaded on
    first use from its package, what it does (HOOKS, an Implementation)."""

    def __init__(self, name: str, module: str, install_hint: str, torch_range: tuple[str, str],
                 device_types, implementation: str, at_import: bool):
        self.name, self.module, self.install_hint = name, module, install_hint
        self.torch_range = torch_range  # torch minor releases it runs on, inclusive
        self._device_types = device_types  # () -> the device types it serves now
        self._implementation_path = implementation  # "package.module", its IMPLEMENTATION
        self.at_import = at_import  # whether `import xla_amp` runs its install()
        self._implementation = None
        _BY_NAME[name] = self

    def __reduce__(self):  # one object per engine: pickled by name (a model under
        return _named, (self.name,)  # module_policies holds its engine)

    def __repr__(self) -> str:
        return f"<xla_amp engine {self.name}>"

    def device_types(self) -> frozenset[str]:
        return frozenset(self._device_types())

    def problem(self) -> str | None:
        """Why this engine cannot run here, in one line; None when it can."""
        low, high = (_minor(v) for v in self.torch_range)
        if not low <= torch_minor() <= high:
            low_s, high_s = self.torch_range
            span = f"torch {low_s} only" if low_s == high_s else f"torch {low_s}-{high_s}"
            return (f"runs on {span}, and this Python has torch {torch.__version__}; "
                    f"install: {self.install_hint}")
        blocked = self.module in sys.modules and sys.modules[self.module] is None
        if blocked or importlib.util.find_spec(self.module) is None:
            return (f"needs the package '{self.module}', which is not installed: "
                    f"{self.install_hint}")
        return None

    def available(self) -> bool:
        return self.problem() is None

    def require(self, feature: str) -> None:
        """EngineUnavailable naming `feature` unless this engine can run."""
        reason = self.problem()
        if reason is not None:
            raise EngineUnavailable(f"{feature} needs xla_amp's {self.name} engine, which {reason}")

    def implementation(self) -> "Implementation":
        """The engine's code, imported from its package on first use (the
        registry names it, so the core never imports an engine)."""
        if self._implementation is None:
            types = ", ".join(f"'{t}'" for t in sorted(self.device_types())) or "its device"
            self.require(f"xla_amp on {types}")
            module = importlib.import_module(self._implementation_path)
            self._implementation = module.IMPLEMENTATION
            self._implementation.engine = self
        return self._implementation

    def __getattr__(self, name):
        if name in HOOKS:
            return getattr(self.implementation(), name)
        raise AttributeError(f"xla_amp engine {self.name!r} has no attribute {name!r}")


class Implementation:
    """What an engine's package implements (HOOKS); the defaults below serve
    engines without an own rule."""

    engine: Engine

    def region_class(self) -> type:
        raise NotImplementedError

    def region(self, device, **arguments):
        """The engine's autocast region for `device`; `arguments` are
        xla_amp.autocast's (enabled, dtype, cache_enabled, policy, record,
        fp32_matmul_precision) plus the engine's own keywords."""
        return self.region_class()(device, **arguments)

    def compile(self, policy):
        raise NotImplementedError

    def set_default_policy(self, policy) -> None:
        raise ValueError(f"set_default_policy: xla_amp's {self.engine.name} engine has no "
                         "plain torch.autocast to give a default policy to")

    def active(self):
        raise NotImplementedError

    def push(self, table) -> None:
        raise NotImplementedError

    def pop(self) -> None:
        raise NotImplementedError

    def active_dtype(self) -> torch.dtype | None:
        raise NotImplementedError

    def regions(self, policy) -> dict:
        return {dtype: self.region(self.default_device(), dtype=dtype, policy=policy)
                for dtype in policy.supported_dtypes}

    def default_device(self):
        return next(iter(sorted(self.engine.device_types())))

    def rng_restorer(self, device: torch.device):
        """Puts back the CPU's and the device module's RNG state (an engine
        with its own generator overrides this)."""
        module = getattr(torch, device.type, None)
        cpu = torch.get_rng_state()
        own = module.get_rng_state() if hasattr(module, "get_rng_state") else None

        def restore():
            torch.set_rng_state(cpu)
            if own is not None:
                module.set_rng_state(own)
        return restore

    def install(self) -> None:
        """Nothing at import, unless the engine says otherwise."""
