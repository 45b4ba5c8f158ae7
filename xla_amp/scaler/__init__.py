"""Gradient scaling without host syncs: `GradScaler`.

    _grad_scaler.py  the class: torch.amp.GradScaler's methods and
                     per-optimizer state machine
    _unscale.py      the unscale pass: per-gradient inf/NaN flags
    _masked_step.py  a step of any other optimizer, undone on the device
    _update.py       the scale's update rule, on the device
    _checks.py       the settings' invariants, one place for every entry point
    _state_dict.py   the state-dict format, written and read (GradScaler, LossScaler)
"""
from xla_amp.scaler._grad_scaler import GradScaler, OptState

__all__ = ["GradScaler", "OptState"]
