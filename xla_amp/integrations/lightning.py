"""xla_amp as a precision plugin for ``lightning.Trainer`` on XLA.

    from xla_amp.integrations.lightning import XLAAMPPrecision
    trainer = L.Trainer(accelerator="tpu", plugins=[XLAAMPPrecision("bf16-mixed")])

The Trainer's XLA strategies take only ``XLAPrecision`` plugins, so this is
one; its ``__init__`` is not called (it would set ``XLA_USE_BF16``). Each
hook does one job and hands it to the shared ``Hooks`` (``_hooks.py``).
Unlike Fabric, the Trainer hands the optimizers over before their first
step (``connect``): ``torch.optim.SGD/Adam/AdamW`` from
``configure_optimizers`` are replaced by their ``xla_amp.syncfree``
namesakes, with the mode's master-weight / stochastic-rounding option, and
their LR schedulers follow.

One iteration (``optimizer_step``)::

    loss = closure()          # training_step under autocast, scaled backward
    reduce gradients          # mean over replicas
    unscale (16-mixed)        # so clipping sees true gradients
    on_before_optimizer_step, clip
    scaler.step + update | optimizer.step     # skip decided on the device
    torch_xla.sync()          # the step is one graph
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable

import torch
from lightning.pytorch.plugins.precision.xla import XLAPrecision
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from xla_amp.integrations import _optimizers
from xla_amp.integrations._hooks import Hooks
from xla_amp.integrations._mode import Mode
from xla_amp.integrations.fabric import MODE_ARGS_DOC


class XLAAMPPrecision(XLAPrecision):
    __doc__ = "xla_amp's mixed precision for the Lightning Trainer on XLA.\n" + MODE_ARGS_DOC

    def __init__(self, precision: str = "bf16-mixed", *, policy=None, module_policies=None,
                 master_weights: bool = False, stochastic_rounding: bool = False,
                 keep: tuple = (), scaler: dict | None = None, fp8=None) -> None:
        mode = Mode(precision, policy=policy, module_policies=module_policies,
                    master_weights=master_weights, stochastic_rounding=stochastic_rounding,
                    keep=keep, scaler=scaler or {}, fp8=fp8)
        self.hooks = Hooks(mode)
        self.precision = mode.precision
        self._desired_dtype = mode.param_dtype

    @property
    def scaler(self):
        """The ``xla_amp.GradScaler`` (``"16-mixed"``), else ``None``."""
        return self.hooks.scaler

    def connect(self, model, optimizers: list, lr_schedulers: list):
        """Replace the optimizers by the ones this mode trains with (before
        their first step; their LR schedulers follow), then convert the
        model: here rather than in ``convert_module``, so an optimizer that
        cannot train the mode is refused before the model changes. The
        conversion keeps each parameter object, so the optimizers (built on
        them by ``configure_optimizers``) hold the converted ones."""
        adopted = self.hooks.adopt(optimizers)
        self.hooks.convert_module(model)
        for old, new in zip(optimizers, adopted):
            for config in lr_schedulers:
                _optimizers.follow(getattr(config, "scheduler", config), old, new)
        return model, adopted, lr_schedulers

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module  # in connect(), once the optimizers are known to fit the mode

    def forward_context(self) -> AbstractContextManager:
        return self.hooks.autocast()

    def convert_input(self, data: Any) -> Any:
        return self.hooks.convert_input(data)

    def pre_backward(self, tensor: torch.Tensor, module) -> torch.Tensor:
        return super().pre_backward(self.hooks.scale(tensor), module)

    def optimizer_step(self, optimizer, model, closure: Callable[[], Any], **kwargs: Any) -> Any:
        import torch_xla
        self.hooks.check_optimizer(optimizer)
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:
            raise MisconfigurationException(
                "training_step returned None (skipping backward): not supported with "
                "XLAAMPPrecision, as with Lightning's XLAPrecision")
        self.hooks.reduce_gradients(optimizer)
        self.hooks.unscale(optimizer)
        self._after_closure(model, optimizer)
        out = self.hooks.step(optimizer, reduce=False, **kwargs)
        torch_xla.sync()
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.hooks.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.hooks.load_state_dict(state_dict)

    def teardown(self) -> None:
        self.hooks.teardown()
