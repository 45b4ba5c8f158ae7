"""Precision per module, per weight and per autograd Function:
`module_policies` (parts of a model under their own policy, inside any
autocast region), `cast_module` (bf16 weights in place) and `custom_fwd` /
`custom_bwd` (a Function's backward under its forward region's policy);
activation checkpointing (torch.utils.checkpoint, torch_xla.utils.checkpoint)
recomputes under the region's policy too (`_checkpointing.py`, with
`_replay.py`, and `_xla_device_module.py`, the ``torch.xla`` torch_xla lacks).
Their training partner, the master-weight and stochastic-rounding
optimizers, lives in ``xla_amp.syncfree``."""
from xla_amp.precision._cast_module import cast_module
from xla_amp.precision._custom_function import custom_bwd, custom_fwd
from xla_amp.precision._module_policies import ModulePolicyHandle, module_policies

__all__ = ["module_policies", "ModulePolicyHandle", "cast_module", "custom_fwd", "custom_bwd"]
