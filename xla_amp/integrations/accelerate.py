"""xla_amp as Hugging Face Accelerate's mixed precision on XLA.

    from xla_amp.integrations.accelerate import Accelerator   # in place of accelerate's
    accelerator = Accelerator(mixed_precision="bf16")         # or "fp16", "fp8"; policy=...,
                                                              # module_policies=..., fp8=Fp8Recipe(...)
    model = model.to(accelerator.device)
    optimizer = xla_amp.syncfree.AdamW(model.parameters(), lr=1e-3)   # the recommended optimizer
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ...
    accelerator.backward(loss); optimizer.step(); optimizer.zero_grad(); torch_xla.sync()

Why a subclass (docs/integrations.md says more): Accelerate decides its
mixed precision inside ``Accelerator.__init__`` (``XLA_USE_BF16`` on a TPU,
``torch.amp.GradScaler`` -- or the removed ``torch_xla.amp.GradScaler`` on
XLA:GPU -- for fp16), and no kwargs handler can replace the scaler or the
autocast. This class hands Accelerate ``mixed_precision="no"`` so none of
that happens, then fills in, through the public attributes and methods
Accelerate's own code uses, xla_amp's: ``scaler`` (an ``xla_amp.GradScaler``
that ``backward``, the prepared optimizer's ``step``, ``save_state`` and
``load_state`` use as they use theirs), the forward's autocast in
``prepare_model``, ``autocast()``, ``unscale_gradients`` and the
``mixed_precision`` it reports.

The requested precision is ``mixed_precision=`` or, as in Accelerate,
``ACCELERATE_MIXED_PRECISION`` (``accelerate launch --mixed_precision``);
``GradScalerKwargs`` in ``kwargs_handlers`` become the scaler's arguments.
"""
from __future__ import annotations

import contextlib
import os
from types import MethodType

import accelerate
from accelerate.utils import GradScalerKwargs, convert_outputs_to_fp32

from xla_amp.integrations._hooks import Hooks
from xla_amp.integrations._mode import Mode

# Accelerate's names for the mixed precisions xla_amp provides
NAMES = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp8": "fp8-mixed"}


def _mode(mixed_precision, policy, module_policies, handlers, fp8=None) -> Mode | None:
    requested = mixed_precision or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    requested = str(requested).lower()
    if requested == "no":
        if policy is not None or module_policies is not None or fp8 is not None:
            raise ValueError("policy= / module_policies= / fp8= need mixed_precision='bf16', "
                             "'fp16' or 'fp8'")
        return None
    if requested not in NAMES:
        raise ValueError(f"mixed_precision={requested!r}: xla_amp provides "
                         f"{', '.join(NAMES)} (or 'no')")
    scaler = {}
    for handler in handlers or ():
        if isinstance(handler, GradScalerKwargs):
            scaler = handler.to_kwargs()
    if scaler and requested != "fp16":
        raise ValueError("GradScalerKwargs apply to mixed_precision='fp16' only")
    return Mode(NAMES[requested], policy=policy, module_policies=module_policies, scaler=scaler,
                fp8=fp8)


class Accelerator(accelerate.Accelerator):
    """``accelerate.Accelerator`` whose ``"bf16"`` / ``"fp16"`` is xla_amp's
    autocast (``policy=``, ``module_policies=`` pass through) and, for fp16,
    ``xla_amp.GradScaler``. Refuses a bad setting (``ValueError`` naming
    it) before Accelerate's state is made."""

    def __init__(self, *args, mixed_precision: str | None = None, policy=None,
                 module_policies=None, fp8=None, **kwargs):
        mode = _mode(mixed_precision, policy, module_policies, kwargs.get("kwargs_handlers"),
                     fp8)
        super().__init__(*args, mixed_precision="no", **kwargs)
        self.xla_amp_hooks = Hooks(mode) if mode is not None else None
        if mode is not None:
            self.scaler = self.xla_amp_hooks.scaler

    @property
    def mixed_precision(self) -> str:
        """The precision asked for ("bf16", "fp16" or Accelerate's own)."""
        if self.xla_amp_hooks is None:
            return super().mixed_precision
        return next(k for k, v in NAMES.items() if v == self.xla_amp_hooks.mode.precision)

    def prepare_optimizer(self, optimizer, device_placement=None):
        prepared = super().prepare_optimizer(optimizer, device_placement=device_placement)
        if self.xla_amp_hooks is not None:
            inner = prepared
            while isinstance(inner, accelerate.optimizer.AcceleratedOptimizer):
                inner = inner.optimizer
            self.xla_amp_hooks.track_optimizer(inner)
        return prepared

    def prepare_model(self, model, device_placement=None, evaluation_mode: bool = False):
        model = super().prepare_model(model, device_placement=device_placement,
                                      evaluation_mode=evaluation_mode)
        hooks = self.xla_amp_hooks
        if hooks is None or "_original_forward" in model.__dict__:
            return model
        hooks.convert_module(model)
        # as Accelerate wraps its own autocast (so its unwrap_model restores
        # the plain forward): the forward inside the region, floating outputs
        # handed back in float32
        region = hooks.autocast()
        model._original_forward = model.forward
        if hasattr(model.forward, "__func__"):
            model.forward = MethodType(convert_outputs_to_fp32(region(model.forward.__func__)), model)
        else:
            model.forward = convert_outputs_to_fp32(region(model.forward))
        return model

    @contextlib.contextmanager
    def autocast(self, autocast_handler=None):
        if self.xla_amp_hooks is None:
            with super().autocast(autocast_handler):
                yield
            return
        with self.xla_amp_hooks.autocast():
            yield

    def unscale_gradients(self, optimizer=None):
        if self.xla_amp_hooks is None:
            return super().unscale_gradients(optimizer)
        optimizers = self._optimizers if optimizer is None else (
            optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])
        for opt in optimizers:
            while isinstance(opt, accelerate.optimizer.AcceleratedOptimizer):
                opt = opt.optimizer
            self.xla_amp_hooks.unscale(opt)
