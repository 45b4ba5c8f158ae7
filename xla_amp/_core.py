"""What ``import xla_amp`` gives on a torch without torch_xla (torch 2.9-2.15):
the core, with the PrivateUse1 engine (xla_amp.privateuse1) behind the
public names that have a meaning there. A name that needs the torch_xla
engine raises EngineUnavailable (an ImportError) in one line, naming the
package to install, when it is first looked up.

    autocast, set_default_policy   the PrivateUse1 engine's (device "tpu")
    custom_fwd, custom_bwd         the region's policy in a Function's backward
    module_policies, cast_module   per-module precision on that device
    GradScaler                     device-side loss scaling, any optimizer
    policies, Policy, CATEGORIES, fp8, checkpoint, watch_nonfinite, compare
"""
from xla_amp import _engines
from xla_amp import checkpoint, fp8, policies  # noqa: F401
from xla_amp.precision import custom_bwd, custom_fwd  # noqa: F401
from xla_amp.numerics import ComparisonReport, NonfiniteWatch, compare, watch_nonfinite  # noqa: F401
from xla_amp.policies import CATEGORIES, Policy  # noqa: F401
from xla_amp.policies import _env_overrides
from xla_amp.precision import ModulePolicyHandle, cast_module, module_policies  # noqa: F401
from xla_amp.precision import _checkpointing
from xla_amp.privateuse1 import _install, autocast, set_default_policy  # noqa: F401
from xla_amp.scaler import GradScaler  # noqa: F401

_env_overrides.load_from_environment()

# public names of the torch_xla engine -> what the one line calls them
TORCH_XLA_ONLY = {
    "syncfree": "xla_amp.syncfree (use torch.optim optimizers with GradScaler's masked step)",
    "gpu": "xla_amp.gpu", "sharded": "xla_amp.sharded", "distributed": "xla_amp.distributed",
    "all_reduce_gradients": "xla_amp.all_reduce_gradients",
    "optimizer_step": "xla_amp.optimizer_step",
    "explain": "xla_amp.explain", "PrecisionReport": "xla_amp.PrecisionReport",
}

__all__ = ["autocast", "set_default_policy", "module_policies", "ModulePolicyHandle",
           "cast_module", "GradScaler", "policies", "Policy", "CATEGORIES", "fp8",
           "checkpoint", "watch_nonfinite", "NonfiniteWatch", "compare", "ComparisonReport",
           "custom_fwd", "custom_bwd"]


def __getattr__(name):
    if name in TORCH_XLA_ONLY:
        _engines.require("torch_xla", TORCH_XLA_ONLY[name])
    raise AttributeError(f"module 'xla_amp' has no attribute {name!r}")


_install.at_import()  # plain torch.autocast(<PrivateUse1 device>) works or refuses in one line
_checkpointing.install(torch_xla=False)  # checkpoints recompute under the region's policy
