"""xla_amp as a precision plugin for ``lightning.Fabric`` on XLA.

    from xla_amp.integrations.fabric import XLAAMPPrecision
    fabric = L.Fabric(accelerator="tpu", plugins=[XLAAMPPrecision("bf16-mixed")])
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(xla_amp.syncfree.AdamW(model.parameters()))

Fabric's XLA strategies take only ``XLAPrecision`` plugins, so this is one;
its ``__init__`` is not called (it would set ``XLA_USE_BF16``). Each hook
does one job and hands it to the shared ``Hooks`` (``_hooks.py``).
Fabric has no hook that could replace the optimizer: build the syncfree
one yourself (``"bf16-true"`` with master weights or stochastic rounding
refuses any other at its first step).

Fabric's canonical order, ``model, opt = fabric.setup(model, opt)`` with
``opt`` built on the host model, leaves ``opt`` on the host parameters
after the move. ``convert_module`` (called before the move) notes them,
and the first hook that gets the optimizer (``optimizer_step``,
``unscale_gradients``, ``main_params``) points it at the moved ones, state
included (``_relink.py``), or refuses in one line saying what to do.
"""
from __future__ import annotations

import weakref
from contextlib import AbstractContextManager
from typing import Any

import torch
from lightning.fabric.plugins.precision.xla import XLAPrecision

from xla_amp._param_walk import first_off_xla, off_xla_message
from xla_amp.integrations._hooks import Hooks
from xla_amp.integrations._mode import Mode
from xla_amp.integrations._relink import Moves, relink

WHO = "XLAAMPPrecision"
# what a Fabric user does about an optimizer that holds host parameters
SETUP_ORDER = ("call fabric.setup_module(model) first, then build the optimizer on "
               "model.parameters(){}, then fabric.setup_optimizers(opt)")

MODE_ARGS_DOC = """
    Args:
        precision: ``"bf16-mixed"`` (bf16 autocast, fp32 parameters),
            ``"16-mixed"`` (fp16 autocast + ``xla_amp.GradScaler``: an
            overflow step is skipped on the device) or ``"bf16-true"``
            (bf16 parameters through ``xla_amp.cast_module``; the forward
            still runs under autocast, so its fp32-listed ops -- softmax,
            losses -- widen), or ``"fp8-mixed"`` (``"bf16-mixed"`` with the
            Linear layers in fp8: ``xla_amp.fp8``).
        policy: autocast rules, a name or an ``xla_amp.Policy``; default:
            the device's.
        module_policies: rules for ``xla_amp.module_policies``.
        master_weights, stochastic_rounding: ``"bf16-true"``: how the
            ``xla_amp.syncfree`` optimizer keeps the updates bf16 cannot hold.
        keep: ``"bf16-true"``: module classes left in float32.
        scaler: ``"16-mixed"``: ``xla_amp.GradScaler`` arguments.
        fp8: an ``xla_amp.fp8.Fp8Recipe`` (``"fp8-mixed"``: the default one;
            also with ``"bf16-mixed"`` / ``"16-mixed"``); delayed scaling's
            histories roll after each optimizer step.

    A bad argument raises ``ValueError`` naming it, before anything changes.
    No ``XLA_USE_*`` environment variable is read or set.
"""


class XLAAMPPrecision(XLAPrecision):
    __doc__ = "xla_amp's mixed precision for Fabric on XLA.\n" + MODE_ARGS_DOC

    def __init__(self, precision: str = "bf16-mixed", *, policy=None, module_policies=None,
                 master_weights: bool = False, stochastic_rounding: bool = False,
                 keep: tuple = (), scaler: dict | None = None, fp8=None) -> None:
        mode = Mode(precision, policy=policy, module_policies=module_policies,
                    master_weights=master_weights, stochastic_rounding=stochastic_rounding,
                    keep=keep, scaler=scaler or {}, fp8=fp8)
        self.hooks = Hooks(mode)
        self.precision = mode.precision
        # XLAFSDPStrategy's compute_dtype: the parameters' dtype (autocast
        # does the mixed modes' casting inside the forward)
        self._desired_dtype = mode.param_dtype
        self._moves = Moves()
        self._adopted: weakref.WeakSet = weakref.WeakSet()

    @property
    def scaler(self):
        """The ``xla_amp.GradScaler`` (``"16-mixed"``), else ``None``."""
        return self.hooks.scaler

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = self.hooks.convert_module(module)
        self._moves.record(module)  # before Fabric moves it (the cast keeps each object)
        return module

    def _adopt(self, optimizer) -> None:
        """Once per optimizer, before its first use here: it fits the mode,
        and an optimizer built before ``fabric.setup`` moved its model is
        pointed at the moved parameters -- or refused in one line, with
        nothing changed, when a host parameter has no moved counterpart."""
        if optimizer in self._adopted:
            return
        bad = first_off_xla(optimizer)
        try:
            self.hooks.check_mode(optimizer)
        except ValueError:
            if bad is None:
                raise
            # the mode needs a syncfree optimizer, and those take device parameters only
            flags = ", ".join(f"{k}=True" for k, v in self.hooks.mode.optimizer_options.items()
                              if v)
            need = f" (an xla_amp.syncfree one with {flags}, as precision={self.precision!r} needs)"
            raise ValueError(off_xla_message(WHO, *bad, SETUP_ORDER.format(need))) from None
        if bad is not None:
            relink(optimizer, self._moves.plan(optimizer, WHO, SETUP_ORDER.format("")))
        self._adopted.add(optimizer)

    def forward_context(self) -> AbstractContextManager:
        return self.hooks.autocast()

    def convert_input(self, data: Any) -> Any:
        return self.hooks.convert_input(data)

    def pre_backward(self, tensor: torch.Tensor, module) -> Any:
        return self.hooks.scale(tensor)

    def unscale_gradients(self, optimizer) -> None:
        self._adopt(optimizer)
        self.hooks.unscale(optimizer)

    def main_params(self, optimizer):
        self._adopt(optimizer)
        return super().main_params(optimizer)

    def optimizer_step(self, optimizer, **kwargs: Any) -> Any:
        import torch_xla
        self._adopt(optimizer)
        out = self.hooks.step(optimizer, **kwargs)
        torch_xla.sync()  # the step is one graph, cut here (as XLAPrecision's barrier)
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.hooks.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.hooks.load_state_dict(state_dict)

    def teardown(self) -> None:
        self.hooks.teardown()
