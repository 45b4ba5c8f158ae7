"""Registering JAX's CUDA PJRT plugin with torch_xla, in SPMD mode.

    use_cuda_plugin(options):
        if set up before:      the same options -> the same CudaSetup; other -> error
        if the XLA runtime started, or PJRT_DEVICE names another device -> error
        found = find the plugin, nvcc, CUDA libraries, driver
        if anything is missing -> one error listing each piece and its fix
        SPMD on                (torch_xla 2.9 aborts when the current device is CUDA;
                                in SPMD mode it is SPMD:0, one logical device)
        PJRT_DEVICE = CUDA;  XLA_FLAGS += --xla_gpu_cuda_data_dir=<nvcc>
        register CudaPlugin(found.plugin_path, options) as "CUDA"

Nothing is changed before every check has passed.
"""
from __future__ import annotations

import dataclasses
import os
import threading

import torch_xla
import torch_xla.experimental.plugins as plugins
import torch_xla.runtime as xr

from xla_amp.gpu import _requirements

ALLOCATORS = ("default", "platform", "bfc", "cuda_async")
_lock = threading.Lock()
_setup: "CudaSetup | None" = None


class CudaPluginError(RuntimeError):
    """XLA:GPU cannot start: the message names each missing piece and its fix."""


@dataclasses.dataclass(frozen=True)
class CudaSetup:
    """What ``use_cuda_plugin`` registered (returned by every call)."""
    plugin_path: str
    plugin_version: str
    c_api: tuple[int, int]
    nvcc_dir: str
    driver_version: int
    device_count: int
    options: tuple[tuple[str, object], ...]  # the client options, sorted


class CudaPlugin(plugins.DevicePlugin):
    """torch_xla's view of the plugin: its library, one process, every local GPU."""

    def __init__(self, library: str, options: dict, device_count: int):
        super().__init__()
        self._library, self._options, self._count = library, dict(options), device_count

    def library_path(self) -> str:
        return self._library

    def client_create_options(self) -> dict:
        return dict(self._options)

    def physical_chip_count(self) -> int:
        return self._count

    def requires_xla_coordinator(self) -> bool:
        return False


def client_options(memory_fraction=None, preallocate=None, allocator=None) -> dict:
    """The plugin's client options from ``use_cuda_plugin``'s arguments
    (an unknown key is an error inside the plugin, so only these pass)."""
    out = {}
    if memory_fraction is not None:
        if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, (int, float)) \
                or not 0.0 < float(memory_fraction) <= 1.0:
            raise ValueError(f"memory_fraction must be a number in (0, 1], got "
                             f"{memory_fraction!r}")
        out["memory_fraction"] = float(memory_fraction)
    if preallocate is not None:
        if not isinstance(preallocate, bool):
            raise ValueError(f"preallocate must be True or False, got {preallocate!r}")
        out["preallocate"] = preallocate
    if allocator is not None:
        if allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got "
                             f"{allocator!r}")
        out["allocator"] = allocator
    return out


def _refuse_started_runtime() -> None:
    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise CudaPluginError(
            f"the XLA runtime already started on {xr.device_type()} (PJRT_DEVICE="
            f"{os.environ.get('PJRT_DEVICE')}); call xla_amp.gpu.use_cuda_plugin() before "
            "the first XLA tensor or device query, or set XLA_AMP_CUDA_PLUGIN=1 and import "
            "xla_amp first")
    if torch_xla._XLAC._xla_get_spmd_config_is_locked():
        raise CudaPluginError("XLA tensors already exist; call xla_amp.gpu.use_cuda_plugin() "
                              "before the first one")
    pjrt = os.environ.get("PJRT_DEVICE")
    if pjrt not in (None, "", "CUDA"):
        raise CudaPluginError(f"PJRT_DEVICE={pjrt} is set, which names another device; "
                              "unset it (use_cuda_plugin sets PJRT_DEVICE=CUDA)")


def _add_xla_flag(flag: str) -> None:
    name = flag.split("=", 1)[0]
    current = os.environ.get("XLA_FLAGS", "")
    if name not in current:  # a user's own setting wins
        os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()


def use_cuda_plugin(*, memory_fraction: float | None = None, preallocate: bool | None = None,
                    allocator: str | None = None) -> CudaSetup:
    """Make XLA:GPU this process's XLA device, through JAX's CUDA PJRT plugin.

    When to call: once, before the first XLA tensor (or set
    ``XLA_AMP_CUDA_PLUGIN=1`` and import xla_amp). Later calls with the same
    arguments return the same ``CudaSetup``.

    The process runs in SPMD mode (``torch_xla.device()`` is ``SPMD:0``: one
    logical device over the local GPUs; a model without sharding
    annotations runs replicated, so on one GPU exactly as on one device);
    ``xm.xla_device_hw`` reports "CUDA", which selects the cuda policy
    (fp16 + GradScaler). docs/gpu.md has the limits.

    memory_fraction, preallocate, allocator: the plugin's GPU memory options
    (default: the plugin's, which preallocates 75 % of the GPU).

    Raises CudaPluginError naming every missing piece (the plugin at the
    pinned version, nvcc's ptxas and libdevice, torch's CUDA libraries, the
    driver) and the command that installs it; ValueError for a bad option.
    """
    global _setup
    options = client_options(memory_fraction, preallocate, allocator)
    key = tuple(sorted(options.items()))
    with _lock:
        if _setup is not None:
            if _setup.options != key:
                raise CudaPluginError(f"use_cuda_plugin() already ran with options "
                                      f"{dict(_setup.options)}; the plugin cannot be set up "
                                      f"again with {options}")
            return _setup
        _refuse_started_runtime()
        found = _requirements.find()
        if found.problems:
            raise CudaPluginError("XLA:GPU cannot start:\n  - " + "\n  - ".join(found.problems))
        xr.use_spmd()
        os.environ["PJRT_DEVICE"] = "CUDA"
        _add_xla_flag(f"--xla_gpu_cuda_data_dir={found.nvcc_dir}")
        plugins.use_dynamic_plugins()
        plugins.register_plugin("CUDA", CudaPlugin(found.plugin_path, options,
                                                   found.device_count))
        _setup = CudaSetup(found.plugin_path, found.plugin_version, found.c_api, found.nvcc_dir,
                           found.driver_version, found.device_count, key)
        return _setup
