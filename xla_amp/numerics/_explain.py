"""`explain`: one call of a module or function under a recording region,
traced only, and its `PrecisionReport` (the rows are described in
``xla_amp/numerics/_report.py``).

    xla_amp.explain(model, x, policy="cuda").diff(xla_amp.explain(model, x, policy="tpu"))
"""
from __future__ import annotations

import torch

from xla_amp import engines
from xla_amp.numerics._report import PrecisionReport
from xla_amp.numerics._inspect import buffers_kept


def xla_device_of(args, kwargs):
    """The device of the first XLA tensor among the arguments, else the default
    XLA device."""
    for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "xla":
            return leaf.device
    import torch_xla
    return torch_xla.device()


def explain(fn, *args, policy=None, **kwargs) -> PrecisionReport:
    """Runs ``fn(*args, **kwargs)`` (a module or a function) once under
    ``xla_amp.autocast(device, policy=policy, record=True)`` and returns its
    `PrecisionReport`; the device is the first XLA tensor argument's. Only
    traces (nothing executes, no transfer); a module's buffers are left as
    they were. Module names are relative to `fn` when it is a module."""
    region = engines.get("torch_xla").region(xla_device_of(args, kwargs), policy=policy,
                                             record=True)
    return record_call(region,
                       fn, *args, **kwargs)


def record_call(region, fn, *args, **kwargs) -> PrecisionReport:
    """``fn(*args, **kwargs)`` inside `region` (an ``autocast(...,
    record=True)``), a module's buffers left as they were; its report."""
    with buffers_kept(fn), region:
        fn(*args, **kwargs)
    return region.report()
