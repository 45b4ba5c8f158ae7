"""`GradScaler`: ``torch.amp.GradScaler`` for XLA devices, without syncs.

    scaler = GradScaler()
    scaler.scale(loss).backward()
    scaler.step(optimizer)          # no device-to-host transfer
    scaler.update()

Algorithm (one iteration; scale and growth_tracker are device tensors)::

    scale(loss)       -> loss * scale
    unscale_(opt)     flag[g] = !isfinite(g) per gradient (kept: overflow_report)
                      found_inf[opt] = any(flag); g *= 1/scale
    step(opt)         unscale_(opt) unless done;
                      syncfree opt: opt.step(found_inf=found_inf[opt])
                      fused torch.optim opt off XLA (a PrivateUse1 device):
                                    opt.found_inf = found_inf[opt]; opt.step()
                      other opt:    masked step (below)
    update()          found = sum(found_inf[*]) != 0;  skipped += found
                      found ? (scale = max(scale * backoff, min(min_scale, scale)), tracker = 0)
                            : (tracker += 1; tracker == interval ?   (==, as torch)
                                 (scale *= growth if finite, tracker = 0))

``update`` is plain tensor ops with the factors as graph inputs
(xla_amp/scaler/_update.py says why not ``torch._amp_update_scale_``).

Any other optimizer takes a masked step (xla_amp/scaler/_masked_step.py): it runs, and
its effects are undone on the device when found_inf is set.

Each optimizer goes through a state machine per iteration::

    READY --unscale_--> UNSCALED --step--> STEPPED --update--> READY
      \\----------------------step------------^
"""
from __future__ import annotations

import enum
from collections import defaultdict
from typing import Any, Optional, Union

import torch

from xla_amp import _devices
from xla_amp._param_walk import check_on_xla as _check_on_xla, check_optimizer as _check_optimizer
from xla_amp._upload import upload
from xla_amp.scaler import _step, _update, _unscale
from xla_amp.scaler._state_dict import ScalerStateDict
from xla_amp.scaler._checks import checked as _checked

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    READY = 0      # nothing done this iteration
    UNSCALED = 1   # grads unscaled and checked; found_inf recorded
    STEPPED = 2    # optimizer stepped (or skipped); waits for update()


class _PerOptimizer:
    __slots__ = ("stage", "found_inf_per_device")

    def __init__(self):
        self.stage = OptState.READY
        self.found_inf_per_device: dict[torch.device, torch.Tensor] = {}


class GradScaler(ScalerStateDict):
    """Dynamic loss scaling with ``torch.amp.GradScaler``'s schedule and
    state-dict format, for parameters on an XLA device.

    Args:
        init_scale: initial scale factor.
        growth_factor: factor (> 1) applied after ``growth_interval``
            consecutive steps without inf/NaN gradients.
        backoff_factor: factor (< 1) applied on a step with inf/NaN gradients.
        growth_interval: number of clean steps between growths.
        enabled: ``False`` makes every method a pass-through.
        min_scale: a floor for the scale: a backoff never takes it below
            this (None: no floor; DeepSpeed's ``min_loss_scale``).

    Every argument is checked before anything is set; a bad one raises
    ``ValueError`` naming it.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True, min_scale: Optional[float] = None):
        if not isinstance(enabled, bool):
            raise ValueError(f"GradScaler: enabled must be a bool, got {enabled!r}")
        self._enabled = enabled
        values = _checked({"init_scale": init_scale, "growth_factor": growth_factor,
                           "backoff_factor": backoff_factor,
                           "growth_interval": growth_interval, "min_scale": min_scale},
                          "GradScaler")
        self._init_scale = values["init_scale"]
        self._growth_factor = values["growth_factor"]
        self._backoff_factor = values["backoff_factor"]
        self._growth_interval = values["growth_interval"]
        self._min_scale = values["min_scale"]
        self._init_growth_tracker = 0
        self._init_skipped = 0
        # Created on the loss's device by the first scale() call.
        self._scale: Optional[torch.Tensor] = None
        self._growth_tracker: Optional[torch.Tensor] = None
        self._skipped: Optional[torch.Tensor] = None
        self._per_optimizer: dict[int, _PerOptimizer] = self._fresh_iteration()
        self._overflow: dict[int, _unscale.OverflowFlags] = {}  # id(optimizer) ->

    # -- the iteration ------------------------------------------------------

    def scale(self, outputs):
        """Multiply a loss (or a tensor / nested list / tuple of them) by the
        scale factor; call it on the loss before ``backward()``.

        Returns ``outputs`` unchanged when disabled.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._check_xla(outputs.device, "scale(): the output")
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device)

        def apply(val):
            if isinstance(val, torch.Tensor):
                return self.scale(val)
            if isinstance(val, list):
                return [apply(v) for v in val]
            if isinstance(val, tuple):
                out = [apply(v) for v in val]
                return type(val)(*out) if hasattr(val, "_fields") else type(val)(out)
            raise ValueError(
                f"GradScaler.scale: outputs must be a tensor or a list/tuple of tensors, "
                f"got {type(val).__name__}")
        return apply(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale and record whether
        any is inf/NaN (on the device).

        Optional: call it between ``backward()`` and :meth:`step` when you
        need the true gradients (e.g. ``clip_grad_norm_``). At most once per
        optimizer per iteration; :meth:`step` calls it otherwise. A parameter
        of ``optimizer`` not on the XLA device is refused (``ValueError``
        naming it) before anything changes, as in :meth:`step`.
        """
        if not self._enabled:
            return
        _check_on_xla(optimizer, "GradScaler.unscale_")
        self._unscale(optimizer)

    def _unscale(self, optimizer) -> None:
        """``unscale_`` once the parameters are known to be on the device."""
        self._check_started("unscale_()")
        st = self._per_optimizer.get(id(optimizer)) or _PerOptimizer()
        if st.stage is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if st.stage is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = _unscale.collect(optimizer, self._check_xla)  # validates before touching anything
        # Reciprocal in double: exact for the power-of-two scales of the schedule
        # and the same rounding as torch.amp.GradScaler otherwise.
        inv_scale = self._scale.double().reciprocal().float()
        found, flags = _unscale.unscale(grads, inv_scale)
        record = self._overflow.setdefault(id(optimizer), _unscale.OverflowFlags([], []))
        record.after_step(flags, found)
        st.found_inf_per_device = found
        st.stage = OptState.UNSCALED
        self._per_optimizer[id(optimizer)] = st  # recorded only once it succeeded

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any):
        """Unscale (unless :meth:`unscale_` was called) and update the
        parameters, skipping the update when a gradient is inf/NaN.

        Call once per optimizer per iteration, after ``backward()`` and
        before :meth:`update`. Extra arguments go to ``optimizer.step``.
        Sync-free for ``xla_amp.syncfree`` optimizers; see the module
        docstring for others. Closures are not supported (``None`` in the
        closure's place, as Accelerate passes, is no closure). An optimizer
        holding a parameter that is not on the XLA device (one built before
        its model moved) is refused with a ``ValueError`` naming the first
        such parameter, before the scale, the state or any parameter changes.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if args[:1] == (None,):
            args = args[1:]
        if kwargs.get("closure", None) is not None or args:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        kwargs.pop("closure", None)
        if "found_inf" in kwargs:
            raise RuntimeError("GradScaler.step: found_inf is supplied by the scaler; do not pass it")
        _check_on_xla(optimizer, "GradScaler.step")
        self._check_started("step()")
        st = self._per_optimizer[id(optimizer)]
        if st.stage is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if st.stage is OptState.READY:
            self._unscale(optimizer)
        found_inf = self._combined_found_inf(st)
        retval = _step.step(optimizer, found_inf, kwargs)
        st.stage = OptState.STEPPED
        return retval

    def update(self, new_scale: Union[float, torch.Tensor, None] = None) -> None:
        """Update the scale factor from this iteration's inf/NaN checks (on
        the device); call once per iteration after every :meth:`step`.

        ``new_scale`` (a float or a 1-element device tensor) sets the scale
        directly instead; a float is checked as ``init_scale`` is (finite,
        > 0, not below ``min_scale``), a tensor is taken as it is.
        """
        if not self._enabled:
            return
        self._check_started("update()")
        if new_scale is not None:
            if isinstance(new_scale, (int, float)) and not isinstance(new_scale, bool):
                new_scale = _checked({"init_scale": new_scale, "min_scale": self._min_scale},
                                     "GradScaler.update", {"init_scale": "new_scale"})
                self._scale.fill_(new_scale["init_scale"])
            elif (isinstance(new_scale, torch.Tensor) and new_scale.numel() == 1
                  and not new_scale.requires_grad):
                self._scale.copy_(new_scale.reshape(()).to(self._scale))
            else:
                raise ValueError(
                    "GradScaler.update: new_scale must be a float or a 1-element tensor "
                    f"with requires_grad=False, got {new_scale!r}")
        else:
            found = [f.to(self._scale.device)
                     for st in self._per_optimizer.values()
                     for f in st.found_inf_per_device.values()]
            if not found:
                raise RuntimeError(
                    "update(): no inf checks were recorded prior to update(); call "
                    "step() (or unscale_()) for at least one optimizer first.")
            total = found[0]
            for f in found[1:]:
                total = total + f
            _update.update_on_device(self, total != 0)
        self._per_optimizer = self._fresh_iteration()

    # -- queries and settings ---------------------------------------------

    def get_scale(self) -> float:
        """The current scale as a Python float (a device-to-host read: keep
        it out of the training step). 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_scale_tensor(self) -> Optional[torch.Tensor]:
        """The scale as the 0-dim device tensor itself (no transfer): for
        logging it with other device values in one read. None before the
        first :meth:`scale` call or when disabled. Do not modify it."""
        if not self._enabled:
            return None
        return self._scale

    def is_enabled(self) -> bool:
        """Whether this scaler is enabled."""
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Takes effect at the next :meth:`update` (no recompilation)."""
        self._growth_factor = _checked({"growth_factor": new_factor}, "set_growth_factor")[
            "growth_factor"]

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Takes effect at the next :meth:`update` (no recompilation)."""
        self._backoff_factor = _checked({"backoff_factor": new_factor}, "set_backoff_factor")[
            "backoff_factor"]

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Takes effect at the next :meth:`update` (no recompilation)."""
        self._growth_interval = _checked({"growth_interval": new_interval},
                                         "set_growth_interval")["growth_interval"]

    def get_min_scale(self) -> Optional[float]:
        return self._min_scale

    def overflow_report(self, optimizer, last_skipped: bool = False) -> list[str]:
        """Names of `optimizer`'s parameters whose gradients were inf/NaN in the
        last step (``last_skipped=True``: in the latest step that had any,
        however long ago), from per-gradient flags kept on the device; names
        come from param groups built with ``named_parameters()``, else
        "group g, index i". Call it after :meth:`step`; reading it is the
        one transfer. [] before the first step and when disabled; a
        `TypeError` when `optimizer` is not an optimizer."""
        _check_optimizer(optimizer, "GradScaler.overflow_report")
        if not self._enabled:
            return []
        record = self._overflow.get(id(optimizer))
        if record is None:
            return []
        return _unscale.names(optimizer, record.last_skipped if last_skipped else record.last)

    def skipped_steps_tensor(self) -> Optional[torch.Tensor]:
        """The device counter :meth:`skipped_steps` reads (int64; None before the
        first :meth:`scale` or when disabled), to fold into another read.
        :meth:`update` replaces it with a new tensor: take it again after
        each update."""
        return self._skipped if self._enabled else None

    def skipped_steps(self) -> int:
        """Steps skipped (inf/NaN gradients) since construction, counted on
        the device inside the step's graph; calling this reads it (one
        device-to-host transfer): keep it out of the training step."""
        if not self._enabled:
            return 0
        if self._skipped is None:
            return self._init_skipped
        return int(self._skipped.item())

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        if self._growth_tracker is None:
            return self._init_growth_tracker
        return int(self._growth_tracker.item())

    # -- helpers ----------------------------------------------------------

    @staticmethod
    def _fresh_iteration() -> dict:
        """Per-optimizer stages of a new iteration (all READY)."""
        return defaultdict(_PerOptimizer)

    def _lazy_init(self, device: torch.device) -> None:
        # uploaded, each a buffer of its own (xla_amp/_upload.py): the first
        # step then builds the same graph as every later one (one compilation)
        self._scale = upload(torch.tensor(self._init_scale, dtype=torch.float32), device)
        self._growth_tracker = upload(
            torch.tensor(self._init_growth_tracker, dtype=torch.int32), device)
        self._skipped = upload(torch.tensor(self._init_skipped, dtype=torch.int64), device)

    def _check_started(self, what: str) -> None:
        if self._scale is None:
            raise RuntimeError(
                f"GradScaler.{what} called before scale(): the scale lives on the loss's "
                "device and is created by scaler.scale(loss) earlier in the iteration.")

    @staticmethod
    def _check_xla(device: torch.device, what: str) -> None:
        if device.type != "xla" and not _devices.is_engine_type(device.type):
            raise ValueError(
                f"GradScaler: {what} is on '{device}', not on an XLA device; use "
                "torch.amp.GradScaler for other devices")

    def found_inf_flags(self, optimizer) -> list[torch.Tensor]:
        """This iteration's per-device skip flags (device tensors) for
        `optimizer` once :meth:`unscale_` ran, else []. For data-parallel
        code: reduce them across replicas in place (MAX) between unscale_()
        and step() so that every replica skips alike, as
        ``xla_amp.optimizer_step`` does."""
        if not self._enabled:
            return []
        st = self._per_optimizer.get(id(optimizer))
        if st is None or st.stage is not OptState.UNSCALED:
            return []
        return list(st.found_inf_per_device.values())

    def _combined_found_inf(self, st: _PerOptimizer) -> torch.Tensor:
        found = list(st.found_inf_per_device.values())
        if not found:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        total = found[0]
        for f in found[1:]:
            total = total + f.to(total.device)
        return total
