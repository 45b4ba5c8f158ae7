"""The device types xla_amp's engines drive: "xla" (torch_xla), plus the
PrivateUse1 backend's name once the PrivateUse1 engine is installed for it
("tpu" under TorchTPU). The scaler and the step checks accept a tensor on
any of them."""
from __future__ import annotations

import torch

TYPES = {"xla"}


def add(device_type: str) -> None:
    TYPES.add(device_type)


def is_engine_type(device_type: str) -> bool:
    """"xla", or the PrivateUse1 backend's name when it names a device
    (not the unrenamed "privateuseone", not torchax's "jax", which has its
    own scaler)."""
    if device_type in TYPES:
        return True
    name = torch._C._get_privateuse1_backend_name()
    return device_type == name and name not in ("privateuseone", "jax")


def on_device(t: torch.Tensor) -> bool:
    """True for a tensor on a device an engine drives (no transfer)."""
    return t.is_xla or is_engine_type(t.device.type)
