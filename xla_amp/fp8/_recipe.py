"""`Fp8Recipe`: how fp8 layers scale, in one frozen object.

    Fp8Recipe()                                   # dynamic, HYBRID
    Fp8Recipe(scaling="delayed", amax_history_len=16, margin=0)
    dataclasses.replace(recipe, format="e4m3", power_of_two=True)

What each field decides (per fp8 matmul operand: input x, weight w,
output gradient g)::

    format:        "hybrid": x, w in float8_e4m3fn, g in float8_e5m2
                   "e4m3":   all three in float8_e4m3fn
    scaling:       "dynamic": scale from this call's amax (tensorwise)
                   "delayed": scale from the amax history, which rolls once
                              per optimizer step (update_scales): the running
                              max over the micro-batches since the last roll
    scale:         fmax / amax / 2**margin (2**floor(log2(.)) with
                   power_of_two); a zero or non-finite amax keeps the old scale
    amax_compute:  "max" of the history or its "most_recent" entry
    fast_accumulation:
                   which fp8 GEMMs may accumulate imprecisely on the GPU
                   (cuBLASLt's FAST_ACCUM: Hopper's fp8 tensor cores then
                   never promote partial sums to float32): "forward" (the
                   forward GEMM only; both gradients' GEMMs, whose sums run
                   over the tokens, keep the split accumulator), "all" or
                   "none". A dot carries it as its precision: DEFAULT is
                   fast, HIGHEST is not (XLA:GPU's rule); other backends
                   compute both alike
    gemm_output:   the result type of an fp8 GEMM whose destination is
                   bfloat16 (the forward's output in a bf16 region or on a
                   bf16 input, a bf16 input's or weight's gradient):
                   "float32" or "bfloat16" (the GEMM writes half the bytes;
                   the scales, bias and cast then read bfloat16: one more
                   rounding, none with power_of_two scales). The scales are
                   applied in float32 either way. A float16 or float32
                   destination keeps "float32" (an unscaled float16 GEMM
                   result overflows)
    keep:          modules left in high precision: nn.Module classes or
                   globs on qualified names (fnmatch), e.g. ("lm_head", "0")

Checked when made (ValueError naming the field).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

FORMATS = ("hybrid", "e4m3")
SCALINGS = ("dynamic", "delayed")
AMAX_COMPUTE = ("max", "most_recent")
FAST_ACCUMULATION = ("forward", "all", "none")
GEMM_OUTPUTS = ("float32", "bfloat16")
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
ALIGN = 16  # fp8 GEMMs (cuBLASLt) need both matrix dimensions to be multiples of 16


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
    """See the module docstring."""

    scaling: str = "dynamic"
    format: str = "hybrid"
    amax_history_len: int = 16
    amax_compute: str = "max"
    margin: int = 0
    power_of_two: bool = False
    keep: tuple = ()
    fast_accumulation: str = "forward"
    gemm_output: str = "float32"

    def __post_init__(self):
        for name, allowed in (("scaling", SCALINGS), ("format", FORMATS),
                              ("amax_compute", AMAX_COMPUTE),
                              ("fast_accumulation", FAST_ACCUMULATION),
                              ("gemm_output", GEMM_OUTPUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Fp8Recipe: {name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        for name in ("amax_history_len", "margin"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"Fp8Recipe: {name} must be an int, got {value!r}")
        if self.amax_history_len < 1:
            raise ValueError(f"Fp8Recipe: amax_history_len must be >= 1, got "
                             f"{self.amax_history_len}")
        if self.margin < 0:
            raise ValueError(f"Fp8Recipe: margin must be >= 0, got {self.margin}")
        if not isinstance(self.power_of_two, bool):
            raise ValueError(f"Fp8Recipe: power_of_two must be a bool, got {self.power_of_two!r}")
        keep = tuple(self.keep) if isinstance(self.keep, (list, tuple)) else None
        if keep is None or not all(isinstance(k, str) or (isinstance(k, type)
                                                          and issubclass(k, nn.Module))
                                   for k in keep):
            raise ValueError(f"Fp8Recipe: keep must be a tuple of module classes or name "
                             f"globs, got {self.keep!r}")
        object.__setattr__(self, "keep", keep)

    @property
    def forward_dtype(self) -> torch.dtype:
        """The float8 type of inputs and weights."""
        return torch.float8_e4m3fn

    @property
    def backward_dtype(self) -> torch.dtype:
        """The float8 type of output gradients."""
        return torch.float8_e5m2 if self.format == "hybrid" else torch.float8_e4m3fn

    def fast(self, gemm: str) -> bool:
        """Whether `gemm` ("forward", "grad_input" or "grad_weight") may
        accumulate imprecisely."""
        return self.fast_accumulation == "all" or (self.fast_accumulation == "forward"
                                                   and gemm == "forward")

    def result_dtype(self, destination: torch.dtype) -> torch.dtype:
        """The dtype an fp8 GEMM returns when its result goes to `destination`."""
        if self.gemm_output == "bfloat16" and destination == torch.bfloat16:
            return torch.bfloat16
        return torch.float32

    def dtypes(self) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
        """(x, w, g) float8 types."""
        return (self.forward_dtype, self.forward_dtype, self.backward_dtype)
