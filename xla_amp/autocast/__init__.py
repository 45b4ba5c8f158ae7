"""Autocast: the region users enter, and what serves it.

    _region.py           `autocast` (a torch.amp.autocast for XLA driven by a
                         policy) and `set_default_policy`
    _recording.py        record=True: module hooks that name the running module
    _report.py           `PrecisionReport`: the rows a recording region collected
    _dynamo.py           torch.compile: regions become policy push/pop nodes

custom_fwd / custom_bwd (xla_amp/precision/_custom_function.py, shared
with the PrivateUse1 engine) are re-exported here.

The native engine behind them is reached through ``xla_amp._engine`` only;
the op lists are data (``xla_amp.policies``).
"""
from xla_amp.precision._custom_function import custom_bwd, custom_fwd
from xla_amp.autocast._region import autocast, set_default_policy
from xla_amp.autocast._report import PrecisionReport, ReportDiff

__all__ = ["autocast", "set_default_policy", "custom_fwd", "custom_bwd", "PrecisionReport",
           "ReportDiff"]
