"""The dot on float8 operands: one per engine, and when a shape can take it.

On an H100 (2026-11-26, jax 0.11.2's XLA) a dot whose operands were
``convert(f8 -> f32) * scale`` compiled to a plain f32 GEMM as soon as the
scales were runtime values: XLA folded the f32 -> f8 -> f32 round trip away.
What became cuBLASLt's fp8 GEMM (``__cublas$lt$matmul$f8``) with runtime
scales was a dot *on the float8 values*, with a float32 result, the scales
applied to that result. So every converted matmul is::

    dot(a_f8, b_f8, contract=(i, j)) -> float32        (this module)
    * ((1 / s_a) * (1 / s_b))                          (_quant.unscale)

or, with Fp8Recipe(gemm_output="bfloat16") where the result goes to a
bfloat16 tensor, ``dot(...) -> bfloat16``, upcast for the same scaling.

`fast` (the recipe's fast_accumulation for this GEMM) is the dot's precision:
XLA:GPU gives a float8 dot at DEFAULT precision cuBLASLt's fast accumulation
and one at HIGHEST the split accumulator (partial sums promoted to float32).

Engines::

    torch_xla   torch.ops.xla_amp.fp8_dot -> torch_xla._XLAC._xla_dot_general
                (preferred_element_type=float32): the HLO dot has f8 operands
                and an f32 result; a custom op, so torch.compile traces it.
                2.9 refuses a per-dot precision_config: the dot carries the
                process's (torch_xla.backends.set_mat_mul_precision), and
                `fast` cannot be honoured per GEMM (docs/fp8.md)
    torchax     register_dot("jax", fn): jax.lax.dot_general on the float8
                arrays, preferred_element_type=float32, precision DEFAULT if
                fast else HIGHEST (xla_amp.torchax._fp8)
    elsewhere   the same contraction on the float8 values widened to float32
                (exact: a product of two float8 values is exact in float32)

    eligible(m, k, n, pairs, device) -> None | why
        every GEMM dimension a multiple of 16 (cuBLASLt's fp8 GEMMs and
        torch._scaled_mm need it), no e5m2 x e5m2 pair, and the backend able
        to dot each pair (register_dot's `supports`); else the layer computes
        that call in the region's dtype (Fp8Linear)
"""
from __future__ import annotations

import torch

from xla_amp.fp8._recipe import ALIGN

# device type -> (dot(a, b, ca, cb), supports(dtype_a, dtype_b) -> bool)
_dots: dict = {}


def register_dot(device_type: str, dot, supports=None) -> None:
    """`dot(a, b, ca, cb, fast, out)`: the `out`-typed (float32 or bfloat16)
    result of contracting a's dim ca with b's dim cb, on the float8 tensors
    themselves, accumulating fast or not;
    `supports(da, db)`: whether the backend can compile such a dot (None:
    always)."""
    _dots[device_type] = (dot, supports)


def _contracted_shape(a, b, ca: int, cb: int) -> list[int]:
    return ([s for i, s in enumerate(a.shape) if i != ca]
            + [s for i, s in enumerate(b.shape) if i != cb])


@torch.library.custom_op("xla_amp::fp8_dot", mutates_args=())
def fp8_dot(a: torch.Tensor, b: torch.Tensor, ca: int, cb: int,
            out: torch.dtype = torch.float32) -> torch.Tensor:
    """a · b contracting a's dim `ca` with b's dim `cb`, an `out` result."""
    if a.device.type == "xla":
        from torch_xla import _XLAC
        return _XLAC._xla_dot_general(a, b, (([ca], [cb]), ([], [])),
                                      preferred_element_type=out)
    return torch.tensordot(a.float(), b.float(), dims=([ca], [cb])).to(out)


@fp8_dot.register_fake
def _(a, b, ca, cb, out=torch.float32):
    return a.new_empty(_contracted_shape(a, b, ca, cb), dtype=out)


def dot(a: torch.Tensor, b: torch.Tensor, ca: int, cb: int, fast: bool,
        out: torch.dtype = torch.float32) -> torch.Tensor:
    """The engine's dot on float8 operands (see the module docstring)."""
    entry = _dots.get(a.device.type)
    if entry is not None:
        return entry[0](a, b, ca, cb, fast, out)
    return torch.ops.xla_amp.fp8_dot(a, b, ca, cb, out)


def eligible(m: int, k: int, n: int, pairs, device_type: str) -> str | None:
    """None if the three GEMMs of an (m x k) · (k x n) layer can run on float8
    operands, with `pairs` the (lhs, rhs) float8 types of each; else why not."""
    odd = [f"{name}={v}" for name, v in (("tokens", m), ("in", k), ("out", n)) if v % ALIGN]
    if odd:
        return (f"{', '.join(odd)}: fp8 GEMMs need every dimension to be a multiple of "
                f"{ALIGN}")
    for da, db in pairs:
        if da == db == torch.float8_e5m2:
            return "e5m2 x e5m2: no fp8 GEMM takes two e5m2 operands"
    entry = _dots.get(device_type)
    supports = entry[1] if entry is not None else None
    for da, db in pairs:
        if supports is not None and not supports(da, db):
            return f"the {device_type} backend cannot dot {_name(da)} x {_name(db)}"
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
