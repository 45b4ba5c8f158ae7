"""Pointing an optimizer built before its model moved at the moved parameters.

On XLA, ``module.to(xla_device)`` gives each parameter a new object (a host
tensor and an XLA tensor cannot share one implementation). An optimizer
built on ``module.parameters()`` before the move keeps the host ones, and
its steps train nothing. Lightning Fabric's canonical order does exactly
that on one XLA device::

    opt = SGD(model.parameters())
    model, opt = fabric.setup(model, opt)   # precision.convert_module(model),
                                            # then model.to(device)

(Fabric re-points the optimizer itself only under its multi-device
``XLAStrategy``.) ``Moves.record`` notes each parameter of a module the
framework hands to the precision plugin, under its name, before the move;
``Moves.plan`` maps every host parameter an optimizer holds to the device
parameter of that name in the same module, or refuses naming the first it
cannot map; ``relink`` applies the map to the param groups and the state,
which follows its parameter to the device. Mapping by name after the move
is how Accelerate repairs its own ``prepare`` on XLA.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from xla_amp._param_walk import off_xla_message


class Moves:
    """The host parameters of the modules a framework set up, by name.
    Holds them weakly: an optimizer built in the documented order keeps
    none alive."""

    def __init__(self) -> None:
        self._names = WeakIdKeyDictionary()  # host parameter -> (module ref, name)

    def record(self, module: torch.nn.Module) -> None:
        """Note ``module``'s host parameters before it moves."""
        ref = weakref.ref(module)
        for name, p in module.named_parameters():
            if not p.is_xla and p not in self._names:
                self._names[p] = (ref, name)

    def plan(self, optimizer, who: str, fix: str) -> dict:
        """{host parameter: its moved parameter} for every parameter of
        ``optimizer`` not on the XLA device; ``ValueError`` in one line
        (``who``, which parameter, ``fix``) for the first one that is no
        parameter of a recorded module, or whose module has not moved."""
        mapping: dict = {}
        moved: dict = {}  # module -> {name: parameter now}
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.is_xla:
                    continue
                new = self._moved(p, moved)
                if new is None:
                    raise ValueError(off_xla_message(who, gi, pi, p, fix))
                mapping[p] = new
        return mapping

    def _moved(self, p: torch.Tensor, moved: dict):
        entry = self._names.get(p)
        module = entry[0]() if entry is not None else None
        if module is None:
            return None
        if module not in moved:
            moved[module] = dict(module.named_parameters())
        new = moved[module].get(entry[1])
        if new is None or not new.is_xla or new.shape != p.shape:
            return None
        return new


def relink(optimizer, mapping: dict) -> None:
    """Replace each host parameter of ``optimizer`` by ``mapping[it]`` in
    the param groups (new lists in the same group dicts, so an LR scheduler
    holding them is unaffected) and re-key its state, moving the state's
    tensors to the new parameter's device -- except a step count that
    ``torch.optim`` keeps on the host (neither ``capturable`` nor
    ``fused``), which stays there, as ``load_state_dict`` leaves it."""
    state = optimizer.state
    for group in optimizer.param_groups:
        host_step = not (group.get("capturable") or group.get("fused"))
        old_params = group["params"]
        group["params"] = [mapping.get(p, p) for p in old_params]
        for old in old_params:
            if old not in mapping or old not in state:
                continue
            new = mapping[old]
            state[new] = {key: value.to(new.device)
                          if (isinstance(value, torch.Tensor) and value.device == old.device
                              and not (key == "step" and host_step)) else value
                          for key, value in state.pop(old).items()}
