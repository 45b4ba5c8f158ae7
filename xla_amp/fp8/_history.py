"""Delayed scaling's history: rolled once per optimizer step.

    update_scales(model, found_inf=None, groups=None)   after the optimizer step
        replica mode: pending = MAX over the replicas of pending   (one collective)
        for each Fp8Linear with delayed scaling:
            history' = [pending, history[:, :-1]]      (newest first)
            amax     = max(history') | history'[:, 0]  (amax_compute)
            scale'   = scale_from_amax(amax, old=scale)
            found_inf set: history, scale unchanged    (a skipped step)
            pending  = 0                               (either way)

The forward and backward only raise `pending` (a running max), so with
gradient accumulation the micro-batches since the last roll count as one
step. `attach(optimizer, model)` calls update_scales after every
``optimizer.step``, with the ``found_inf`` the GradScaler passes to
xla_amp's syncfree optimizers; on device, no sync.
"""
from __future__ import annotations

import torch
from torch import nn

from xla_amp.fp8 import _quant
from xla_amp.fp8._linear import Fp8Linear


def roll(recipe, hist, pending, scale, found_inf=None):
    """One layer's roll as values: (history', scale') from its history,
    pending amaxes and scale (pending becomes 0). Shared by `update_scales`
    (torch_xla, buffers in place) and xla_amp.torchax's jitted step."""
    new_hist = torch.cat([pending.reshape(3, 1), hist[:, :-1]], dim=1)
    amax = new_hist.amax(dim=1) if recipe.amax_compute == "max" else new_hist[:, 0]
    new_scale = torch.stack([_quant.scale_from_amax(recipe, f, amax[i], scale[i])
                             for i, f in enumerate(recipe.dtypes())])
    if found_inf is not None:
        skip = found_inf.to(torch.bool).reshape(())
        new_hist = torch.where(skip, hist, new_hist)
        new_scale = torch.where(skip, scale, new_scale)
    return new_hist, new_scale


def delayed_layers(model: nn.Module) -> list[tuple[str, Fp8Linear]]:
    """(name, layer) of every delayed-scaling Fp8Linear of `model`, in module
    order: the layers a roll touches (also xla_amp.torchax's jitted step)."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, Fp8Linear) and m.recipe.scaling == "delayed"]


def _delayed(model: nn.Module) -> list[Fp8Linear]:
    return [m for _, m in delayed_layers(model)]


def _replicated(modules: list[Fp8Linear], groups, caller: str) -> bool:
    """Whether the pending amaxes live where replicas may hold other values
    (torch_xla's devices: replica mode); `groups` only means something there,
    and is refused anywhere else."""
    devices = {m.fp8_amax_pending.device.type for m in modules}
    if groups is not None and devices != {"xla"}:
        where = (f"its delayed-scaling buffers are on {', '.join(sorted(devices))}" if devices
                 else "it has no delayed-scaling layer")
        raise ValueError(f"fp8.{caller}: groups={groups!r} names torch_xla replica groups "
                         f"for the amax histories, and this model has none to reduce: {where}")
    return devices == {"xla"}


@torch.no_grad()
def update_scales(model: nn.Module, found_inf: torch.Tensor | None = None,
                  groups: list[list[int]] | None = None) -> None:
    """Rolls every delayed-scaling layer's amax history; see the module docstring.
    Call once per optimizer step, after it.

    In torch_xla's replica mode (several replicas, not SPMD) each replica
    has seen only its own shard of the batch: the pending amaxes are first
    MAX-reduced over the replicas (`groups`: torch_xla's replica groups,
    default all), one collective for every layer, so that every replica
    rolls the history of the global batch and keeps the same scales.
    SPMD computes the global amax itself, and one replica needs nothing."""
    modules = _delayed(model)
    if _replicated(modules, groups, "update_scales"):
        from xla_amp import distributed
        distributed.reduce_max_([m.fp8_amax_pending for m in modules], groups)
    for module in modules:
        new_hist, new_scale = roll(module.recipe, module.fp8_amax_history,
                                   module.fp8_amax_pending, module.fp8_scale, found_inf)
        module.fp8_amax_history.copy_(new_hist)
        module.fp8_scale.copy_(new_scale)
        module.fp8_amax_pending.zero_()


def attach(optimizer: torch.optim.Optimizer, model: nn.Module,
           groups: list[list[int]] | None = None):
    """Rolls `model`'s fp8 histories after each ``optimizer.step`` (skipped
    steps, found_inf set, leave them), reducing over the replica `groups`
    as `update_scales` does (checked here, before the first step). Call
    once the model is on its device. Returns the hook handle."""
    if _replicated(_delayed(model), groups, "attach"):
        from xla_amp import distributed
        distributed.check_replica_groups(groups)

    def hook(opt, args, kwargs):
        # found_inf: a syncfree step's argument, or the GradScaler's for any
        # other optimizer it steps (xla_amp/scaler/_step.py)
        found_inf = kwargs.get("found_inf")
        if found_inf is None:
            found_inf = getattr(opt, "_xla_amp_found_inf", None)
        update_scales(model, found_inf, groups)
    return optimizer.register_step_post_hook(hook)
