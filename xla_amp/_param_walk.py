"""The one walk over an optimizer's parameters with gradients, the one
wording of "which parameter" that every error message uses (the sync-free
optimizers' C++ pass, xla_amp._C.collect_grads, mirrors it), and the one
check that an optimizer's parameters are on the XLA device, which every
entry point that steps an optimizer makes before it changes anything."""
from __future__ import annotations

from typing import Iterator, Optional

import torch

from xla_amp import _devices

# what to do about a parameter left on the host, unless the caller knows better
MOVE_FIRST = ("move the model to the XLA device before building the optimizer "
              "(model.to(torch_xla.device()), then optimizer(model.parameters())), or point "
              "its param groups at the moved parameters")


def check_optimizer(optimizer, who: str) -> None:
    """TypeError unless `optimizer` is a torch.optim.Optimizer (`who` names
    the caller)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{who}: optimizer must be a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")


def params_with_grads(optimizer) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(group index, index in the group, parameter) for every parameter that
    has a gradient, in param-group order."""
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            if p.grad is not None:
                yield gi, pi, p


def where(gi: int, pi: int) -> str:
    return f"parameter {pi} of param group {gi}"


def first_off_xla(optimizer) -> Optional[tuple[int, int, torch.Tensor]]:
    """(group index, index in the group, parameter) of the first parameter of
    `optimizer` that is not on an XLA device, with or without a gradient;
    None when all are. Read from the optimizer's param groups as they are
    now (a list replaced or edited since the last step is seen), and from
    each tensor's device alone: no transfer, no graph. About 0.1 us per
    parameter (docs/sync_free.md)."""
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            if not p.is_xla and not _devices.on_device(p):  # is_xla: the fast path
                return gi, pi, p
    return None


def off_xla_message(who: str, gi: int, pi: int, p: torch.Tensor, fix: str = MOVE_FIRST) -> str:
    """The one line that refuses a parameter not on the XLA device."""
    return (f"{who}: {where(gi, pi)} is on {p.device}, not on the XLA device (shape "
            f"{tuple(p.shape)}; the step would not train it): {fix}")


def check_on_xla(optimizer, who: str) -> None:
    """ValueError naming the first parameter of `optimizer` not on an XLA
    device (see `first_off_xla`); `who` names the entry point. Raised
    before the caller changes anything."""
    bad = first_off_xla(optimizer)
    if bad is not None:
        raise ValueError(off_xla_message(who, *bad))
