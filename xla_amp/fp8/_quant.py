"""Scaled float8 quantization, the one place it is written.

Tensorwise scales: the dot runs on the float8 values themselves (_dot.py)
and the scales are applied to its float32 result. So::

    quantize(t, s, f8)   = (t.float() * s).clamp(-fmax, fmax).to(f8)
                           (clamped first: float32 -> e4m3fn overflow is NaN)
    unscale(y, f)        = y * f                      y = dot(qa, qb), float32
    factor(sa, sb)       = (1 / sa) * (1 / sb)        a 0-d float32: ONE multiply
                           of the GEMM's result by a runtime scalar, which
                           XLA:GPU's GemmRewriter folds into cuBLASLt's fp8
                           call (it folds one, not two: docs/fp8.md). It flushes
                           to zero only where sa sb > 2**149, i.e. amax_a amax_b
                           < ~3e-40 (subnormal, 16 bits or more, from ~1e-33)
    scale(amax, old)     = fmax / amax / 2**margin  (power_of_two: rounded
                           down to a power of two); a zero or non-finite amax
                           keeps `old`

Everything is tensor ops on the device: no .item(), no branches on values.

Each amax stands behind an optimization barrier (on by default;
`pinned_amax(False)` turns it off): XLA:GPU otherwise fuses the last stage of
the amax reduction into its small consumer (delayed scaling's [3, L]
history), where one thread reduces it serially -- on the MLP of docs/fp8.md
8 fusions a step hold an amax stage without the barrier, none with it (the
figures: docs/benchmarks.md, "fp8 on a GPU"). The values are the same bits
(XLA:CPU drops barriers before fusion). Engines register their barrier by
device type; a device type with none is not pinned.
"""
from __future__ import annotations

import contextlib

import torch

from xla_amp.fp8._recipe import FP8_MAX, Fp8Recipe


# device type -> barrier(t) -> t: the value behind an optimization barrier
_barriers: dict = {}
_pin = True


def register_barrier(device_type: str, barrier) -> None:
    _barriers[device_type] = barrier


def _xla_barrier(t: torch.Tensor) -> torch.Tensor:
    from torch_xla import _XLAC
    _XLAC._xla_optimization_barrier_([t])
    return t


register_barrier("xla", _xla_barrier)


@contextlib.contextmanager
def pinned_amax(on: bool = True):
    """Inside, amaxes traced are pinned (`on`, the default outside too) or
    not (module docstring); never under torch.compile, which cannot trace
    torch_xla's in-place barrier. Benchmarks turn it off to measure it."""
    global _pin
    before, _pin = _pin, on
    try:
        yield
    finally:
        _pin = before


def amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| in float32 (a 0-d tensor). Not ``amax()``: PyTorch/XLA 2.9
    reduces over no dimension when amax gets none (CPU eager reduces over all;
    pinned in tests/engine/test_xla_known_issues.py)."""
    a = t.detach().abs().max().float()
    barrier = _barriers.get(a.device.type) if _pin else None
    if barrier is not None and not torch.compiler.is_compiling():
        a = barrier(a)
    return a


def scale_from_amax(recipe: Fp8Recipe, fp8: torch.dtype, a: torch.Tensor,
                    old: torch.Tensor) -> torch.Tensor:
    fmax = FP8_MAX[fp8]
    s = fmax / (a * (2.0 ** recipe.margin))
    if recipe.power_of_two:
        s = torch.exp2(torch.floor(torch.log2(s)))
    ok = torch.isfinite(a) & (a > 0) & torch.isfinite(s)
    return torch.where(ok, s, old)


def quantize(t: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    fmax = FP8_MAX[fp8]
    return (t.float() * scale).clamp(-fmax, fmax).to(fp8)


def factor(sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    return torch.reciprocal(sa) * torch.reciprocal(sb)


def unscale(y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return y * f


def stats(t: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype):
    """(saturated fraction, underflow fraction) of one quantization: elements
    clamped to ±fmax, and non-zero elements flushed to zero."""
    n = t.numel()
    scaled = t.detach().float().abs() * scale
    saturated = (scaled > FP8_MAX[fp8]).sum().float() / n
    underflow = ((q.float() == 0) & (t.detach() != 0)).sum().float() / n
    return torch.stack([saturated, underflow])
