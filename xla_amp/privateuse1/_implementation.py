"""The PrivateUse1 engine's implementation: policies under AutocastPrivateUse1 for the
backend renamed from PrivateUse1 (TorchTPU's "tpu"), by the native kernels
where a build for this torch loads, else Python ones (xla_amp/privateuse1/)."""
from __future__ import annotations

import torch

from xla_amp.engines._base import Implementation


class PrivateUse1(Implementation):
    def region_class(self) -> type:
        from xla_amp.privateuse1._region import autocast
        return autocast

    def compile(self, policy):
        from xla_amp.privateuse1 import _install
        return _install.compile(policy)

    def set_default_policy(self, policy) -> None:
        from xla_amp.privateuse1._region import set_default_policy
        set_default_policy(policy)

    def active(self):
        from xla_amp.privateuse1 import _kernels
        return _kernels.active_table()

    def push(self, table) -> None:
        from xla_amp.privateuse1 import _kernels
        _kernels.push(table)

    def pop(self) -> None:
        from xla_amp.privateuse1 import _kernels
        _kernels.pop()

    def active_dtype(self) -> torch.dtype | None:
        name = torch._C._get_privateuse1_backend_name()
        return torch.get_autocast_dtype(name) if torch.is_autocast_enabled(name) else None

    def default_device(self):
        return None  # the backend as now named

    def install(self) -> None:
        """Plain torch.autocast(<device>) works or refuses in one line
        (privateuse1/_install.at_import); checkpoints' recompute replays policies."""
        from xla_amp.precision import _checkpointing
        from xla_amp.privateuse1 import _install
        _install.at_import()
        _checkpointing.install(torch_xla=False)


IMPLEMENTATION = PrivateUse1()
