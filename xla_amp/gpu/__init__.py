"""XLA:GPU again: NVIDIA GPUs through JAX's CUDA PJRT plugin. Part of the
torch_xla engine (xla_amp/engines/_torch_xla.py). Never run on a GPU: the
GPU figures come from the torchax route (docs/gpu.md).

torch_xla 2.9 removed its own XLA:CUDA client and aborts on CUDA devices;
it still loads PJRT C-API plugins. ``use_cuda_plugin()`` registers JAX's
(``jax-cuda12-pjrt``, the version whose C API matches), checks what the
plugin needs, and turns SPMD mode on, where torch_xla accepts the device::

    import xla_amp.gpu
    xla_amp.gpu.use_cuda_plugin()        # before the first XLA tensor
    device = torch_xla.device()          # SPMD:0; xla_device_hw: "CUDA"
    with xla_amp.autocast(device): ...   # the cuda rules, float16

or, with no code change: ``XLA_AMP_CUDA_PLUGIN=1`` and ``import xla_amp`` (unset,
``import xla_amp`` does not load this package).
Install: ``pip install 'xla_amp[gpu]'``. docs/gpu.md has the details.
"""
import os

from xla_amp.gpu._plugin import CudaPlugin, CudaPluginError, CudaSetup, use_cuda_plugin

ENV = "XLA_AMP_CUDA_PLUGIN"  # the torch_xla engine reads it at import (CUDA_PLUGIN_ENV)

__all__ = ["use_cuda_plugin", "CudaPluginError", "CudaSetup", "CudaPlugin", "ENV"]


def from_environment() -> CudaSetup | None:
    """``use_cuda_plugin()`` when XLA_AMP_CUDA_PLUGIN=1 (xla_amp's import
    calls this); anything but unset, 0 or 1 is an error."""
    value = os.environ.get(ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}={value!r}: use 1 (XLA:GPU through the CUDA plugin) or 0")
    return use_cuda_plugin() if value == "1" else None
