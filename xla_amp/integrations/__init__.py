"""xla_amp inside the frameworks users train with (docs/integrations.md).

Each framework module imports its framework, so import the one you use:

    lightning.py     XLAAMPPrecision for lightning.Trainer
    fabric.py        XLAAMPPrecision for lightning.Fabric
    accelerate.py    Accelerator: accelerate.Accelerator with xla_amp's
                     autocast, GradScaler and syncfree optimizers
    transformers.py  XLAAMPTrainerMixin / XLAAMPTrainer for transformers.Trainer

They share one core: ``_mode.Mode`` (a precision setting, checked) and
``_hooks.Hooks`` (what happens at each point of a step); ``_optimizers``
checks or swaps the optimizer a mode needs. No integration reads or sets
``XLA_USE_BF16`` / ``XLA_DOWNCAST_BF16``.
"""
