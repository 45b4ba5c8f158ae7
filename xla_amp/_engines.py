"""Which engines this process can run, and the one line when one is missing.

xla_amp is a core (policies, Policy, fp8, checkpoint, the scaler's tensor
math, the numerics tools that need no engine) under three engines, each
loaded only where its runtime is installed:

    torch_xla    the native kernels under AutocastXLA (xla_amp/_engine.py,
                 csrc/), syncfree, gpu, sharded, distributed; torch 2.9 only
                 (torch_xla 2.9.0, its last release, pins torch 2.9.0)
    torchax      xla_amp.torchax: PyTorch on JAX
    privateuse1  xla_amp.privateuse1: Python kernels under
                 AutocastPrivateUse1, for TorchTPU (torch-tpu, device "tpu")
                 and any other PrivateUse1 backend; torch 2.9-2.15

    available(name)          -> bool: its runtime imports here (cheap: a spec lookup;
                             sys.modules[name] = None blocks it, as for import)
    require(name, feature)   EngineUnavailable (an ImportError), one line:
                             which package is missing and how to install it
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys

import torch


class EngineUnavailable(ImportError):
    """An engine's runtime is not installed (or cannot run on this torch)."""


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str
    module: str             # the runtime package it needs
    install: str            # how to get it
    torch_range: tuple[str, str]  # the torch minor releases it runs on, inclusive


ENGINES = {
    "torch_xla": Engine("torch_xla", "torch_xla",
                        "pip install torch==2.9.0 torch_xla==2.9.0 (torch_xla's last release "
                        "pins torch 2.9.0)", ("2.9", "2.9")),
    "torchax": Engine("torchax", "torchax",
                      "pip install torchax==0.0.13 jax (see docs/torchax.md)", ("2.9", "2.15")),
    "privateuse1": Engine("privateuse1", "torch",
                          "a PrivateUse1 backend such as TorchTPU: pip install torch-tpu "
                          "(torch 2.11-2.15, docs/torchtpu.md)", ("2.9", "2.15")),
}


def torch_minor(version: str | None = None) -> tuple[int, int]:
    """(2, 15) for "2.15.0+cu132"."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown xla_amp engine {name!r}; engines: {', '.join(ENGINES)}")
    return ENGINES[name]


def problem(name: str) -> str | None:
    """Why engine `name` cannot run here, in one line; None when it can."""
    engine = _engine(name)
    low, high = (_minor(v) for v in engine.torch_range)
    running = torch_minor()
    if not low <= running <= high:
        low_s, high_s = engine.torch_range
        span = f"torch {low_s} only" if low_s == high_s else f"torch {low_s}-{high_s}"
        return (f"runs on {span}, and this Python has torch {torch.__version__}; "
                f"install: {engine.install}")
    blocked = engine.module in sys.modules and sys.modules[engine.module] is None
    if blocked or importlib.util.find_spec(engine.module) is None:
        return f"needs the package '{engine.module}', which is not installed: {engine.install}"
    return None


def available(name: str) -> bool:
    return problem(name) is None


def require(name: str, feature: str) -> None:
    """Raise EngineUnavailable naming `feature` unless engine `name` can run."""
    reason = problem(name)
    if reason is not None:
        raise EngineUnavailable(f"{feature} needs xla_amp's {name} engine, which {reason}")
