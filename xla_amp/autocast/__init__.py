"""Autocast: the region users enter, and what serves it.

    _region.py           `autocast` (a torch.amp.autocast for XLA driven by a
                         policy) and `set_default_policy`
    _dynamo.py           torch.compile: regions become policy push/pop nodes

custom_fwd / custom_bwd (xla_amp/precision/_custom_function.py, shared
with the PrivateUse1 engine) are re-exported here.

The report a recording region gives is xla_amp.numerics' PrecisionReport.
The native engine behind them is reached through ``xla_amp._engine`` only;
the op lists are data (``xla_amp.policies``).
"""
from xla_amp.precision._custom_function import custom_bwd, custom_fwd
from xla_amp.autocast._region import autocast, set_default_policy

__all__ = ["autocast", "set_default_policy", "custom_fwd", "custom_bwd"]
