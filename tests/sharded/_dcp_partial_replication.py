"""Run by tests/sharded/test_sharded_api.py in a subprocess (4 virtual XLA:CPU
devices, SPMD): a tensor sharded over one mesh axis and replicated over the
other, saved with PyTorch/XLA's SPMDSavePlanner and with xla_amp.sharded's
planner. Prints one JSON object: which keys each checkpoint holds, and
whether xla_amp.sharded.load brings the tensor back."""
import json
import os
import sys
import tempfile

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "4"

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
from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner  # noqa: E402
from xla_amp import sharded  # noqa: E402
from xla_amp.syncfree._sharding import spec  # noqa: E402

mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "fsdp"))
torch.manual_seed(0)
model = nn.Linear(4, 8, bias=False).to("xla")
xs.mark_sharding(model.weight, mesh, ("fsdp", None))  # replicated over "data"
want = model.weight.detach().cpu().clone()
out = {"spec": spec(model.weight)}
root = tempfile.mkdtemp()


def keys(path):
    return sorted(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)


up = os.path.join(root, "upstream")
dcp.save({"model": model.state_dict()},
         storage_writer=dcp.FileSystemWriter(up, per_thread_copy_ahead=0),
         planner=SPMDSavePlanner(), no_dist=True)
out["upstream_keys"] = keys(up)
ours = os.path.join(root, "ours")
sharded.save(ours, model=model)
out["ours_keys"] = keys(sharded.versions(ours)[0])
with torch.no_grad():
    model.weight.zero_()
torch_xla.sync()
sharded.load(ours, model=model)
out["restored"] = torch.equal(model.weight.detach().cpu(), want)
out["restored_spec"] = spec(model.weight)
print(json.dumps(out))
sys.stdout.flush()
