"""xla_amp's engines: one interface (`Engine`), three implementations, and
the one place that picks an engine for a device (`for_device`)."""
from xla_amp.engines._base import Engine
from xla_amp.engines._base import EngineUnavailable
from xla_amp.engines._base import torch_minor
from xla_amp.engines._registry import ENGINES
from xla_amp.engines._registry import available
from xla_amp.engines._registry import default
from xla_amp.engines._registry import for_device
from xla_amp.engines._registry import for_device_type
from xla_amp.engines._registry import for_module
from xla_amp.engines._registry import get
from xla_amp.engines._registry import install
from xla_amp.engines._registry import problem
from xla_amp.engines._registry import require
from xla_amp.engines._registry import served_types

__all__ = ["Engine", "EngineUnavailable", "ENGINES", "available", "default", "for_device",
           "for_device_type", "for_module", "get", "install", "problem", "require",
           "served_types", "torch_minor"]
