"""Run by tests/sharded/test_sharded_api.py in a subprocess (2 virtual XLA:CPU
devices, SPMD): optimizer state follows its parameter's sharding where it
is made and where it is loaded, and check_sharding names a state tensor
that does not. Prints one JSON object."""
import json
import os

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["CPU_NUM_DEVICES"] = "2"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

xr.use_spmd()
import torch_xla.distributed.spmd as xs  # noqa: E402
import xla_amp  # noqa: E402
from xla_amp import sharded, syncfree  # noqa: E402
from xla_amp.syncfree._sharding import spec  # noqa: E402

mesh = xs.Mesh(np.arange(2), (2,), ("fsdp",))
torch.manual_seed(0)
precision = sharded.ShardedPrecision.bf16_master(policy="tpu")
model = sharded.shard_model(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)), precision,
                            mesh=mesh, shard_output=lambda o, m: xs.mark_sharding(o, m, ("fsdp", None)))
opt = syncfree.AdamW(model.parameters(), lr=1e-2, **precision.optimizer_options())
x = torch.randn(4, 8).to("xla")
xs.mark_sharding(x, mesh, ("fsdp", None))
out = {"param_specs": [spec(p) for p in model.parameters()],
       "param_dtypes": sorted({str(p.dtype) for p in model.parameters()})}
model(x).float().sum().backward()
opt.step()
# state made in the step, before the graph runs: annotated already
out["fresh"] = sharded._state._sharding.mismatches(opt)
torch_xla.sync()
out["after_step"] = sharded._state._sharding.mismatches(opt)
sd = opt.state_dict()
sd_cpu = {**sd, "state": {k: {n: v.cpu() if torch.is_tensor(v) else v for n, v in st.items()}
                          for k, st in sd["state"].items()}}
opt.load_state_dict(sd_cpu)  # from host tensors: made on the device, then resharded
out["after_load"] = sharded._state._sharding.mismatches(opt)
p0 = next(iter(model.parameters()))
st = opt.state[p0]
st["exp_avg"] = st["exp_avg"].cpu().to("xla")  # replicated: the mistake check_sharding names
try:
    sharded.check_sharding(opt)
    out["check"] = "passed"
except ValueError as e:
    out["check"] = str(e)
print(json.dumps(out))
