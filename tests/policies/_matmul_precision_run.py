"""One process's float32 matmul precision on the torch_xla engine (run by
tests/policies/test_matmul_precision.py: the setting is process-wide).

    python _matmul_precision_run.py SCENARIO   -> one JSON line on stdout
"""
import json
import os
import re
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
import torch  # noqa: E402
import torch_xla  # noqa: E402
from torch_xla import _XLAC  # noqa: E402

import xla_amp  # noqa: E402

scenario = sys.argv[1]
dev = torch_xla.device()
a = torch.randn(16, 16, device=dev)
out = {}


def precisions(t):
    """operand_precision of every dot/convolution in t's HLO ('' where none)."""
    hlo = _XLAC._get_xla_tensors_hlo([t])
    return [(m.group(1) if m else "") for line in hlo.splitlines()
            if " dot(" in line or " convolution(" in line
            for m in [re.search(r"operand_precision=\{(\w+),", line)]]


if scenario == "tpu-then-cuda":  # a module's "fp32" rule (it states "highest")
    net = torch.nn.Sequential(torch.nn.Linear(16, 16)).to(dev)  # never sets it
    xla_amp.module_policies(net, {"0": "fp32"})
    with xla_amp.autocast(dev, policy="tpu"):
        net(a)
if scenario == "user-set":
    import torch_xla.backends
    torch_xla.backends.set_mat_mul_precision("high")
first, then = {"cuda-then-tpu": ("cuda", "tpu"), "tpu-then-cuda": ("tpu", "cuda"),
               "user-set": ("cuda", "tpu")}[scenario]
with xla_amp.autocast(dev, policy=first):
    low = torch.mm(a, a)                    # lower_precision_fp: f16/bf16 dot
    kept = torch.cdist(a, a) + torch.mm(a.float(), a.float()).softmax(-1)
out["process"] = _XLAC._xla_get_mat_mul_precision()
out["f32_dot"] = precisions(torch.mm(a, a))  # outside a region: the process's
out["low_dot"] = precisions(low)
import warnings  # noqa: E402
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with xla_amp.autocast(dev, policy=then):
        pass
out["warned"] = [str(x.message) for x in w if "states float32 matmul precision" in str(x.message)]
for value in ("highest", "default"):
    try:
        xla_amp.autocast(dev, policy=then, fp32_matmul_precision=value)
        out[f"request_{value}"] = "ok"
    except ValueError as e:
        out[f"request_{value}"] = str(e)
print(json.dumps(out))
