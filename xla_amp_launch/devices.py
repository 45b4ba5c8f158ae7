"""Device set-up: one XLA device, or an SPMD mesh (data parallel, or the one
logical device of XLA:GPU through the CUDA plugin)."""
from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class Devices:
    device: object               # the XLA device to put tensors on
    mesh: object = None          # SPMD mesh over the data axis, or None
    count: int = 1
    hw: str = "?"
    axis: str = "data"           # the mesh's axis ("fsdp" with --fsdp)

    def put(self, t):
        """A CPU batch tensor on the device; in SPMD mode sharded along its
        first dimension over the mesh as it is copied (each device is sent
        its own rows)."""
        if self.mesh is None:
            return t.to(self.device)
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        spec = xs.ShardingSpec(self.mesh, (self.axis,) + (None,) * (t.dim() - 1))
        return xm.send_cpu_data_to_device([t], self.device, spec)[0]


def setup_devices(num_devices: int, device: str = "auto", spmd: bool = False,
                  fsdp: bool = False) -> Devices:
    """Start the XLA runtime. ``device="gpu"``: XLA:GPU through
    xla_amp.gpu.use_cuda_plugin (SPMD mode). In SPMD mode (``spmd``, the
    GPU, ``fsdp`` or ``num_devices > 1``) the batch is sharded over a
    one-axis mesh of ``num_devices`` ("data"; "fsdp" with ``fsdp``, the
    axis FSDPv2 shards parameters over). Must run before anything touches
    a device."""
    if device == "gpu":
        import xla_amp.gpu
        try:
            xla_amp.gpu.use_cuda_plugin()
        except xla_amp.gpu.CudaPluginError as e:
            raise SystemExit(f"error: --device gpu: {e}") from None
        spmd = True
    elif num_devices > 1 and os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU":
        have = os.environ.get("CPU_NUM_DEVICES")
        if have is not None and have != str(num_devices):
            raise SystemExit(f"error: --num_devices={num_devices} but the environment "
                             f"sets CPU_NUM_DEVICES={have}; unset it or make them agree.")
        os.environ["CPU_NUM_DEVICES"] = str(num_devices)
        os.environ.setdefault("PJRT_DEVICE", "CPU")
    import numpy as np
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if num_devices == 1 and not (spmd or fsdp):
        dev = torch_xla.device()
        return Devices(dev, None, 1, xm.xla_device_hw(dev))
    xr.use_spmd()
    import torch_xla.distributed.spmd as xs
    have = xr.global_runtime_device_count()
    if have != num_devices:
        raise SystemExit(f"error: --num_devices={num_devices} but the runtime has {have} "
                         "devices; SPMD data parallelism here spans all of them.")
    axis = "fsdp" if fsdp else "data"
    mesh = xs.Mesh(np.arange(num_devices), (num_devices,), (axis,))
    dev = torch_xla.device()
    return Devices(dev, mesh, num_devices, xm.xla_device_hw(dev), axis)
