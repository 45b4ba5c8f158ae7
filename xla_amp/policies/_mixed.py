"""A policy file's ``[fp32_compute]``: mixed-precision inputs as the
policy's system computes them.

PyTorch's CPU kernels for layer and group norm take a bfloat16/float16
input with float32 weight and bias (aten/src/ATen/native/cpu/
layer_norm_kernel.cpp, group_norm_kernel.cpp, "mixed type"): they compute
in float32 and return the input's type. Under torch.autocast("cpu") that
mix is the common case: a cast matmul feeds a norm whose parameters stay
float32. torch_xla 2.9 promotes the same call and returns float32, with
autocast or without, so under the cpu rules every activation after a norm
stayed float32 on XLA where the CPU's is bfloat16. A policy whose system
computes an op this way lists it::

    [fp32_compute]
    "aten::layer_norm" = "mixed: layer_norm (the CPU's mixed-type kernel)"

and the engine applies the fp32_compute adaptation to it (csrc/autocast/
autocast_kernel.h): inputs of one dtype run untouched; a low-precision input
with float32 parameters computes in float32 and its first output comes back
in the input's type; any other mix raises, naming the arguments (the CPU
kernel refuses it too). Checked when the file loads (file:line): the op
exists and is in no category of the policy (a category would win).
"""
from __future__ import annotations

from xla_amp.policies._adaptations import read_policy_section

SECTION = "fp32_compute"


def read(path, text: str, data: dict, categories: dict) -> dict[str, str]:
    """op -> "fp32_compute" for the file's [fp32_compute] table (the policy's
    adaptations); ValueError naming file:line for an unknown op, a missing
    citation or an op the file also puts in a category."""
    def check(op, why):
        if not isinstance(why, str) or not why.strip():
            return f"{op} needs a citation (\"source: what the system does\")"
        return None
    return read_policy_section(path, text, data, SECTION, categories, check)
