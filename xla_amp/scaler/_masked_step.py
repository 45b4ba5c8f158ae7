"""GradScaler's step for optimizers that take no ``found_inf`` (any
``torch.optim`` optimizer, ``torch.optim.RMSprop``, ...): run the step, then
undo it on the device when found_inf is set::

    keep = found_inf != 0
    snapshot params with a grad and the optimizer's state; opt.step()
    p <- where(keep, p_old, p_new), same for each device state tensor
    if the step created state or changed host-side values (a Python number,
    a CPU step tensor): read found_inf once (a sync) and, when skipped,
    restore them / drop the new entries.

So an optimizer whose state lives on the device (``capturable=True`` for
``torch.optim.Adam``-like ones, ``SGD``) is sync-free after its first step;
one with host-side state stays correct at the cost of one transfer per
step, announced by a warning printed once per optimizer class.
"""
from __future__ import annotations

import warnings

import torch

from xla_amp import _devices

_warned_host_state: set[type] = set()


def _is_device_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and _devices.on_device(v)


def masked_step(optimizer, found_inf: torch.Tensor, kwargs: dict):
    """Run ``optimizer.step()`` and undo it on the device when found_inf != 0
    (see the module docstring); falls back to one sync where the device
    cannot express the undo."""
    keep = found_inf != 0
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    with torch.no_grad():
        p_old = [p.detach().clone() for p in params]
        before = {}
        for p, st in optimizer.state.items():
            before[p] = {k: (v, v.detach().clone() if isinstance(v, torch.Tensor) else v)
                         for k, v in st.items()}
    retval = optimizer.step(**kwargs)
    needs_host = False  # some change that only the host can undo
    host_state = False  # ... because the optimizer keeps state on the host
    with torch.no_grad():
        for p, old in zip(params, p_old):
            p.copy_(torch.where(keep, old, p))
        for p, st in optimizer.state.items():
            prev = before.get(p)
            if prev is None or set(st) - set(prev):
                needs_host = True  # state created by this step
            for k, v in st.items():
                if prev is None or k not in prev:
                    continue
                obj, snap = prev[k]
                if _is_device_tensor(v) and isinstance(snap, torch.Tensor) \
                        and v.shape == snap.shape and v.device == snap.device:
                    masked = torch.where(keep, snap.to(v.dtype), v)
                    if v is obj:
                        v.copy_(masked)
                    else:
                        st[k] = masked
                elif isinstance(v, torch.Tensor) or isinstance(snap, torch.Tensor):
                    if not (isinstance(v, torch.Tensor) and isinstance(snap, torch.Tensor)
                            and v.shape == snap.shape and torch.equal(v, snap.to(v))):
                        needs_host = host_state = True
                elif v is not obj and v != snap:
                    needs_host = host_state = True
    if not needs_host:
        return retval
    if host_state and type(optimizer) not in _warned_host_state:
        _warned_host_state.add(type(optimizer))
        warnings.warn(
            f"xla_amp.GradScaler: {type(optimizer).__name__} keeps part of its state on "
            "the host (a Python number or CPU tensor, such as a step count), so each "
            "scaler.step() reads found_inf back to the host once. Use an "
            "xla_amp.syncfree optimizer, or capturable=True where the optimizer has it, "
            "for a sync-free step.", stacklevel=3)
    if bool(found_inf.item()):  # the documented sync: undo what the device cannot
        with torch.no_grad():
            for p in list(optimizer.state.keys()):
                prev = before.get(p)
                if prev is None:
                    del optimizer.state[p]
                    continue
                st = optimizer.state[p]
                for k in list(st):
                    if k not in prev:
                        del st[k]
                for k, (obj, snap) in prev.items():
                    if _is_device_tensor(obj) and k in st:
                        continue  # already masked above
                    if isinstance(obj, torch.Tensor):
                        obj.copy_(snap)
                    st[k] = obj
    return retval
