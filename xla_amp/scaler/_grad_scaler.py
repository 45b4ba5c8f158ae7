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
    update()          found = sum(found_inf[*]) != 0; scale, tracker, skipped
                      by _update.next_scale's rule, in tensor ops on the device

The class owns its state; _update.py (the rule), _state_dict.py (the
format), _unscale.py, _step.py, _masked_step.py and _checks.py are
functions it calls.

Each optimizer goes through a state machine per iteration::

    READY --unscale_--> UNSCALED --step--> STEPPED --update--> READY
      \\----------------------step------------^
"""
from __future__ import annotations

import enum
from collections import defaultdict
from typing import Any, Optional, Union

import torch

from xla_amp._param_walk import check_on_xla as _check_on_xla, check_optimizer as _check_optimizer
from xla_amp._upload import upload
from xla_amp.scaler import _checks, _state_dict, _step, _update, _unscale
from xla_amp.scaler._checks import checked as _checked

__all__ = ["GradScaler", "OptState"]


class OptState(enum.Enum):
    READY = 0      # nothing done this iteration
    UNSCALED = 1   # grads unscaled and checked; found_inf recorded
    STEPPED = 2    # optimizer stepped (or skipped); waits for update()


class _PerOptimizer:
    __slots__ = ("stage", "found_inf_per_device")

    def __init__(self):
        self.stage, self.found_inf_per_device = OptState.READY, {}


class GradScaler:
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
        self._init_scale, self._min_scale = values["init_scale"], values["min_scale"]
        self._growth_factor, self._backoff_factor = (values["growth_factor"],
                                                     values["backoff_factor"])
        self._growth_interval = values["growth_interval"]
        self._init_growth_tracker = self._init_skipped = 0
        # device tensors, created on the loss's device by the first scale() call
        self._scale: Optional[torch.Tensor] = None
        self._growth_tracker: Optional[torch.Tensor] = None
        self._skipped: Optional[torch.Tensor] = None
        self._per_optimizer: dict[int, _PerOptimizer] = self._fresh_iteration()
        self._overflow: dict[int, _unscale.OverflowFlags] = {}  # id(optimizer) ->

    # -- the iteration ------------------------------------------------------

    def scale(self, outputs):
        """A loss (or a tensor / nested list / tuple of them) times the scale
        factor; call it on the loss before ``backward()``. As is when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            _checks.on_engine_device(outputs.device, "scale(): the output")
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

        Optional, between ``backward()`` and :meth:`step`, for the true
        gradients (``clip_grad_norm_``); at most once per optimizer per
        iteration (:meth:`step` calls it otherwise). Refuses what step refuses."""
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
        grads = _unscale.collect(optimizer, _checks.on_engine_device)  # validates before touching anything
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

        Once per optimizer per iteration, after ``backward()`` and before
        :meth:`update`; extra arguments go to ``optimizer.step``. No closures
        (``None`` in the closure's place, as Accelerate passes, is none). A
        parameter not on the XLA device (an optimizer built before its model
        moved) is refused with a ``ValueError`` naming it, before anything
        changes."""
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
            new_scale = _checks.new_scale(new_scale, self._min_scale)
            if isinstance(new_scale, float):
                self._scale.fill_(new_scale)
            else:
                self._scale.copy_(new_scale.reshape(()).to(self._scale))
        else:
            found = [f for st in self._per_optimizer.values()
                     for f in st.found_inf_per_device.values()]
            if not found:
                raise RuntimeError(
                    "update(): no inf checks were recorded prior to update(); call "
                    "step() (or unscale_()) for at least one optimizer first.")
            self._advance(_sum(found, self._scale.device) != 0)
        self._per_optimizer = self._fresh_iteration()

    def _advance(self, found: torch.Tensor) -> None:
        """The scale, growth tracker and skip count after an iteration whose
        overflow is `found` (a device bool): _update.next_scale's rule. New
        tensors, not in-place writes: made at every step, they keep one place
        in the order of the step's outputs, so the first step's graph is
        every step's."""
        with torch.no_grad():
            self._scale, self._growth_tracker = _update.next_scale(
                self._scale, self._growth_tracker, found, self._growth_factor,
                self._backoff_factor, self._growth_interval, self._min_scale)
            self._skipped = self._skipped + found.to(self._skipped.dtype)

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

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    # the setters take effect at the next update() (no recompilation)
    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = _checked({"growth_factor": new_factor},
                                       "set_growth_factor")["growth_factor"]

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = _checked({"backoff_factor": new_factor},
                                        "set_backoff_factor")["backoff_factor"]

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = _checked({"growth_interval": new_interval},
                                         "set_growth_interval")["growth_interval"]

    def get_min_scale(self) -> Optional[float]:
        return self._min_scale

    def overflow_report(self, optimizer, last_skipped: bool = False) -> list[str]:
        """Names of `optimizer`'s parameters whose gradients were inf/NaN in the
        last step (``last_skipped=True``: in the latest step that had any),
        from per-gradient flags kept on the device; names from param groups
        built with ``named_parameters()``, else "group g, index i". Call it
        after :meth:`step`; reading it is the one transfer. [] before the
        first step and when disabled; TypeError for a non-optimizer."""
        _check_optimizer(optimizer, "GradScaler.overflow_report")
        record = self._overflow.get(id(optimizer)) if self._enabled else None
        if record is None:
            return []
        return _unscale.names(optimizer, record.last_skipped if last_skipped else record.last)

    def skipped_steps_tensor(self) -> Optional[torch.Tensor]:
        """The device counter :meth:`skipped_steps` reads (int64; None before the
        first :meth:`scale` or when disabled), to fold into another read; a
        new tensor after each :meth:`update`."""
        return self._skipped if self._enabled else None

    def skipped_steps(self) -> int:
        """Steps skipped (inf/NaN gradients) since construction, counted on
        the device inside the step's graph; calling this reads it (one
        device-to-host transfer): keep it out of the training step."""
        return self._read(self._skipped, self._init_skipped)

    def _get_growth_tracker(self) -> int:
        return self._read(self._growth_tracker, self._init_growth_tracker)

    def _read(self, value: Optional[torch.Tensor], initial: int) -> int:
        """A device counter read back (a transfer); `initial` before the first
        scale(); 0 when disabled."""
        return 0 if not self._enabled else initial if value is None else int(value.item())

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
        if not st.found_inf_per_device:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        return _sum(list(st.found_inf_per_device.values()))

    # -- checkpointing and pickling ---------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``torch.amp.GradScaler``'s format plus ``min_scale`` and
        ``_skipped_steps`` (xla_amp/scaler/_state_dict.py; empty when
        disabled). Call it after :meth:`update`; it reads the scale back."""
        if not self._enabled:
            return {}
        return _state_dict.write(self.get_scale(), self._growth_factor, self._backoff_factor,
                                 self._growth_interval, self._get_growth_tracker(),
                                 self._min_scale, self.skipped_steps())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this class, of ``torch.amp.GradScaler`` or of
        ``xla_amp.torchax.LossScaler``; a no-op when disabled. Call it between
        iterations. Every field is checked before any is set: a bad one
        raises ``ValueError`` naming it and the scaler is unchanged."""
        if not self._enabled:
            return
        v = _state_dict.read(state_dict, "GradScaler.load_state_dict")
        self._init_scale, self._min_scale = v["init_scale"], v["min_scale"]
        self._growth_factor, self._backoff_factor = v["growth_factor"], v["backoff_factor"]
        self._growth_interval = v["growth_interval"]
        self._init_growth_tracker, self._init_skipped = v["_growth_tracker"], v["_skipped_steps"]
        if self._scale is not None:  # fresh uploads: an in-place fill would put
            # the fill into the next step's graph and compile it anew
            self._lazy_init(self._scale.device)

    def __getstate__(self):
        state = self.__dict__.copy()
        if self._enabled:
            if self._per_optimizer:
                raise RuntimeError(
                    "A GradScaler instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update().")
            # device tensors do not pickle; keep the values
            state.update(_init_scale=self.get_scale(), _init_skipped=self.skipped_steps(),
                         _init_growth_tracker=self._get_growth_tracker(), _scale=None,
                         _growth_tracker=None, _skipped=None, _per_optimizer=None, _overflow={})
        return state

    def __setstate__(self, state):
        for name, value in (("_min_scale", None), ("_init_skipped", 0), ("_skipped", None),
                            ("_overflow", {})):  # pickled before these existed
            state.setdefault(name, value)
        self.__dict__.update(state)
        self._per_optimizer = self._fresh_iteration()


def _sum(flags: list[torch.Tensor], device: Optional[torch.device] = None) -> torch.Tensor:
    """The sum of per-device overflow flags, on `device` (the first flag's)."""
    total = flags[0] if device is None else flags[0].to(device)
    for f in flags[1:]:
        total = total + f.to(device)
    return total
