"""One sequence of clean and overflowing steps, fed to every engine's loss
scaler (tests/torchax/test_scaler_rule_everywhere.py): GradScaler on
torch_xla and on the stand-in PrivateUse1 device, LossScaler on torchax.
After each step: (scale, growth tracker, skipped steps), from the state dict.

    CONFIGS        plain, a floor (min_scale), growth past float32's range
    FOUND          which steps overflow
    grad_scaler(make, GradScaler, optim)  -> [(scale, tracker, skipped)] per step
    loss_scaler(LossScaler, make)         -> the same, through LossScaler
"""
from __future__ import annotations

import torch

FOUND = [False, False, True, False, False, False, True, True, False, False, False, True, False]
CONFIGS = {
    "plain": dict(init_scale=16.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2),
    "min_scale": dict(init_scale=8.0, growth_factor=2.0, backoff_factor=0.25, growth_interval=3,
                      min_scale=2.0),
    "past_float32": dict(init_scale=2.0 ** 126, growth_factor=4.0, backoff_factor=0.5,
                         growth_interval=1),
}


def _grad(found: bool) -> torch.Tensor:
    return torch.full((4,), float("inf") if found else 0.5)


def _row(sd: dict) -> list:
    return [float(sd["scale"]), int(sd["_growth_tracker"]), int(sd["_skipped_steps"])]


def grad_scaler(make, GradScaler, config: dict) -> list:
    """`make(t)`: `t` on the engine's device."""
    param = make(torch.zeros(4)).requires_grad_()
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = GradScaler(**config)
    rows = []
    for found in FOUND:
        opt.zero_grad()
        scaler.scale(make(torch.ones(())))  # the loss the gradients came from (set below)
        param.grad = make(_grad(found))
        scaler.unscale_(opt)  # the inf check; no update of the parameter (the 2.9
        scaler.update()       # stand-in has no device guard for in-place steps)
        rows.append(_row(scaler.state_dict()))
    return rows


def loss_scaler(LossScaler, make, config: dict) -> list:
    scaler = LossScaler(**config)
    state = scaler.init()
    rows = []
    for found in FOUND:
        _, found_inf = scaler.unscale({"w": make(_grad(found))}, state)
        state = scaler.update(state, found_inf)
        rows.append(_row(scaler.state_dict(state)))
    return rows
