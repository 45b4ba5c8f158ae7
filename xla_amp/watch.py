"""Where the first inf/NaN came from, found on the device.

    watch = xla_amp.watch_nonfinite(model)
    for x, y in loader:
        ...training step...
    watch.report()   # None, or {"module": "blocks.3.mlp", "phase": "forward", "step": 17}
    watch.remove()

Algorithm (all state lives on the device; the checks join the step's own
graph, so watching adds no execution and no transfer)::

    install:  code k of every (module, phase), one device tensor of codes
              first = -1, first_step = -1, step = -1       (device scalars)
    model forward starts:                step += 1
    a module's forward returns (innermost first), for its output tensors:
        bad  = any floating output has an inf/NaN
        take = bad and first == -1       (the first event wins: updates run
                                          in execution order)
        first, first_step = where(take, (k_forward, step), (first, first_step))
        each floating output that requires grad gets a gradient hook that
        does the same with k_backward when backward reaches it
    report(): one transfer of (first, first_step); decoded on the host

"Step" counts the watched model's forward calls from 0. Watching works on
lazy (non-compiled) models; `remove()` takes every hook off.
"""
from __future__ import annotations

import torch
from torch import nn

_PHASES = ("forward", "backward")


class NonfiniteWatch:
    """Per-module device-side inf/NaN flags of one model; see the module
    docstring. Build it with `watch_nonfinite`."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"watch_nonfinite: expected an nn.Module, got {type(model).__name__}")
        device = next((p.device for p in model.parameters()), None)
        if device is None or device.type != "xla":
            raise ValueError("watch_nonfinite: the model's parameters must be on an XLA "
                             f"device (got {device}); move the model first")
        self._names = [name for name, _ in model.named_modules()]
        self._codes = torch.arange(2 * len(self._names), dtype=torch.int32, device=device)
        none = torch.tensor(-1, dtype=torch.int32, device=device)
        self._first, self._first_step, self._step = none.clone(), none.clone(), none.clone()
        self._handles = [model.register_forward_pre_hook(self._next_step)]
        for index, (_, module) in enumerate(model.named_modules()):
            self._handles.append(module.register_forward_hook(self._forward_hook(index)))

    def _next_step(self, module, args):
        self._step = self._step + 1

    def _note(self, code: int, tensors) -> None:
        bad = None
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                b = ~torch.isfinite(t).all()
                bad = b if bad is None else bad | b
        if bad is None:
            return
        take = bad & (self._first < 0)
        self._first = torch.where(take, self._codes[code], self._first)
        self._first_step = torch.where(take, self._step, self._first_step)

    def _forward_hook(self, index: int):
        def hook(module, args, output):
            leaves = torch.utils._pytree.tree_leaves(output)
            self._note(2 * index, leaves)
            if torch.is_grad_enabled():
                for t in leaves:
                    if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point():
                        t.register_hook(lambda grad: self._note(2 * index + 1, (grad,)))
        return hook

    def report(self) -> dict | None:
        """None if no watched module's output (forward) or output gradient
        (backward) held an inf/NaN since the watch began; else the first one:
        {"module": qualified name ("" for the model itself), "phase":
        "forward" | "backward", "step": forward call of the model, from 0}.
        The one device-to-host transfer of the watch."""
        first, step = torch.stack([self._first, self._first_step]).cpu().tolist()
        if first < 0:
            return None
        return {"module": self._names[first // 2], "phase": _PHASES[first % 2], "step": step}

    def remove(self) -> None:
        """Takes the watch's hooks off the model (gradient hooks already placed
        on this step's outputs still report)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def watch_nonfinite(model: nn.Module) -> NonfiniteWatch:
    """Starts watching `model` for the first module output (forward) or output
    gradient (backward) holding an inf/NaN; see `NonfiniteWatch`."""
    return NonfiniteWatch(model)
