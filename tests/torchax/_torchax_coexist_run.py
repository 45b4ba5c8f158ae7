"""Prints the HLO and the result bits of an xla_amp step on torch_xla,
optionally after importing xla_amp.torchax and running a torchax region in
the same process (argv[1] == "with-torchax"). tests/torchax/test_torchax_coexist.py."""
import hashlib
import json
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402

if sys.argv[1] == "with-torchax":
    import torchax

    import xla_amp.torchax as xt
    env = torchax.default_env()
    with env, xt.autocast("jax", policy="cuda"):
        torch.nn.functional.linear(torch.randn(2, 3, device="jax"), torch.randn(4, 3, device="jax"))

device = torch_xla.device()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4),
                      nn.Softmax(-1)).to(device)
mha = nn.MultiheadAttention(16, 2, batch_first=True).to(device).eval()
x = torch.randn(4, 8).to(device)
rows = {}
for policy in ("tpu", "cuda", "cpu"):
    with xla_amp.autocast(device, policy=policy):
        h = model[:3](x)
        a, _ = mha(h[None], h[None], h[None])
        out = model[3:](a[0])
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([out])
    rows[policy] = [hashlib.sha256(hlo.encode()).hexdigest(), out.dtype.__repr__(),
                    hashlib.sha256(out.detach().cpu().float().numpy().tobytes()).hexdigest()]
print(json.dumps({"rows": rows, "fastpath": torch.backends.mha.get_fastpath_enabled()}))
