"""The precision a policy gives its float32 matmul-like ops (dots and
convolutions whose operands are float32: the fp32 category, and ops the
region leaves in float32), as XLA names it.

    "highest"   IEEE float32 (a TPU: six bf16 passes, ~22 bits; a GPU: no TF32)
    "high"      a GPU: TF32; a TPU: three bf16 passes (~14 bits)
    "default"   the backend's fastest: a TPU one bf16 pass, a GPU TF32

What each built-in policy states (its TOML file's ``fp32_matmul_precision``)
is what its system gives natively: cuda "highest" (CUDA's default is IEEE
fp32, torch.backends.cuda.matmul.fp32_precision == "ieee"), following
PyTorch's TF32 switches where the user turned them on
(``fp32_matmul_precision_follows_torch = true``: allow_tf32 or
fp32_precision "tf32" -> "high"); tpu "default" (torch_xla's documented
default); cpu "highest" (exact).

    effective(policy) = "high"  if policy follows torch and torch allows TF32
                        policy.fp32_matmul_precision otherwise
"""
from __future__ import annotations

import torch

PRECISIONS = ("highest", "high", "default")


def check(value, where: str) -> str:
    """`value` if it is a precision name, else ValueError naming `where`."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ValueError(f"{where}: fp32_matmul_precision must be one of "
                         f"{', '.join(PRECISIONS)}, got {value!r}")
    return value


def torch_allows_tf32() -> bool:
    """Whether the user turned TF32 on for CUDA float32 matmuls in PyTorch."""
    # allow_tf32 = True and set_float32_matmul_precision("high") both set
    # fp32_precision to "tf32" (reading either old API warns on torch 2.9+);
    # "none": the generic torch.backends.fp32_precision decides
    matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    if matmul == "none":
        matmul = getattr(torch.backends, "fp32_precision", "ieee")
    return matmul == "tf32"


def effective(policy) -> str:
    """The precision `policy` gives float32 matmuls now (see the module docstring)."""
    if policy.fp32_matmul_precision_follows_torch and torch_allows_tf32():
        return "high"
    return policy.fp32_matmul_precision
