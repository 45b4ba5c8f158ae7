"""Mixed precision for sharded models: PyTorch/XLA's SPMD engine (FSDPv2,
``mark_sharding`` meshes) with the precision choices of one device.

    import torch_xla.runtime as xr; xr.use_spmd()
    from xla_amp import sharded, syncfree
    precision = sharded.ShardedPrecision.bf16_master()
    model = sharded.shard_model(model, precision, mesh=mesh)          # FSDPv2
    optimizer = syncfree.AdamW(model.parameters(), lr=1e-4, **precision.optimizer_options())
    sharded.check_sharding(optimizer)            # after a step: state sharded as its param
    sharded.save(path, model=model, optimizer=optimizer, scaler=scaler)
    sharded.load(path, model=model, optimizer=optimizer, scaler=scaler)  # any mesh
    sharded.save(path, ..., keep=3); sharded.versions(path)   # the 3 newest, newest first
    sharded.save(path, ..., extra={"step": 7}); sharded.read_extra(path)   # plain JSON

``save`` / ``load`` / ``versions`` are the sharded format of
``xla_amp.checkpoint`` (xla_amp/checkpoint/sharded.py: the path's lock, a
new version published by one rename, checksums, the training record,
data-only reading, every check before anything changes);
``shard_model``, ``save`` and ``load`` refuse a launch whose process count
is not the runtime's (_topology).

``ShardedPrecision.cast`` (called by ``shard_model``) also gives the modules
that compute weight gradients a backward in ``reduce_dtype`` (_reduce.py).
docs/sharded.md has the recipes (FSDPv2, a hand-sharded model, a TPU pod).
"""
from xla_amp.sharded._precision import ShardedPrecision
from xla_amp.sharded._model import shard_model
from xla_amp.sharded._state import check_sharding
from xla_amp.sharded._checkpoint import load, save
from xla_amp.checkpoint.sharded import read_extra, versions

__all__ = ["ShardedPrecision", "shard_model", "check_sharding", "save", "load", "versions",
           "read_extra"]
