"""Run by tests/sharded/test_sharded_checkpoint_checks.py in a subprocess (2 virtual
XLA:CPU devices, SPMD): checkpoints of a sharded [16, 4] float32, [8, 4]
float32 and [16, 4] bfloat16 weight loaded into sharded weights of another
size or dtype, with torch_xla's SPMDLoadPlanner (what happens, upstream)
and with xla_amp.sharded.load (another size refused, the weight
unchanged; bf16 into float32 widened exactly, as its training record
allows, and still sharded).
Prints one JSON object."""
import json
import os
import sys
import tempfile

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "2"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp
# per_thread_copy_ahead=0 on every writer: torch_xla's mark_sharding imports
# torchax when it is installed, which names PrivateUse1 "jax" and breaks DCP's
# copy-ahead loader (tests/torchax/test_torchax_coexist.py pins it)  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

xr.use_spmd()
import torch_xla.distributed.spmd as xs  # noqa: E402
from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner  # noqa: E402
from xla_amp import sharded  # noqa: E402

mesh = xs.Mesh(np.arange(2), (2,), ("fsdp",))
root = tempfile.mkdtemp()


def layer(rows, seed, dtype=torch.float32):
    torch.manual_seed(seed)
    m = nn.Linear(4, rows, bias=False).to(dtype).to("xla")
    xs.mark_sharding(m.weight, mesh, ("fsdp", None))
    return m


def saved(name, rows, dtype=torch.float32):
    m = layer(rows, 0, dtype)
    path = os.path.join(root, name)
    sharded.save(path, model=m)
    return path, m.weight.detach().cpu()


cases = {"narrow_from_wide": (saved("wide", 16), 8, torch.float32),
         "wide_from_narrow": (saved("narrow", 8), 16, torch.float32),
         "fp32_from_bf16": (saved("bf16", 16, torch.bfloat16), 16, torch.float32)}
out = {"upstream": {}, "ours": {}}
unchanged = True
for case, ((path, want), rows, dtype) in cases.items():
    m = layer(rows, 1, dtype)
    before = m.weight.detach().cpu().clone()
    dcp.load({"model": m.state_dict()},
             storage_reader=dcp.FileSystemReader(sharded.versions(path)[0]),
             planner=SPMDLoadPlanner(), no_dist=True)
    torch_xla.sync()
    got = m.weight.detach().cpu()
    n = min(rows, want.shape[0])
    out["upstream"][case] = ("left as it was" if torch.equal(got, before)
                             else "loaded the leading rows" if torch.equal(got[:n], want[:n])
                             and got.shape != want.shape
                             else "converted" if got.dtype != want.dtype
                             and torch.equal(got, want.to(got.dtype)) else "other")
    m = layer(rows, 1, dtype)
    before = m.weight.detach().cpu().clone()
    try:
        sharded.load(path, model=m)
        got = m.weight.detach().cpu()
        exact = got.dtype != want.dtype and torch.equal(got, want.to(got.dtype))
        spec = torch_xla._XLAC._get_xla_sharding_spec
        kept = spec(m.weight) == spec(layer(rows, 1, dtype).weight)   # still sharded
        out["ours"][case] = "converted exactly, sharded" if exact and kept else "loaded"
    except ValueError as e:
        out["ours"][case] = str(e).replace(path, "CKPT")
        unchanged &= torch.equal(m.weight.detach().cpu(), before)
out["ours"]["unchanged"] = unchanged
cpu = os.path.join(root, "cpu")  # plain DCP, unsharded CPU tensors: compared
dcp.save({"model": nn.Linear(4, 16, bias=False).state_dict()},
         storage_writer=dcp.FileSystemWriter(cpu, per_thread_copy_ahead=0), no_dist=True)
try:
    dcp.load({"model": nn.Linear(4, 8, bias=False).state_dict()},
             storage_reader=dcp.FileSystemReader(cpu), no_dist=True)
    out["upstream"]["plain_dcp_cpu"] = "loaded"
except BaseException as e:  # CheckpointException is a BaseException
    out["upstream"]["plain_dcp_cpu"] = "refused: " + str(e).strip().splitlines()[-1]
print(json.dumps(out))
sys.stdout.flush()
