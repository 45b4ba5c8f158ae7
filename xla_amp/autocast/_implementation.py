"""The torch_xla engine's implementation: xla_amp's native kernels (xla_amp._C, csrc/) under
AutocastXLA, for XLA devices (torch 2.9 + torch_xla 2.9). Its parts:
xla_amp/_engine.py (the one door to _C, shared with the PrivateUse1
engine's native kernels), autocast/ (the region, recording, torch.compile),
precision/_xla_device_module.py, gpu/ (the CUDA PJRT plugin route), and
the XLA-only packages over it: syncfree/, distributed.py, sharded/."""
from __future__ import annotations

import os

import torch

from xla_amp.engines._base import Implementation

CUDA_PLUGIN_ENV = "XLA_AMP_CUDA_PLUGIN"  # 1: XLA:GPU through the CUDA plugin at import (gpu.ENV)


class TorchXla(Implementation):
    def region_class(self) -> type:
        from xla_amp.autocast._region import autocast
        return autocast

    def compile(self, policy):
        from xla_amp import _engine
        return _engine.compile(policy)

    def set_default_policy(self, policy) -> None:
        from xla_amp.autocast._region import set_default_policy
        set_default_policy(policy)

    def active(self):
        from xla_amp import _engine
        return _engine.active_policy()

    def push(self, table) -> None:
        from xla_amp import _engine
        _engine.push_compiled(table)

    def pop(self) -> None:
        from xla_amp import _engine
        _engine.pop()

    def active_dtype(self) -> torch.dtype | None:
        return torch.get_autocast_dtype("xla") if torch.is_autocast_enabled("xla") else None

    def regions(self, policy) -> dict:
        from xla_amp.autocast._matmul_precision import not_setting
        with not_setting():  # torch_xla's matmul precision is the process's, not a module's
            return super().regions(policy)

    def default_device(self) -> str:
        return "xla:0"  # autocast state is per device type: the index names nothing

    def rng_restorer(self, device: torch.device):
        import torch_xla.core.xla_model as xm
        state = xm.get_rng_state(device)
        return lambda: xm.set_rng_state(state, device)

    def install(self) -> None:
        """Load torch_xla (its AutocastXLA kernels must exist before ours)
        and _C (ImportError if built for another torch), take over
        AutocastXLA, hook torch.compile, give torch.utils.checkpoint a
        torch.xla, and replay policies in checkpoints' recompute; with
        XLA_AMP_CUDA_PLUGIN set, XLA:GPU through the CUDA plugin."""
        import torch_xla  # noqa: F401
        from xla_amp import _version_check  # noqa: F401
        from xla_amp import _engine
        from xla_amp.autocast import _dynamo
        from xla_amp.precision import _checkpointing, _xla_device_module
        _engine.install()
        _dynamo.install()
        _xla_device_module.install()  # torch_xla has no torch.xla
        _checkpointing.install(torch_xla=True)
        if os.environ.get(CUDA_PLUGIN_ENV, ""):  # before any tensor exists; else gpu/ stays unloaded
            from xla_amp import gpu
            gpu.from_environment()


IMPLEMENTATION = TorchXla()
