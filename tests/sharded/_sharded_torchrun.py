"""Run by tests/sharded/test_sharded_topology.py under ``torchrun --nproc_per_node=2``
(XLA:CPU, CPU_NUM_DEVICES=2, SPMD): what each process's runtime counts,
and what shard_model, save and load say -- first with torchrun's
WORLD_SIZE, then with torch.distributed (gloo) initialised and WORLD_SIZE
unset. Writes one JSON object to OUTDIR/rank<RANK>.json.

    torchrun --nproc_per_node=2 --standalone tests/sharded/_sharded_torchrun.py OUTDIR"""
import json
import os
import sys

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "2"

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

xr.use_spmd()
from xla_amp import sharded  # noqa: E402

rank = int(os.environ["RANK"])
path = os.path.join(sys.argv[1], "ckpt")  # the same directory for both processes
model = nn.Linear(4, 4).to("xla")
out = {"rank": rank, "world_size_env": os.environ.get("WORLD_SIZE"),
       "process_count": xr.process_count(), "devices": xr.global_runtime_device_count()}


def said(call) -> str:
    try:
        call()
        return "accepted"
    except RuntimeError as e:
        return str(e)


def calls():
    return {"shard_model": said(lambda: sharded.shard_model(nn.Linear(4, 4))),
            "save": said(lambda: sharded.save(path, model=model)),
            "load": said(lambda: sharded.load(path, model=model))}


out["env"] = calls()
dist.init_process_group("gloo")  # env:// from torchrun
out["dist_world_size"] = dist.get_world_size()
os.environ.pop("WORLD_SIZE")
out["dist"] = calls()
dist.destroy_process_group()
out["wrote"] = sorted(os.listdir(sys.argv[1]))
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
