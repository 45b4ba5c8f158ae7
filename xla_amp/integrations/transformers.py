"""xla_amp for the Hugging Face Transformers ``Trainer`` on XLA.

    from xla_amp.integrations.transformers import XLAAMPTrainer     # in place of Trainer
    trainer = XLAAMPTrainer(model=model, args=TrainingArguments(..., bf16=True),  # or fp16=True
                            train_dataset=ds, xla_amp_policy=None)
    trainer.train()

or, for a Trainer subclass of your own (TRL's, ...), put the mixin first:
``class MyTrainer(XLAAMPTrainerMixin, SFTTrainer): ...``

``--bf16`` / ``--fp16`` then mean xla_amp's autocast, for fp16 with
xla_amp's GradScaler, and the optimizer the Trainer builds
(``adamw_torch``, ``adamw_torch_fused``, ...: ``torch.optim.AdamW``) is
replaced by ``xla_amp.syncfree.AdamW`` with the same arguments, so the
scaler's skip decision reaches it as ``found_inf``, on the device.
``optim="adamw_torch_xla"`` (PyTorch/XLA's own syncfree AdamW) is kept:
the scaler feeds it ``found_inf`` too. No ``XLA_USE_BF16``.

How: the Trainer makes its Accelerator inside
``create_accelerator_and_postprocess`` from the name ``Accelerator`` in
``transformers.trainer``; for that one call the name is
``xla_amp.integrations.accelerate.Accelerator`` (the Accelerate route,
docs/integrations.md), then it is put back. The optimizer is swapped in
``create_optimizer``, before the Trainer builds its LR scheduler on it.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
import transformers
import transformers.trainer

from xla_amp.integrations import _optimizers
from xla_amp.integrations.accelerate import Accelerator

_swap_lock = threading.Lock()


@contextlib.contextmanager
def _trainer_accelerator(factory):
    """``transformers.trainer.Accelerator`` is ``factory`` inside."""
    module = transformers.trainer
    if not hasattr(module, "Accelerator"):
        raise RuntimeError(
            f"transformers {transformers.__version__}: transformers.trainer has no name "
            "'Accelerator' to hand xla_amp's in for; this integration is tested with 5.23")
    with _swap_lock:
        stock = module.Accelerator
        module.Accelerator = factory
        try:
            yield
        finally:
            module.Accelerator = stock


class XLAAMPTrainerMixin:
    """Put before ``transformers.Trainer`` (or a subclass) in the bases.

    Extra keyword arguments: ``xla_amp_policy`` (autocast rules, a name or a
    ``Policy``; default: the device's), ``xla_amp_module_policies``
    (rules for ``xla_amp.module_policies``) and ``xla_amp_fp8`` (an
    ``xla_amp.fp8.Fp8Recipe``: Linear layers in fp8, with ``bf16=True`` or
    ``fp16=True`` for the rest)."""

    def __init__(self, *args, xla_amp_policy=None, xla_amp_module_policies=None,
                 xla_amp_fp8=None, **kwargs):
        self._xla_amp_options = {"policy": xla_amp_policy,
                                 "module_policies": xla_amp_module_policies,
                                 "fp8": xla_amp_fp8}
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        with _trainer_accelerator(functools.partial(Accelerator, **self._xla_amp_options)):
            super().create_accelerator_and_postprocess()

    def training_step(self, *args, **kwargs):
        """The Trainer's step; the loss it returns (what the Trainer adds to
        the running loss it logs) goes through ``logging_nan_inf_filter`` on
        the device. The Trainer skips that filter on XLA, where it would read
        the loss back, so one overflowing step -- the one the GradScaler
        skips -- made the logged loss inf, and NaN for the rest of the run
        (the running loss is reset by subtracting it from itself). The stand-in
        is the one the Trainer's filter adds: the running loss divided by one
        more than the steps since the last log. No transfer."""
        loss = super().training_step(*args, **kwargs)
        running = getattr(self, "_tr_loss", None)
        if (not self.args.logging_nan_inf_filter or not isinstance(running, torch.Tensor)
                or not transformers.trainer.is_torch_xla_available()):
            return loss  # off, or the Trainer filters it itself
        since = 1 + self.state.global_step - self._globalstep_last_logged
        return torch.where(torch.isfinite(loss), loss, running / since)

    def create_optimizer(self, *args, **kwargs):
        built_here = self.optimizer is None  # not one passed in with its scheduler
        optimizer = super().create_optimizer(*args, **kwargs)
        hooks = getattr(self.accelerator, "xla_amp_hooks", None)
        if hooks is not None and built_here and self.optimizer is optimizer:
            self.optimizer = _optimizers.to_syncfree(optimizer, hooks.mode)
        return self.optimizer


class XLAAMPTrainer(XLAAMPTrainerMixin, transformers.Trainer):
    """``transformers.Trainer`` with xla_amp's mixed precision (see the mixin)."""
