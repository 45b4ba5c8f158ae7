"""Shared by the torchax tests: the environment, moving tensors into it, and
what torchax 0.0.13 itself cannot run (pinned: each entry is checked to
still fail without autocast, so a torchax that learns the op shows up)."""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torchax  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402,F401

ENV = torchax.default_env()


def to_jax(tensors):
    with ENV:
        return [t.to("jax") for t in tensors]


# Op cases torchax 0.0.13 cannot run in plain float32, autocast or not:
# no lowering (torchax raises OperatorNotFound), or its lowering fails.
# key -> the error torchax gives
TORCHAX_CANNOT_RUN = {
    "aten::conv_tbc": "OperatorNotFound",
    "aten::ctc_loss.Tensor": "OperatorNotFound",
    "aten::ctc_loss.IntList": "OperatorNotFound",
    "aten::_convolution.deprecated": "OperatorNotFound",
    "aten::_convolution": "OperatorNotFound",
    "aten::frobenius_norm": "AttributeError",
    "aten::_upsample_bilinear2d_aa": "TypeError",
    "aten::_upsample_bicubic2d_aa": "TypeError",
    "aten::mkldnn_rnn_layer": "OperatorNotFound",
    "aten::_native_multi_head_attention": "OperatorNotFound",
    "aten::_addmm_activation": "OperatorNotFound",
    "aten::ormqr": "OperatorNotFound",
    "aten::fake_quantize_per_tensor_affine": "OperatorNotFound",
    "aten::geqrf": "OperatorNotFound",
    "aten::fractional_max_pool2d": "OperatorNotFound",
    "aten::fractional_max_pool3d": "OperatorNotFound",
    "aten::adaptive_max_pool3d": "OperatorNotFound",
    "aten::poisson": "OperatorNotFound",
    "aten::searchsorted.Scalar": "OperatorNotFound",
    "aten::vander": "OperatorNotFound",
    "aten::adaptive_max_pool1d": "OperatorNotFound",
    "aten::adaptive_max_pool2d": "OperatorNotFound",
}

# JAX runs with 64-bit types off (its default, and torchax's): int64 results
# come back as int32. float64 never reaches autocast (not eligible).
JAX_DTYPE = {torch.int64: torch.int32}

# Composite (CompositeImplicitAutograd) aten overloads called directly as
# torch.ops.aten.<op>.<overload>(...): the call goes to the dispatcher, which
# decomposes it before torchax's dispatch mode sees anything, so autocast
# never sees the op itself (the torch_xla engine's AutocastXLA key sits above
# the decomposition). The Python API of the same ops (torch.linalg.matrix_rank)
# is cast. key -> what happens instead (the bf16 input reaches LAPACK).
DIRECT_COMPOSITE_CALLS = {
    "aten::linalg_matrix_rank.tol_tensor": "NotImplementedError",
    "aten::linalg_matrix_rank.atol_rtol_tensor": "RuntimeError",
}

# Output dtypes that differ from the torch_xla engine's, with the reason
# (docs/torchax.md, "Parity"): (policy, case key, input dtype) -> why.
KNOWN_DIFFERENCES = {
    (policy, "aten::pinverse", torch.float32): (
        "torchax lowers linalg_pinv in one piece of JAX (float32 through), while "
        "PyTorch's kernel for it calls matmul, which this policy lists: torch_xla "
        "returns bfloat16")
    for policy in ("tpu", "cuda")
}
# the cpu policy's [decompose]: torch_xla runs PyTorch's einsum (a bmm,
# cast); torchax lowers aten::einsum in one piece of JAX (jnp.einsum, float32
# through) and running PyTorch's decomposition there reaches ops torchax has
# no lowering for (aten::mT): torchax keeps its own, as before
KNOWN_DIFFERENCES[("cpu", "aten::einsum", torch.float32)] = (
    "torch_xla decomposes einsum under the cpu rules (bfloat16, as torch.autocast('cpu')); "
    "torchax lowers it whole (float32)")
