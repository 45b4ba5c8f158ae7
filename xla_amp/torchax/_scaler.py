"""`LossScaler`: dynamic loss scaling for jitted torchax steps, in tensors only.

The GradScaler's rule (torch.amp.GradScaler's, with its floor and skip
count), as pure functions of a state that lives in the step's arguments: no
``_foreach_*`` (torchax has no lowering for them), no ``_amp_*`` ops, no
``.item()``; everything it decides is decided on device::

    init()                 state = {scale: init_scale (float32),
                                    growth_tracker: 0 (int32), skipped: 0 (int32)}
    scale(loss, state)     loss (float32) * scale
    unscale(grads, state)  grads * (1 / scale);
                           found_inf = any gradient element non-finite
                           (one reduction over all of them; under a mesh
                           JAX's partitioner reduces it across devices)
    update(state, found_inf)
        scale, growth_tracker = xla_amp.scaler._update.next_scale(...): the
            one rule GradScaler and the PrivateUse1 engine use (backoff, not
            below min_scale; growth every growth_interval clean steps, only
            while the grown scale is finite)
        skipped += found_inf
    state_dict / load_state_dict: the GradScaler's keys and meaning (a
        torch.amp.GradScaler's too, which has no min_scale / _skipped_steps)

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

from xla_amp.scaler import _checks, _state_dict, _update


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Configuration of a dynamic loss scaler; the state is separate
    (`init`), so a jitted step carries it as arguments."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True
    min_scale: float | None = None  # GradScaler's floor: backoff never goes below it

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
        if self.min_scale is not None:  # refused as GradScaler refuses it
            _checks.checked({"init_scale": self.init_scale, "min_scale": self.min_scale},
                            "LossScaler")

    def init(self, device="jax") -> dict[str, torch.Tensor]:
        """A fresh state: call once, before the first step (under the env)."""
        scale = self.init_scale if self.enabled else 1.0
        return _state(scale, 0, 0, device)

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
        scale, tracker = _update.next_scale(
            state["scale"], state["growth_tracker"], found_inf, self.growth_factor,
            self.backoff_factor, self.growth_interval, self.min_scale)
        return {"scale": scale, "growth_tracker": tracker,
                "skipped": state["skipped"] + found_inf.to(state["skipped"].dtype)}

    def skipped_steps(self, state) -> int:
        """Steps skipped since `init` (one read from the device), as
        GradScaler.skipped_steps()."""
        return int(_host(state["skipped"])) if self.enabled else 0

    def state_dict(self, state) -> dict:
        """The torch_xla GradScaler's state_dict for `state` (reads two
        scalars from the device: call at checkpoint time, not in the step)."""
        if not self.enabled:
            return {}
        return _state_dict.write(float(_host(state["scale"])), self.growth_factor,
                                 self.backoff_factor, self.growth_interval,
                                 int(_host(state["growth_tracker"])), self.min_scale,
                                 int(_host(state["skipped"])))

    def load_state_dict(self, state_dict, device="jax") -> dict[str, torch.Tensor]:
        """A state from a `state_dict` (ours or a torch_xla / torch GradScaler's),
        checked as GradScaler checks one (xla_amp/scaler/_state_dict.py); a
        configuration other than this scaler's is refused (the jitted step
        holds it) before anything is built."""
        if not self.enabled:
            if not isinstance(state_dict, dict) or state_dict:
                raise ValueError("LossScaler.load_state_dict: this scaler is disabled but the "
                                 "state holds a scale")
            return self.init(device)
        v = _state_dict.read(state_dict, "LossScaler.load_state_dict")
        for key in ("growth_factor", "backoff_factor", "growth_interval", "min_scale"):
            if key == "min_scale" and key not in state_dict:
                continue  # torch.amp.GradScaler's format: no floor recorded
            if v[key] != getattr(self, key):
                raise ValueError(
                    f"LossScaler.load_state_dict: {key} is {state_dict[key]!r} in the state, "
                    f"{getattr(self, key)!r} here; build the LossScaler with the saved one")
        return _state(v["init_scale"], v["_growth_tracker"], v["_skipped_steps"], device)


def _state(scale, tracker, skipped, device) -> dict[str, torch.Tensor]:
    return {"scale": torch.full((), scale, dtype=torch.float32, device=device),
            "growth_tracker": torch.full((), tracker, dtype=torch.int32, device=device),
            "skipped": torch.full((), skipped, dtype=torch.int32, device=device)}


def _host(value):
    """A scalar's value on the host, inside the torchax environment or not."""
    if hasattr(value, "jax"):
        value = value.jax()
    if isinstance(value, torch.Tensor):
        return value.item()
    import numpy as np
    return np.asarray(value).item()
