"""xla_amp: automatic mixed precision for PyTorch/XLA, and beyond it.

One face on every runtime: ``import xla_amp`` gives the same names with or
without torch_xla. ``xla_amp.autocast(device)`` picks the engine serving the
device (xla_amp.engines.for_device): torch_xla's for an XLA device,
PrivateUse1's for TorchTPU's "tpu", torchax's for "jax". A name whose
engine cannot run here raises EngineUnavailable (an ImportError) in one
line naming what to install, when it is first used.

Importing xla_amp does one thing: each engine that can run here installs
itself (xla_amp.engines.install; with torch_xla: its native kernels take over
the AutocastXLA dispatch key, so plain ``torch.autocast("xla")`` runs
through them), after the environment's op-list overrides
(XLA_AMP_*_OPS_LIST) are read. docs/architecture.md has the layers and
where each concept lives.
"""
from xla_amp import checkpoint
from xla_amp import engines
from xla_amp import fp8
from xla_amp import policies
from xla_amp.autocast._region import autocast
from xla_amp.engines._registry import set_default_policy
from xla_amp.numerics import ComparisonReport
from xla_amp.numerics import NonfiniteWatch
from xla_amp.numerics import PrecisionReport
from xla_amp.numerics import compare
from xla_amp.numerics import watch_nonfinite
from xla_amp.policies import CATEGORIES
from xla_amp.policies import Policy
from xla_amp.policies import _env_overrides
from xla_amp.precision import ModulePolicyHandle
from xla_amp.precision import cast_module
from xla_amp.precision import custom_bwd
from xla_amp.precision import custom_fwd
from xla_amp.precision import module_policies
from xla_amp.scaler import GradScaler

_env_overrides.load_from_environment()
engines.install()

# names of the torch_xla engine's packages: loaded on first use
_TORCH_XLA = {
    "syncfree": ("xla_amp.syncfree", None,
                 "xla_amp.syncfree (use torch.optim optimizers with GradScaler's masked step)"),
    "gpu": ("xla_amp.gpu", None, "xla_amp.gpu"),
    "sharded": ("xla_amp.sharded", None, "xla_amp.sharded"),
    "distributed": ("xla_amp.distributed", None, "xla_amp.distributed"),
    "all_reduce_gradients": ("xla_amp.distributed", "all_reduce_gradients",
                             "xla_amp.all_reduce_gradients"),
    "optimizer_step": ("xla_amp.distributed", "optimizer_step", "xla_amp.optimizer_step"),
    "explain": ("xla_amp.numerics", "explain", "xla_amp.explain"),
}

__all__ = ["autocast", "set_default_policy", "custom_fwd", "custom_bwd", "policies", "Policy",
           "CATEGORIES", "GradScaler", "syncfree", "all_reduce_gradients", "optimizer_step",
           "module_policies", "ModulePolicyHandle", "cast_module",
           "PrecisionReport", "explain", "watch_nonfinite", "NonfiniteWatch",
           "compare", "ComparisonReport", "gpu", "sharded", "checkpoint", "fp8", "engines"]
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _TORCH_XLA:
        raise AttributeError(f"module 'xla_amp' has no attribute {name!r}")
    module, attribute, feature = _TORCH_XLA[name]
    engines.require("torch_xla", feature)
    import importlib
    value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value
    return value
