"""Run by tests/sharded/test_sharded_reduce.py (2 virtual XLA:CPU devices, SPMD,
XLA's dumps): one FSDPv2 step of a small MLP in bf16 + master with
reduce_dtype float32 (the default) or bfloat16 (argv[1]); prints the loss
and the dtype and shape of every all-reduce / reduce-scatter in the
partitioned step graph whose shape is a parameter's."""
import dataclasses
import glob
import json
import os
import re
import sys
import tempfile

dump = tempfile.mkdtemp(prefix="sharded-reduce-")
os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "2"
os.environ["XLA_FLAGS"] = (f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                           "--xla_dump_hlo_pass_re=spmd-partitioning")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

xr.use_spmd()
import torch_xla.distributed.spmd as xs  # noqa: E402
from xla_amp import sharded, syncfree  # noqa: E402

mesh = xs.Mesh(np.arange(2), (2,), ("fsdp",))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 32), nn.ReLU(),
                      nn.Linear(32, 4))
shapes = {tuple(p.shape) for p in model.parameters()}
precision = dataclasses.replace(sharded.ShardedPrecision.bf16_master(policy="tpu"),
                                reduce_dtype=getattr(torch, sys.argv[1]))
model = sharded.shard_model(model, precision, mesh=mesh,
                            shard_output=lambda o, m: xs.mark_sharding(o, m, ("fsdp", None)))
opt = syncfree.AdamW(model.parameters(), lr=1e-3, **precision.optimizer_options())
x = torch.randn(8, 16).to("xla")
y = torch.randint(0, 4, (8,)).to("xla")
xs.mark_sharding(x, mesh, ("fsdp", None))
loss = nn.functional.cross_entropy(model(x).float(), y)
loss.backward()
opt.step()
torch_xla.sync()
hlo = open(max(glob.glob(f"{dump}/*after_spmd-partitioning*.txt"), key=os.path.getsize)).read()
sums = set()
for dtype, dims in re.findall(r"= (\w+)\[([0-9,]*)\]\S* (?:all-reduce|reduce-scatter)\(", hlo):
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    if shape in shapes:
        sums.add((dtype, dims))
print(json.dumps({"loss": loss.item(), "param_sums": sorted(sums)}))
