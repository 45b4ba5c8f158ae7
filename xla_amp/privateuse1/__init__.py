"""xla_amp's PrivateUse1 engine: xla_amp's policies on a device registered
under PyTorch's PrivateUse1 key, TorchTPU's "tpu" first (torch-tpu, torch
2.11-2.15), with Python kernels under AutocastPrivateUse1.

    autocast(device, policy=..., dtype=...)   a region (_region.py); also
                                              reached as xla_amp.autocast("tpu")
    set_default_policy(policy)                what plain torch.autocast("tpu") uses
    install()                                 take over AutocastPrivateUse1 now
                                              (xla_amp.autocast does it on first use;
                                              import xla_amp does it when torch_tpu
                                              is loaded)
    displaced()                               ops whose TorchTPU autocast kernel
                                              xla_amp's replaced
    kernels()                                 "native" | "python": which kernels
                                              serve AutocastPrivateUse1

The kernels are xla_amp's native ones (xla_amp._C, the same C++ as the
torch_xla engine's, registered under AutocastPrivateUse1) where a build for
the running torch loads (`make current`), else the Python ones (_kernels.py);
install() says which in one log line. XLA_AMP_PRIVATEUSE1_KERNELS=python
picks the Python ones, =native refuses to run without the native ones.

Either kind are per-op registrations, one per overload a policy lists
(the boxed fallback alternative is measured in
benchmarks/privateuse1_dispatch.py); _install.py registers them and the
GradScaler's two ops where the device lacks them (_amp_ops.py). See
docs/torchtpu.md.
"""
from xla_amp.privateuse1._install import install, kernels
from xla_amp.privateuse1._region import autocast, set_default_policy


def displaced() -> list[str]:
    from xla_amp.privateuse1 import _install
    return list(_install.displaced)


__all__ = ["autocast", "set_default_policy", "install", "displaced", "kernels"]
