"""Which path `GradScaler.step` takes for an optimizer, once its gradients
are unscaled and ``found_inf`` (a float32 device tensor) is known; one
function picks it, as torch.optim picks a kernel::

    step(opt, found_inf, kwargs):
        opt.step takes found_inf          (xla_amp.syncfree, PyTorch/XLA's
                                           syncfree optimizers)   -> opt.step(found_inf=...)
        torch's fused optimizer off XLA   (fused=True on a PrivateUse1 device:
                                           its kernel skips on found_inf and
                                           takes back the step count)
                                          -> opt.found_inf = found_inf; opt.step()
        any other                         -> the masked step (_masked_step.py)

Every path skips on the device: no value is read back (the masked step's
documented exception: state kept on the host).
"""
from __future__ import annotations

import inspect

from xla_amp.scaler._masked_step import masked_step

_found_inf_kwarg: dict[type, bool] = {}


def _takes_found_inf(optimizer) -> bool:
    """xla_amp.syncfree optimizers, and others (PyTorch/XLA's syncfree ones)
    whose step() takes a found_inf argument, skip on the device themselves."""
    if getattr(optimizer, "_xla_amp_syncfree", False):
        return True
    cls = type(optimizer)
    if cls not in _found_inf_kwarg:
        try:
            params = inspect.signature(optimizer.step).parameters
        except (TypeError, ValueError):
            params = {}
        _found_inf_kwarg[cls] = "found_inf" in params
    return _found_inf_kwarg[cls]


def _fused_off_xla(optimizer, found_inf) -> bool:
    return (getattr(optimizer, "_step_supports_amp_scaling", False)
            and found_inf.device.type != "xla")


def step(optimizer, found_inf, kwargs: dict):
    """Step `optimizer` unless found_inf is set, on the device. While it
    steps, ``optimizer._xla_amp_found_inf`` is found_inf, whatever the path:
    the optimizer's step hooks (fp8.attach's history roll) read it there."""
    optimizer._xla_amp_found_inf = found_inf
    try:
        return _step(optimizer, found_inf, kwargs)
    finally:
        del optimizer._xla_amp_found_inf


def _step(optimizer, found_inf, kwargs: dict):
    if _takes_found_inf(optimizer):
        return optimizer.step(found_inf=found_inf, **kwargs)
    if _fused_off_xla(optimizer, found_inf):
        # grads are unscaled already: no grad_scale, only the skip flag
        optimizer.grad_scale, optimizer.found_inf = None, found_inf
        try:
            return optimizer.step(**kwargs)
        finally:
            del optimizer.grad_scale, optimizer.found_inf
    return masked_step(optimizer, found_inf, kwargs)
