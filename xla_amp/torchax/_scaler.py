"""`LossScaler`: dynamic loss scaling for jitted torchax steps, in tensors only.

The torch_xla GradScaler's algorithm (torch.amp.GradScaler's), as pure
functions of a state that lives in the step's arguments: no ``_foreach_*``
(torchax has no lowering for them), no ``_amp_*`` ops, no float64, no
``.item()``; everything it decides is decided on device::

    init()                 state = {scale: init_scale (float32),
                                    growth_tracker: 0 (int32)}
    scale(loss, state)     loss (float32) * scale
    unscale(grads, state)  grads * (1 / scale);
                           found_inf = any gradient element non-finite
                           (one reduction over all of them; under a mesh
                           JAX's partitioner reduces it across devices)
    update(state, found_inf)
        found_inf:   scale *= backoff_factor, growth_tracker = 0
        otherwise:   growth_tracker += 1; when it reaches growth_interval:
                     scale *= growth_factor, growth_tracker = 0
    state_dict / load_state_dict: the GradScaler's keys and meaning

Call `scale` on the loss inside the function you differentiate, `unscale`
on its gradients, skip the optimizer update where ``found_inf`` (the step
builder does: parameters and optimizer state kept bit for bit), then
`update`. With ``enabled=False`` scale is 1 and nothing is ever skipped.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch.utils import _pytree as pytree

_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Configuration of a dynamic loss scaler; the state is separate
    (`init`), so a jitted step carries it as arguments."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self):
        for name in ("init_scale", "growth_factor", "backoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"LossScaler: {name} must be a finite number > 0, got {value!r}")
        if self.growth_factor <= 1.0:
            raise ValueError(f"LossScaler: growth_factor must be > 1, got {self.growth_factor}")
        if self.backoff_factor >= 1.0:
            raise ValueError(f"LossScaler: backoff_factor must be < 1, got {self.backoff_factor}")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int) \
                or self.growth_interval < 1:
            raise ValueError(f"LossScaler: growth_interval must be an int >= 1, got "
                             f"{self.growth_interval!r}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"LossScaler: enabled must be a bool, got {self.enabled!r}")

    def init(self, device="jax") -> dict[str, torch.Tensor]:
        """A fresh state: call once, before the first step (under the env)."""
        scale = self.init_scale if self.enabled else 1.0
        return {"scale": torch.full((), scale, dtype=torch.float32, device=device),
                "growth_tracker": torch.zeros((), dtype=torch.int32, device=device)}

    def scale(self, loss: torch.Tensor, state) -> torch.Tensor:
        """The loss to differentiate: call inside the differentiated function."""
        if not self.enabled:
            return loss
        return loss.float() * state["scale"]

    def unscale(self, grads, state):
        """(gradients / scale, found_inf): call on the gradients of `scale`'s
        output, before the optimizer update."""
        leaves = [g for g in pytree.tree_leaves(grads) if isinstance(g, torch.Tensor)]
        if not leaves:
            raise ValueError("LossScaler.unscale: no gradient tensors")
        if not self.enabled:  # nothing is checked, nothing skipped
            return grads, torch.zeros((), dtype=torch.bool, device=leaves[0].device)
        finite = torch.stack([torch.isfinite(g).all() for g in leaves]).all()
        found_inf = torch.logical_not(finite)
        inv = torch.reciprocal(state["scale"])
        return pytree.tree_map_only(torch.Tensor, lambda g: g * inv.to(g.dtype), grads), found_inf

    def update(self, state, found_inf: torch.Tensor):
        """The state for the next step: call once per step, after the update."""
        if not self.enabled:
            return state
        scale, tracker = state["scale"], state["growth_tracker"]
        grown = tracker + 1
        grow = grown >= self.growth_interval
        new_scale = torch.where(found_inf, scale * self.backoff_factor,
                                torch.where(grow, scale * self.growth_factor, scale))
        new_tracker = torch.where(found_inf | grow, torch.zeros_like(tracker), grown)
        return {"scale": new_scale, "growth_tracker": new_tracker}

    def state_dict(self, state) -> dict:
        """The torch_xla GradScaler's state_dict for `state` (reads two
        scalars from the device: call at checkpoint time, not in the step)."""
        if not self.enabled:
            return {}
        return {"scale": float(_host(state["scale"])), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": int(_host(state["growth_tracker"]))}

    def load_state_dict(self, state_dict, device="jax") -> dict[str, torch.Tensor]:
        """A state from a `state_dict` (ours or a torch_xla / torch GradScaler's);
        refuses a different configuration or bad values before building anything."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"LossScaler.load_state_dict: expected a dict, got "
                            f"{type(state_dict).__name__}")
        if not self.enabled:
            if state_dict:
                raise ValueError("LossScaler.load_state_dict: this scaler is disabled but the "
                                 "state holds a scale")
            return self.init(device)
        missing = [k for k in _KEYS if k not in state_dict]
        if missing:
            raise ValueError(f"LossScaler.load_state_dict: missing {', '.join(missing)}")
        for key in ("growth_factor", "backoff_factor", "growth_interval"):
            if state_dict[key] != getattr(self, key):
                raise ValueError(
                    f"LossScaler.load_state_dict: {key} is {state_dict[key]!r} in the state, "
                    f"{getattr(self, key)!r} here; build the LossScaler with the saved one")
        scale, tracker = state_dict["scale"], state_dict["_growth_tracker"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"LossScaler.load_state_dict: scale must be finite and > 0, "
                             f"got {scale!r}")
        if isinstance(tracker, bool) or not isinstance(tracker, int) \
                or not 0 <= tracker < self.growth_interval:
            raise ValueError(f"LossScaler.load_state_dict: _growth_tracker must be an int in "
                             f"[0, {self.growth_interval}), got {tracker!r}")
        return {"scale": torch.full((), float(scale), dtype=torch.float32, device=device),
                "growth_tracker": torch.full((), tracker, dtype=torch.int32, device=device)}


def _host(value):
    """A scalar's value on the host, inside the torchax environment or not."""
    if hasattr(value, "jax"):
        value = value.jax()
    if isinstance(value, torch.Tensor):
        return value.item()
    import numpy as np
    return np.asarray(value).item()
