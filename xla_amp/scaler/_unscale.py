"""GradScaler's unscale pass, with one inf/NaN flag per gradient kept on
the device (`GradScaler.overflow_report` reads them).

    per device, per gradient dtype:
        flag[i] = isnan(sum(|g_i * 0|))     (inf*0 and NaN*0 are NaN; a sum
                                             propagates NaN, XLA's max does not)
        g *= 1/scale                         (bf16: in float32, rounded once)
    found_inf[device] = any(flag)            (0./1., float32)
    after the step:  last = flag;  last_skipped = found ? flag : last_skipped
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from xla_amp._upload import upload
from xla_amp._param_walk import params_with_grads, where


def collect(optimizer, check_device) -> dict:
    """device -> dtype -> [(gradient, (group index, index))]; every gradient
    checked before anything is touched."""
    grads: dict = defaultdict(lambda: defaultdict(list))
    for gi, pi, p in params_with_grads(optimizer):
        check_device(p.device, where(gi, pi))
        if p.grad.dtype == torch.float16:
            raise ValueError(
                f"Attempting to unscale FP16 gradients ({where(gi, pi)}); keep the "
                "parameters in float32 and let autocast produce fp16 activations.")
        if p.grad.is_sparse:
            raise ValueError(f"GradScaler: {where(gi, pi)} has a sparse gradient (unsupported)")
        grads[p.grad.device][p.grad.dtype].append((p.grad, (gi, pi)))
    return grads


def unscale(grads: dict, inv_scale: torch.Tensor):
    """Unscales in place; returns ({device: found_inf}, [(positions, flags)])."""
    found, flags = {}, []
    with torch.no_grad():
        for device, per_dtype in grads.items():
            inv = inv_scale.to(device)
            device_flags, positions = [], []
            for dtype, entries in per_dtype.items():
                positions += [pos for _, pos in entries]
                device_flags.append(unscale_list([g for g, _ in entries], inv))
            device_flags = torch.cat(device_flags)
            found[device] = device_flags.any().to(torch.float32)
            flags.append((positions, device_flags))
    return found, flags


def unscale_list(gs: list, inv: torch.Tensor) -> torch.Tensor:
    """Multiplies gradients of one dtype by `inv` in place; returns a bool
    per gradient: has an inf/NaN (tensor ops only, no sync; also the
    PrivateUse1 engine's ``_amp_foreach_non_finite_check_and_unscale_``)."""
    # bf16: PyTorch/XLA's lowering multiplies bf16 by f32, which XLA
    # rejects (test_xla_known_issues.py): unscale in f32, round once
    wide = gs if gs[0].dtype == torch.float32 else [g.float() for g in gs]
    zeros = torch._foreach_mul(wide, 0.0)
    flags = torch.stack(torch._foreach_norm(zeros, 1)).isnan()
    torch._foreach_mul_(wide, inv)
    if wide is not gs:
        torch._foreach_copy_(gs, wide)
    return flags


@dataclasses.dataclass
class OverflowFlags:
    """One optimizer's per-gradient flags: of the last step, and of the latest
    step that had any (device tensors, next to the gradients' positions)."""
    last: list
    last_skipped: list

    def after_step(self, flags: list, found: dict) -> None:
        # a device whose gradients are other parameters now starts over
        previous = {tuple(positions): old for positions, old in self.last_skipped}
        self.last_skipped = []
        for positions, new in flags:
            old = previous.get(tuple(positions))
            if old is None:  # uploaded, not a constant: the first step's graph
                # is then every step's (xla_amp/_upload.py)
                old = upload(torch.zeros(new.shape, dtype=new.dtype), new.device)
            self.last_skipped.append((positions, torch.where(found[new.device] != 0, new, old)))
        self.last = flags


def names(optimizer, flags: list) -> list[str]:
    """Read the flags (one transfer per device) and name the parameters set,
    in the optimizer's order (the flags come per dtype): the name from the
    param group's "param_names" (optimizers built from named_parameters()),
    else "group g, index i"."""
    bad = sorted(pos for positions, device_flags in flags
                 for pos, flag in zip(positions, device_flags.cpu().tolist()) if flag)
    out = []
    for gi, pi in bad:
        group_names = optimizer.param_groups[gi].get("param_names")
        out.append(group_names[pi] if group_names else f"group {gi}, index {pi}")
    return out
