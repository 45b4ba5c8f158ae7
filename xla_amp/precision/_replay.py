"""A region's policy, recorded where autograd runs code later and made
active again there.

Autograd runs a Function's backward, and torch's activation checkpointing
its recomputed forward, after the region has closed and on autograd's own
device thread, where no xla_amp policy is active (policies are per
thread). torch restores autocast's enabled/dtype/cache itself
(torch.amp.custom_bwd, the checkpoint's recompute); the policy is ours to
restore. Both engines: device type "xla" (torch_xla's) and the PrivateUse1
device's name (TorchTPU's "tpu").

    recorded = record("xla")        # inside the region: None if no engine runs it
    with replaying(recorded):       # later, anywhere: that policy is active
        ...
"""
from __future__ import annotations

import contextlib

import torch


def engine_for(device_type: str):
    """(active(), push(table), pop()) of the engine running `device_type`'s
    regions, or None for a device xla_amp has no engine on."""
    if device_type == "xla":
        from xla_amp import _engine
        return _engine.active_policy, _engine.push_compiled, _engine.pop
    if device_type == torch._C._get_privateuse1_backend_name() != "privateuseone":
        from xla_amp.privateuse1 import _kernels
        return _kernels.active_table, _kernels.push, _kernels.pop
    return None


def record(device_type: str):
    """The policy active for `device_type` on this thread now, with the
    engine that runs it; None where there is nothing to restore."""
    engine = engine_for(device_type)
    if engine is None:
        return None
    table = engine[0]()
    return None if table is None else (engine, table)


@contextlib.contextmanager
def replaying(recorded):
    """Makes a `record()`ed policy active on this thread for the block (no-op for None)."""
    if recorded is None:
        yield
        return
    (_, push, pop), table = recorded
    push(table)
    try:
        yield
    finally:
        pop()
