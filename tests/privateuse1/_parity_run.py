"""Writes the parity tables as JSON to argv[1]: on torch 2.9 with torch_xla,
{"torch_xla": ..., "standin": ...} (both engines, forward only: the 2.9
stand-in has no device guard, so no autograd); elsewhere {"standin": ...}.
Run in a process of its own: the stand-in renames PrivateUse1 to "tpu"."""
import json
import sys

import torch

import xla_amp
from xla_amp import engines

from tests.support import dtype_parity, standin_tpu

torch.set_grad_enabled(False)
out = {"torch": torch.__version__}
if engines.available("torch_xla"):
    import torch_xla
    device = torch_xla.device()
    out["torch_xla"] = dtype_parity.table(
        lambda p: xla_amp.autocast(device, policy=p), lambda t: t.to(device))
standin_tpu.install()
out["standin"] = dtype_parity.table(
    lambda p: xla_amp.autocast("tpu", policy=p), standin_tpu.to_device)
out["kernels"] = xla_amp.privateuse1.kernels()  # which served the stand-in
if "--reference" in sys.argv:  # the committed torch_xla table (tests/privateuse1/test_parity.py)
    out = {"torch": out["torch"], "torch_xla": out["torch_xla"]}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
