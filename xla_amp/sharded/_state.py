"""`check_sharding`: every optimizer state tensor carries its parameter's
sharding (the sync-free optimizers give it when the state is made or
loaded: ``xla_amp/syncfree/_sharding.py``)."""
from __future__ import annotations

import torch

from xla_amp._param_walk import check_optimizer
from xla_amp.syncfree import _sharding


def check_sharding(optimizer: torch.optim.Optimizer) -> None:
    """Raise ``ValueError`` listing each state tensor of a parameter's shape
    whose XLA sharding is not its parameter's (a replicated master or
    moment next to a sharded parameter costs N times its shard's memory).
    Call between steps, after the first step made the state."""
    check_optimizer(optimizer, "check_sharding")
    bad = _sharding.mismatches(optimizer)
    if bad:
        raise ValueError("check_sharding: state not sharded as its parameter:\n  "
                         + "\n  ".join(bad))
