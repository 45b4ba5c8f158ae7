"""The one walk over an optimizer's parameters with gradients, and the one
wording of "which parameter" that every error message uses (the sync-free
optimizers' C++ pass, xla_amp._C.collect_grads, mirrors it)."""
from __future__ import annotations

from typing import Iterator

import torch


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
