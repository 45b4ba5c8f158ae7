"""Run by tests/sharded/test_sharded_reshard.py in a subprocess: a small MLP (one
LayerNorm, one layer whose 10 rows do not divide over 4 devices) under
FSDPv2 with xla_amp.sharded (bf16 parameters, fp32 master shard, syncfree
AdamW, GradScaler) on an N-device SPMD mesh (N = 1: a 1-device mesh),
the same batches in every run.

    python tests/sharded/_sharded_reshard.py N --steps 15 --save-at 5 --ckpt DIR
    python tests/sharded/_sharded_reshard.py M --steps 15 --load DIR --start 5
    ... --precision amp     the resumed run in fp32 parameters, bf16 compute
                            (the checkpoint converted: its masters become the weights)

Prints one JSON object: the losses of the steps it ran, the loss of the
model before the restore on the first batch after it, what `load` printed
(nothing, it must), the record the checkpoint carries, and each optimizer
state tensor whose sharding is not its parameter's."""
import argparse
import contextlib
import io
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("devices", type=int)
ap.add_argument("--steps", type=int, default=15)
ap.add_argument("--save-at", type=int, default=0)
ap.add_argument("--ckpt", default="")
ap.add_argument("--load", default="")
ap.add_argument("--start", type=int, default=0)
ap.add_argument("--precision", default="bf16_master", choices=["bf16_master", "amp"])
args = ap.parse_args()
os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = str(args.devices)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

xr.use_spmd()
import torch_xla.distributed.spmd as xs  # noqa: E402
import xla_amp  # noqa: E402
from xla_amp import sharded, syncfree  # noqa: E402
from xla_amp.syncfree import _sharding  # noqa: E402

BATCH = 8
n = xr.global_runtime_device_count()
assert n == args.devices, (n, args.devices)
mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10))
precision = getattr(sharded.ShardedPrecision, args.precision)()
model = sharded.shard_model(net, precision, mesh=mesh)
opt = syncfree.AdamW(model.parameters(), lr=1e-2, **precision.optimizer_options())
scaler = xla_amp.GradScaler()
out = {"devices": n, "specs": sorted({_sharding.spec(p) for p in model.parameters()})}


def batch(k):
    g = torch.Generator().manual_seed(1000 + k)
    x = torch.randn(BATCH, 12, generator=g)
    y = x[:, :10].argmax(1)  # a rule the model learns
    x, y = x.to("xla"), y.to("xla")
    xs.mark_sharding(x, mesh, ("fsdp", None))
    xs.mark_sharding(y, mesh, ("fsdp",))
    return x, y


k = 0
if args.load:
    with torch.no_grad():  # the model not restored, on the first batch after the restore
        x, y = batch(args.start + 1)
        out["fresh_loss"] = float(F.cross_entropy(model(x).float(), y).cpu())
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        sharded.load(args.load, model=model, optimizer=opt, scaler=scaler)
    out["load_printed"] = said.getvalue()
    k = args.start
losses = []
while k < args.steps:
    k += 1
    x, y = batch(k)
    opt.zero_grad()
    loss = F.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()
    losses.append(float(loss.detach().cpu()))
    if k == args.save_at:
        sharded.save(args.ckpt, model=model, optimizer=opt, scaler=scaler)
        with open(os.path.join(sharded.versions(args.ckpt)[0], "xla_amp_sharded.json")) as f:
            out["record"] = json.load(f)
out["losses"] = losses
out["scale"] = scaler.get_scale()
out["sharding_mismatches"] = _sharding.mismatches(opt)
out["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
print(json.dumps(out))
sys.stdout.flush()
