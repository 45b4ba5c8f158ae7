"""The device types xla_amp's engines drive: "xla" (torch_xla), plus the
PrivateUse1 backend's name once the PrivateUse1 engine is installed for it
("tpu" under TorchTPU). The scaler and the step checks accept a tensor on
any of them."""
from __future__ import annotations

import torch

TYPES = {"xla"}


def add(device_type: str) -> None:
    TYPES.add(device_type)


def privateuse1_device() -> str:
    """The PrivateUse1 backend's name when it names a device the PrivateUse1
    engine drives ("tpu" under TorchTPU), else "": not the unrenamed
    "privateuseone", not torchax's "jax" (xla_amp.torchax's own)."""
    name = torch._C._get_privateuse1_backend_name()
    return "" if name in ("privateuseone", "jax") else name


def is_engine_type(device_type: str) -> bool:
    """"xla", or the PrivateUse1 engine's device type."""
    return device_type in TYPES or device_type == (privateuse1_device() or None)


def on_device(t: torch.Tensor) -> bool:
    """True for a tensor on a device an engine drives (no transfer)."""
    return t.is_xla or is_engine_type(t.device.type)
