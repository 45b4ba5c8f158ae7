"""The GradScaler's two ops for a PrivateUse1 device that lacks them
(TorchTPU 0.2.0 does): ``torch.amp.GradScaler(<device>)`` calls them.

    _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        found_inf = 1 where any gradient has an inf/NaN; grads *= inv_scale
    _amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval)
        xla_amp.GradScaler's rule (xla_amp/scaler/_update.py)

Both are tensor ops only: no value leaves the device. Registered under the
PrivateUse1 key only where the device has no kernel of its own (a device's
own kernels are kept: ``registered()`` says which were added).
"""
from __future__ import annotations

import torch

from xla_amp.scaler._unscale import unscale_list
from xla_amp.scaler._update import next_scale

_lib: list = []
_added: list[str] = []

OPS = ("aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_")


def _check_and_unscale(grads, found_inf, inv_scale):
    with torch.no_grad():
        by_dtype: dict = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for gs in by_dtype.values():
            bad = unscale_list(gs, inv_scale).any().to(found_inf.dtype)
            found_inf.copy_(torch.maximum(found_inf, bad))


def _update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                  growth_interval):
    with torch.no_grad():
        new_scale, new_tracker = next_scale(scale, growth_tracker, found_inf != 0,
                                            growth_factor, backoff_factor, growth_interval)
        scale.copy_(new_scale)
        growth_tracker.copy_(new_tracker)
    return scale


def register() -> list[str]:
    """Add the kernels the device lacks (once); returns the ops added."""
    if _lib:
        return list(_added)
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in zip(OPS, (_check_and_unscale, _update_scale)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            lib.impl(name.split("::")[1], fn, "PrivateUse1")
            _added.append(name)
    _lib.append(lib)
    return list(_added)


def registered() -> list[str]:
    return list(_added)
