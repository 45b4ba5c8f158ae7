"""A region's policy, recorded where autograd runs code later and made
active again there.

Autograd runs a Function's backward, and torch's activation checkpointing
its recomputed forward, after the region has closed and on autograd's own
device thread, where no xla_amp policy is active (policies are per
thread). torch restores autocast's enabled/dtype/cache itself
(torch.amp.custom_bwd, the checkpoint's recompute); the policy is ours to
restore. Every engine: the one serving the device type (engines.for_device_type).

    recorded = record("xla")        # inside the region: None if no engine runs it
    with replaying(recorded):       # later, anywhere: that policy is active
        ...
"""
from __future__ import annotations

import contextlib

from xla_amp import engines


def engine_for(device_type: str):
    """The engine running `device_type`'s regions (engines.for_device_type),
    or None for a device xla_amp has no engine on."""
    return engines.for_device_type(device_type)


def record(device_type: str):
    """The policy active for `device_type` on this thread now, with the
    engine that runs it; None where there is nothing to restore."""
    engine = engine_for(device_type)
    if engine is None:
        return None
    table = engine.active()
    return None if table is None else (engine, table)


@contextlib.contextmanager
def replaying(recorded):
    """Makes a `record()`ed policy active on this thread for the block (no-op for None)."""
    if recorded is None:
        yield
        return
    engine, table = recorded
    engine.push(table)
    try:
        yield
    finally:
        engine.pop()
