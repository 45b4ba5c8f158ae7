"""Sync-free optimizers for XLA: ``SGD``, ``Adam``, ``AdamW``.

They take the constructor arguments of their ``torch.optim`` namesakes and
``step(closure=None, found_inf=None)``; a non-zero 0-dim ``found_inf`` on
the parameters' device skips the update inside the XLA graph, so a
``GradScaler`` step never reads anything back to the host.
"""
from xla_amp.syncfree._base import SyncFreeOptimizer
from xla_amp.syncfree.adam import Adam
from xla_amp.syncfree.adamw import AdamW
from xla_amp.syncfree.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "SyncFreeOptimizer"]
