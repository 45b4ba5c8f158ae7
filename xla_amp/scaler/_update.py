"""GradScaler's update rule, on the device (see _grad_scaler.py's algorithm)::

    found ? (scale = max(scale * backoff, min(min_scale, scale)), tracker = 0)
          : (tracker += 1; tracker == interval ? (scale *= growth if finite, tracker = 0))
    skipped += found

Written with plain tensor ops whose factors are traced as graph inputs, not
with ``torch._amp_update_scale_``: PyTorch/XLA lowers that op to a node that
keeps growth_factor, backoff_factor and growth_interval as constants outside
the graph's hash (a scaler with other values reused the first one's).
(``min(min_scale, scale)``: a scale already below the floor, only ever set
by ``update(new_scale=<tensor>)``, stays where it is rather than jumping up.)
"""
from __future__ import annotations

import torch


def update_on_device(scaler, found: torch.Tensor) -> None:
    """Update `scaler`'s device scale, growth tracker and skip count from
    this iteration's `found` (a device bool)."""
    # Products in float64 then rounded, as torch._amp_update_scale_ computes them.
    with torch.no_grad():
        scale = scaler._scale.double()
        backed_off = scale * scaler._backoff_factor
        if scaler._min_scale is not None:
            backed_off = torch.maximum(backed_off, scale.clamp(max=scaler._min_scale))
        grown = (scale * scaler._growth_factor).float()
        successful = scaler._growth_tracker + 1
        grow = successful == scaler._growth_interval  # torch's test: == (a tracker
        # already past a lowered interval waits for the next overflow)
        grown = torch.where(torch.isfinite(grown), grown, scaler._scale)
        new_scale = torch.where(found, backed_off.float(),
                                torch.where(grow, grown, scaler._scale))
        new_tracker = torch.where(found | grow, torch.zeros_like(successful), successful)
        scaler._scale.copy_(new_scale)
        scaler._growth_tracker.copy_(new_tracker)
        scaler._skipped.add_(found.to(scaler._skipped.dtype))
