"""The optimizer a mode needs: checked where a framework hands one over,
and, where the framework lets the integration replace it before its first
step (Lightning's ``connect``, the Transformers Trainer's
``create_optimizer``), turned into its ``xla_amp.syncfree`` namesake.

Why the swap: a ``torch.optim`` optimizer under ``GradScaler`` is stepped
through the scaler's masked step (run, then undone on the device), which
costs a copy of every parameter and, for Adam with host-side step counts,
one transfer per step; the syncfree namesake takes ``found_inf`` and skips
inside the step graph. The swap keeps the param-group dicts themselves, so
an LR scheduler that holds them keeps steering the learning rate.
"""
from __future__ import annotations

import functools
import inspect
import weakref

import torch

from xla_amp import syncfree

# torch.optim class -> its syncfree namesake (same constructor arguments)
NAMESAKES = {torch.optim.SGD: syncfree.SGD, torch.optim.Adam: syncfree.Adam,
             torch.optim.AdamW: syncfree.AdamW}


def check(optimizer, mode) -> None:
    """Refuse an optimizer that cannot train ``mode``'s parameters as asked:
    master weights or stochastic rounding need an ``xla_amp.syncfree``
    optimizer whose every param group carries that option."""
    wanted = {k: v for k, v in mode.optimizer_options.items() if v}
    if not wanted:
        return
    flag = ", ".join(f"{k}=True" for k in wanted)
    name = type(optimizer).__name__
    if not getattr(optimizer, "_xla_amp_syncfree", False):
        raise ValueError(
            f"precision='bf16-true' with {flag} needs an xla_amp.syncfree optimizer "
            f"that keeps them; got {type(optimizer).__module__}.{name}: build it as "
            f"xla_amp.syncfree.{name if name in ('SGD', 'Adam', 'AdamW') else 'AdamW'}"
            f"(params, ..., {flag})")
    for gi, group in enumerate(optimizer.param_groups):
        for key in wanted:
            if not group.get(key, False):
                raise ValueError(f"precision='bf16-true' with {flag}: param group {gi} of "
                                 f"{name} has {key}={group.get(key, False)!r}; build the "
                                 f"optimizer with {flag}")


def swappable(optimizer) -> bool:
    """Whether ``to_syncfree`` replaces ``optimizer``."""
    return (not getattr(optimizer, "_xla_amp_syncfree", False)
            and type(optimizer) in NAMESAKES)


def to_syncfree(optimizer, mode):
    """``optimizer`` as the syncfree namesake with ``mode``'s options, or
    ``optimizer`` itself when it already is one or has no namesake (the
    scaler's masked step then serves it; ``check`` refuses the cases that
    cannot work). Refuses an optimizer that has stepped: its state would be
    lost."""
    if not swappable(optimizer):
        return optimizer
    if optimizer.state:
        raise ValueError(f"{type(optimizer).__name__} has state already (it has stepped); "
                         "xla_amp replaces it by its syncfree namesake before the first step")
    options = {k: v for k, v in mode.optimizer_options.items() if v}
    cls = NAMESAKES[type(optimizer)]
    accepted = inspect.signature(cls).parameters
    groups = optimizer.param_groups
    # built from copies (a refusal leaves the original as it was), then
    # given the original dicts back, so an LR scheduler's edits still land
    new = cls([{**g, **options} for g in groups],
              **{k: v for k, v in optimizer.defaults.items() if k in accepted})
    for old, made in zip(groups, new.param_groups):
        old.update(made)
    new.param_groups = groups
    return new


def follow(scheduler, old, new) -> None:
    """Point an LR scheduler of ``old`` at ``new`` and count ``new``'s steps
    as ``torch.optim.lr_scheduler`` counts its optimizer's (it warns about
    schedulers stepped before their optimizer from that count)."""
    if getattr(scheduler, "optimizer", None) is not old:
        return
    scheduler.optimizer = new
    if getattr(new.step, "_wrapped_by_lr_sched", False):
        return
    ref = weakref.ref(new)
    plain = new.step.__func__

    @functools.wraps(plain)
    def step(*args, **kwargs):
        opt = ref()
        opt._opt_called = True
        return plain(opt, *args, **kwargs)

    step._wrapped_by_lr_sched = True
    new.step = step
