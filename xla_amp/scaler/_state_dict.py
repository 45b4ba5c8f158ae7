"""GradScaler checkpointing: ``torch.amp.GradScaler``'s state-dict format
(plus ``min_scale`` and ``_skipped_steps``) and pickling."""
from __future__ import annotations

from typing import Any

from xla_amp.scaler._checks import STATE_KEYS as _STATE_KEYS, checked as _checked


class ScalerStateDict:
    """Mixin of GradScaler: state_dict / load_state_dict / pickling."""

    def state_dict(self) -> dict[str, Any]:
        """``torch.amp.GradScaler``'s format: ``scale``, ``growth_factor``,
        ``backoff_factor``, ``growth_interval``, ``_growth_tracker`` (empty
        when disabled). Call it after :meth:`update`; it reads the scale
        back to the host."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "min_scale": self._min_scale,
            "_skipped_steps": self.skipped_steps(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.amp.GradScaler``
        (which has no ``min_scale``/``_skipped_steps``: None and 0); a no-op
        when disabled. Call it between iterations. Every field is checked
        before any is set: a bad one raises ``ValueError`` naming it and the
        scaler is unchanged."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise ValueError(
                f"GradScaler.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler.")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor",
                               "growth_interval", "_growth_tracker") if k not in state_dict]
        if missing:
            raise ValueError(f"GradScaler.load_state_dict: missing keys {missing}")
        unknown = sorted(set(state_dict) - set(_STATE_KEYS))
        if unknown:
            raise ValueError(f"GradScaler.load_state_dict: unknown keys {unknown}")
        v = _checked({"init_scale": state_dict["scale"],
                      "growth_factor": state_dict["growth_factor"],
                      "backoff_factor": state_dict["backoff_factor"],
                      "growth_interval": state_dict["growth_interval"],
                      "min_scale": state_dict.get("min_scale"),
                      "_growth_tracker": state_dict["_growth_tracker"],
                      "_skipped_steps": state_dict.get("_skipped_steps", 0)},
                     "GradScaler.load_state_dict", {"init_scale": "scale"})
        self._init_scale = v["init_scale"]
        self._growth_factor = v["growth_factor"]
        self._backoff_factor = v["backoff_factor"]
        self._growth_interval = v["growth_interval"]
        self._min_scale = v["min_scale"]
        self._init_growth_tracker = v["_growth_tracker"]
        self._init_skipped = v["_skipped_steps"]
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
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_init_skipped"] = self.skipped_steps()
            state["_scale"] = None
            state["_growth_tracker"] = None
            state["_skipped"] = None
            state["_per_optimizer"] = None
            state["_overflow"] = {}
        return state

    def __setstate__(self, state):
        state.setdefault("_min_scale", None)  # pickled before these existed
        state.setdefault("_init_skipped", 0)
        state.setdefault("_skipped", None)
        state.setdefault("_overflow", {})
        self.__dict__.update(state)
        self._per_optimizer = self._fresh_iteration()
