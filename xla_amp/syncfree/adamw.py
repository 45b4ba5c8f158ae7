"""Sync-free AdamW: ``torch.optim.AdamW``'s numerics (Adam with decoupled
weight decay, ``p <- p * (1 - lr * weight_decay)`` before the Adam update),
skip decided on the device. See ``xla_amp.syncfree.adam`` for the algorithm.
"""
from __future__ import annotations

from xla_amp.syncfree import _low_precision
from xla_amp.syncfree.adam import Adam


class AdamW(Adam):
    """AdamW with ``torch.optim.AdamW``'s arguments (default
    ``weight_decay=1e-2``)."""

    _decoupled_default = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, amsgrad=False, *, maximize=False, foreach=None,
                 capturable=False, differentiable=False, fused=None,
                 master_weights=False, stochastic_rounding=False, state_dtype=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True,
                         master_weights=master_weights,
                         stochastic_rounding=stochastic_rounding, state_dtype=state_dtype)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            # a state dict written by Adam must not turn weight decay into L2
            group["decoupled_weight_decay"] = True


AdamW.__doc__ += _low_precision.OPTIONS_DOC
