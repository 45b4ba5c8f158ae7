"""xla_amp on torchax (PyTorch on JAX): the same policies, loss scaling and
sync-free steps for models torchax runs.

    autocast            xla_amp's policies applied to torchax's ops (_region.py)
    module_policies     per-module policies inside those regions
    LossScaler          a tensor-only, sync-free dynamic loss scaler (_scaler.py)
    make_train_step     model + loss + optimizer + policy + scaler -> one
                        jitted step (_step.py), optax or torch.optim optimizers
    (fp8)               xla_amp.fp8's layers on torchax tensors (_fp8.py)
    initialize_distributed  jax.distributed.initialize with timeouts and a
                        watchdog: a lost process ends the others, named
                        (_distributed.py)

Where CUDA is available, importing this says in one line that native CUDA
autograd no longer works in the process (_accelerator.py).
torchax's internals are reached through _hook.py only; versions are checked
(_pins.py) before torchax is imported, which _compat.py then does (on torch
2.13+ skipping the ops torchax names that torch removed). See docs/torchax.md.
"""
from xla_amp.torchax import _pins

_pins.check_installed()

from xla_amp.torchax import _compat  # noqa: E402

_compat.apply()

from xla_amp.torchax import _accelerator  # noqa: E402

_accelerator.warn_if_native_cuda_breaks()  # torchax took the accelerator from CUDA

from xla_amp.torchax._region import autocast, module_policies  # noqa: E402
from xla_amp.torchax._scaler import LossScaler  # noqa: E402
from xla_amp.torchax._step import TrainStep, make_train_step  # noqa: E402
from xla_amp.torchax import _fp8  # noqa: E402,F401  (fp8 layers on torchax tensors)
from xla_amp.torchax._distributed import initialize_distributed  # noqa: E402

__all__ = ["autocast", "module_policies", "LossScaler", "TrainStep", "make_train_step",
           "initialize_distributed"]
