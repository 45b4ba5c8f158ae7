"""SDPA on the stand-in PrivateUse1 device under the tpu and cuda rules, as
JSON on stdout: per policy and mask form, the output dtype, the dtypes the
device saw for each matmul and softmax (forward, and backward where the
torch gives the stand-in autograd: 2.11+), and whether the output equals
the hand-written control bit for bit. A process of its own: the stand-in
renames PrivateUse1 "tpu"."""
import json
import sys

sys.modules.setdefault("torch_xla", None)  # the PrivateUse1 engine alone

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xla_amp  # noqa: E402
import xla_amp.privateuse1  # noqa: E402

from tests.support import standin_tpu  # noqa: E402
from tests.support.attention_reference import case, reference  # noqa: E402

MATMULS = {"aten::bmm", "aten::mm", "aten::baddbmm", "aten::addmm", "aten::_safe_softmax",
           "aten::_softmax", "aten::_softmax_backward_data"}
LOW = {"tpu": torch.bfloat16, "cuda": torch.float16}
standin_tpu.install()
xla_amp.privateuse1.install()
AUTOGRAD = hasattr(torch.utils.backend_registration, "_setup_privateuseone_for_python_backend")
seen: list = []
_real = standin_tpu._run_on_cpu


def _logged(func, args, kwargs):  # the device's own dispatch: what reaches the CPU below
    if func._schema.name in MATMULS:
        seen.append((func._schema.name, [str(a.dtype).replace("torch.", "") for a in args
                                         if isinstance(a, torch.Tensor)]))
    return _real(func, args, kwargs)


standin_tpu._run_on_cpu = _logged
out = {"kernels": xla_amp.privateuse1.kernels(), "autograd": AUTOGRAD, "runs": {}}
for policy in ("tpu", "cuda"):
    for form in ("causal", "bool_mask", "additive_mask", "gqa"):
        *cpu, kw, ref = case(form, 8, 16)
        if "attn_mask" in kw:
            kw = {"attn_mask": standin_tpu.to_device(kw["attn_mask"])}
        q, k, v = (standin_tpu.to_device(t).requires_grad_(AUTOGRAD) for t in cpu)
        seen.clear()
        with xla_amp.autocast("tpu", policy=policy):
            o = F.scaled_dot_product_attention(q, k, v, **kw)
        forward = list(seen)
        seen.clear()
        if AUTOGRAD:
            o.float().sum().backward()
        want = reference(*cpu, LOW[policy], **ref)
        got = o.detach().cpu()
        out["runs"][f"{policy} {form}"] = {
            "dtype": str(o.dtype).replace("torch.", ""), "forward": forward,
            "backward": list(seen), "equal": bool(torch.equal(got, want))}
print(json.dumps(out))
