"""Shared pieces of the framework integration tests: a small classifier and
its data, the one patch Lightning needs on XLA:CPU, and the checks every
framework's run is held to."""
import contextlib
import os
from unittest import mock

import torch

from xla_amp.fp8 import Fp8Recipe

STEPS = 20
BATCH = 16
# test id -> (precision, the plugin's other arguments): 16-mixed under the
# cuda rules (the ones XLA:GPU users get), bf16-true with an fp32 master or
# with stochastic rounding
MODES = {"bf16-mixed": ("bf16-mixed", {}), "16-mixed": ("16-mixed", {"policy": "cuda"}),
         "bf16-true": ("bf16-true", {"master_weights": True}),
         "bf16-true-sr": ("bf16-true", {"stochastic_rounding": True}),
         # the Linear(32, 64) in fp8, delayed scaling; the 4-way head kept (4 % 16)
         "fp8-mixed": ("fp8-mixed", {"fp8": Fp8Recipe(scaling="delayed", keep=("*2",))})}
COMPUTE = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "bf16-true": torch.bfloat16,
           "bf16-true-sr": torch.bfloat16, "fp8-mixed": torch.bfloat16, "32-true": torch.float32}


def optimizer_options(mode: str) -> dict:
    """The syncfree options the mode's optimizer carries."""
    return {k: v for k, v in MODES[mode][1].items() if k not in ("policy", "fp8")}


def param_dtype(mode: str) -> torch.dtype:
    return torch.bfloat16 if MODES[mode][0] == "bf16-true" else torch.float32


def data(steps=STEPS, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * BATCH, 32, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 0).long()) % 4  # learnable labels
    return torch.utils.data.TensorDataset(x, y)


def loader(steps=STEPS):
    return torch.utils.data.DataLoader(data(steps), batch_size=BATCH, shuffle=False)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def xla_env_vars() -> dict:
    """The deprecated switches the frameworks' own XLA precision sets."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("XLA_USE_", "XLA_DOWNCAST_"))}


def close(losses, reference, rel=0.01):
    """Mean training loss within ``rel`` of the reference run's."""
    a = sum(losses) / len(losses)
    b = sum(reference) / len(reference)
    assert abs(a - b) <= rel * abs(b), (a, b, losses, reference)


@contextlib.contextmanager
def tpu_probe():
    """Lightning refuses accelerator="tpu" when torch_xla reports no TPU
    chip (XLAAccelerator.is_available -> tpu.num_available_devices() == 0
    on XLA:CPU). This patches that probe, and only it, to report one
    device: the XLA device Lightning then uses is the real XLA:CPU one."""
    from lightning.fabric.accelerators.xla import XLAAccelerator
    import torch_xla._internal.tpu as tpu
    XLAAccelerator.auto_device_count.cache_clear()
    XLAAccelerator.is_available.cache_clear()
    with mock.patch.object(tpu, "num_available_devices", lambda: 1):
        yield
    XLAAccelerator.auto_device_count.cache_clear()
    XLAAccelerator.is_available.cache_clear()
