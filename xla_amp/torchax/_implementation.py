"""The torchax engine's implementation: policies applied in torchax's dispatch, for PyTorch
on JAX (device "jax"; xla_amp/torchax/). Loaded only when used: importing
it imports torchax and JAX (xla_amp/torchax/__init__.py)."""
from __future__ import annotations

import torch

from xla_amp.engines._base import Implementation


class Torchax(Implementation):
    def region_class(self) -> type:
        from xla_amp.torchax._region import autocast
        return autocast

    def compile(self, policy):
        from xla_amp.torchax import _rules
        return _rules.compile(policy)

    def active(self):
        from xla_amp.torchax import _region
        return _region.current()

    def push(self, table) -> None:
        from xla_amp.torchax import _region
        _region._stack().append(table)

    def pop(self) -> None:
        from xla_amp.torchax import _region
        _region._stack().pop()

    def active_dtype(self) -> torch.dtype | None:
        top = self.active()
        return None if top is None else top[1]

    def regions(self, policy) -> dict:
        from xla_amp.torchax import _region
        backend = _region.backend_name(None)
        return {dtype: self.region("jax", dtype=dtype, policy=policy)
                for dtype in policy.supported_dtypes if dtype in _region.BACKEND_DTYPES[backend]}


IMPLEMENTATION = Torchax()
