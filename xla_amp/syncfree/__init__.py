"""Sync-free optimizers for XLA: ``SGD``, ``Adam``, ``AdamW``.

They take the constructor arguments of their ``torch.optim`` namesakes and
``step(closure=None, found_inf=None)``; a non-zero 0-dim ``found_inf`` on
the parameters' device skips the update inside the XLA graph, so a
``GradScaler`` step never reads anything back to the host.
"""
from xla_amp import engines

engines.require("torch_xla", "xla_amp's native engine (xla_amp._C)")  # the XLA step

from xla_amp.syncfree._base import SyncFreeOptimizer  # noqa: E402
from xla_amp.syncfree.adam import Adam  # noqa: E402
from xla_amp.syncfree.adamw import AdamW  # noqa: E402
from xla_amp.syncfree.sgd import SGD  # noqa: E402

__all__ = ["SGD", "Adam", "AdamW", "SyncFreeOptimizer"]
