"""Precision per module and per weight: `module_policies` (parts of a model
under their own policy, inside any autocast region) and `cast_module` (bf16
weights in place). Their training partner, the master-weight and
stochastic-rounding optimizers, lives in ``xla_amp.syncfree``."""
from xla_amp.precision._cast_module import cast_module
from xla_amp.precision._module_policies import ModulePolicyHandle, module_policies

__all__ = ["module_policies", "ModulePolicyHandle", "cast_module"]
