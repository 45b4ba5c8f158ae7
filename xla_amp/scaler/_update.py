"""GradScaler's update rule, on the device (see _grad_scaler.py's algorithm)::

    found ? (scale = max(scale * backoff, min(min_scale, scale)), tracker = 0)
          : (tracker += 1; tracker == interval ? (scale *= growth if finite, tracker = 0))
    skipped += found          (GradScaler.update, LossScaler.update)

Written with plain tensor ops whose factors are traced as graph inputs, not
with ``torch._amp_update_scale_``: PyTorch/XLA lowers that op to a node that
keeps growth_factor, backoff_factor and growth_interval as constants outside
the graph's hash (a scaler with other values reused the first one's).
(``min(min_scale, scale)``: a scale already below the floor, only ever set
by ``update(new_scale=<tensor>)``, stays where it is rather than jumping up.)
"""
from __future__ import annotations

import torch


def next_scale(scale, tracker, found, growth_factor, backoff_factor, growth_interval,
               min_scale=None):
    """(new scale, new growth tracker) from this iteration's `found` (a device
    bool): the rule above, in tensor ops only (also the PrivateUse1 engine's
    ``_amp_update_scale_``, xla_amp/privateuse1/_amp_ops.py)."""
    # Products in float64 then rounded, as torch._amp_update_scale_ computes them.
    wide = scale.double()
    backed_off = wide * backoff_factor
    if min_scale is not None:
        backed_off = torch.maximum(backed_off, wide.clamp(max=min_scale))
    grown = (wide * growth_factor).float()
    successful = tracker + 1
    grow = successful == growth_interval  # torch's test: == (a tracker
    # already past a lowered interval waits for the next overflow)
    grown = torch.where(torch.isfinite(grown), grown, scale)
    new_scale = torch.where(found, backed_off.float(), torch.where(grow, grown, scale))
    new_tracker = torch.where(found | grow, torch.zeros_like(successful), successful)
    return new_scale, new_tracker
