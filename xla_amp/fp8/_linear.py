"""`Fp8Linear`: nn.Linear whose three matmuls run on scaled float8 operands.

    forward   y  = dot(q(x), q(w)) / (sx sw)  (+ b)     x, w in e4m3
    backward  dx = dot(q(g), q(w)) / (sg sw)             g in e5m2 (hybrid)
              dw = dot(q(g)^T, q(x)) / (sg sx)           or e4m3

q is _quant.quantize (tensorwise scales); dot is _dot.dot, a dot on the
float8 values with a float32 result (or, Fp8Recipe.gemm_output "bfloat16",
a bfloat16 one where the result goes to bfloat16: scaled_gemm), which
XLA:GPU turns into cuBLASLt's fp8 GEMM (docs/fp8.md: what the H100 showed).
The op runs with autocast off; its output takes the autocast dtype when a
region is open, else the input's. The backward keeps the float8 x and w
(half bf16's bytes).

A call whose shape cannot take an fp8 GEMM (_dot.eligible: a dimension not a
multiple of 16, e5m2 x e5m2, a float8 type the backend cannot dot) runs as
F.linear in the region's dtype instead; the first such call of each kind logs
one line naming the layer, and `report(model).fallback` lists it.

Buffers (in state_dict; float32)::

    fp8_scale         [3]     the scales of x, w, g last used (dynamic) or in
                              use until the next roll (delayed)
    fp8_amax_history  [3, L]  delayed only; rolled by update_scales()
    fp8_amax_pending  [3]     delayed only: running max since the last roll
    fp8_stats         [3, 2]  last saturated / underflow fractions of x, w, g

Buffers change inside the step graph (copy_), never through the host.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from xla_amp.fp8 import _dot, _quant
from xla_amp.fp8._recipe import Fp8Recipe

X, W, G = 0, 1, 2
log = logging.getLogger("xla_amp")

# device type -> matmul(layer, x, weight, bias) for tensors the autograd
# Function cannot serve; xla_amp.torchax registers "jax" (register_backend)
_backends: dict = {}


def register_backend(device_type: str, matmul) -> None:
    _backends[device_type] = matmul


def _autocast_off(device_type: str):
    if device_type in ("xla", "cpu", "cuda"):
        return torch.autocast(device_type, enabled=False)
    import contextlib
    return contextlib.nullcontext()


def _records() -> bool:
    """Whether this call writes the diagnostic buffers (fp8_stats, dynamic
    scaling's fp8_scale). Not under torch.compile: AOTAutograd refuses a
    buffer written inside an autograd.Function ("Node copy_ was invalid, but
    is output"); the compiled layer computes the same values, unrecorded."""
    return not torch.compiler.is_compiling()


def scaled_gemm(recipe, gemm: str, a, b, ca: int, cb: int, sa, sb, destination, passed=None):
    """dot(a, b) / (sa sb) on the float8 operands in float32, for a result
    that goes to `destination`: one multiply by one factor (_quant.factor).
    `passed` = (finite, amax): where not finite the factor is that amax (inf
    or NaN), so every element of the result is non-finite (an overflow
    upstream goes on to the GradScaler) with no pass of its own over it.
    The dot itself returns float32, or bfloat16 where the recipe's
    gemm_output says so; the scaling (and the caller's bias and cast to
    `destination`) follow in float32 either way: an explicit cast is a
    rounding XLA keeps wherever the graph is cut (a bfloat16 multiply after
    the dot was rounded or not depending on the graph, and torch.compile's
    loss differed from the lazy step's)."""
    y = _dot.dot(a, b, ca, cb, recipe.fast(gemm), recipe.result_dtype(destination))
    f = _quant.factor(sa, sb)
    if passed is not None:
        finite, amax = passed
        f = torch.where(finite, f, amax)
    return _quant.unscale(y.float(), f)


def forward_impl(x, weight, bias, module, record: bool, out_dtype):
    """y ([..., out], `out_dtype`) and what the backward keeps, (xq, wq, sx, sw,
    g's scale in force): the backward reads no buffer (on torchax it is
    traced after the forward's parameters and buffers are gone).
    `record`: write the module's buffers (delayed scaling's pending amaxes,
    the diagnostics, dynamic scaling's scales); without it the caller
    records what it needs (xla_amp.torchax: outside its jax.custom_vjp).
    Shared by the autograd.Function (torch_xla) and the custom_vjp."""
    recipe = module.recipe
    fx, fw, _ = recipe.dtypes()
    if recipe.scaling == "dynamic":
        sx = _quant.scale_from_amax(recipe, fx, _quant.amax(x), module.fp8_scale[X])
        sw = _quant.scale_from_amax(recipe, fw, _quant.amax(weight), module.fp8_scale[W])
    else:
        sx, sw = module.fp8_scale[X].clone(), module.fp8_scale[W].clone()
        if record:
            record_forward_amax(module, x, weight)
    xq = _quant.quantize(x, sx, fx)
    wq = _quant.quantize(weight, sw, fw)
    if record:  # whole-buffer copies: a slice written here is refused by AOTAutograd
        module.fp8_stats.copy_(torch.stack(
            [_quant.stats(x, xq, sx, fx), _quant.stats(weight, wq, sw, fw),
             module.fp8_stats[G]]))
        if recipe.scaling == "dynamic":
            module.fp8_scale.copy_(torch.stack([sx, sw, module.fp8_scale[G]]))
    y = scaled_gemm(recipe, "forward", xq.reshape(-1, x.shape[-1]), wq, 1, 1, sx, sw, out_dtype)
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], weight.shape[0]).to(out_dtype), (
        xq, wq, sx, sw, module.fp8_scale[G].clone())


def record_forward_amax(module, x, weight) -> None:
    """Delayed scaling: raise the running max of x's and w's amax."""
    pending = module.fp8_amax_pending
    amaxes = torch.stack([_quant.amax(x), _quant.amax(weight), torch.zeros_like(pending[G])])
    # a non-finite amax never enters the history (the input saturates, as documented)
    pending.copy_(torch.where(torch.isfinite(amaxes), torch.maximum(pending, amaxes), pending))


def backward_impl(saved, grad_out, module, dtypes, record: bool):
    """((grad_x, grad_w, grad_b) in `dtypes` (x's, w's, b's or None), the
    output gradient's amax)."""
    xq, wq, sx, sw, sg_old = saved
    recipe = module.recipe
    fg = recipe.backward_dtype
    x_dtype, w_dtype, b_dtype = dtypes
    g = grad_out.reshape(-1, grad_out.shape[-1])
    ag = _quant.amax(g)
    finite = torch.isfinite(ag)  # an overflow upstream (inf/NaN): passed on, never kept
    if recipe.scaling == "dynamic":
        sg = _quant.scale_from_amax(recipe, fg, ag, sg_old)
        if record:
            module.fp8_scale.copy_(torch.cat([module.fp8_scale[:G], sg.reshape(1)]))
    else:
        sg = sg_old
        if record:
            pending = module.fp8_amax_pending
            pending.copy_(torch.cat([pending[:G], torch.where(
                finite, torch.maximum(pending[G:], ag.reshape(1)), pending[G:])]))
    gq = _quant.quantize(g, sg, fg)
    if record:
        module.fp8_stats.copy_(torch.cat([module.fp8_stats[:G],
                                          _quant.stats(g, gq, sg, fg).reshape(1, 2)]))
    # The clamp before the cast would turn an inf gradient into a finite one,
    # and the GradScaler would not skip: the non-finite amax goes on instead,
    # as both gradients' factor.
    grad_x = scaled_gemm(recipe, "grad_input", gq, wq, 1, 0, sg, sw, x_dtype,
                         (finite, ag)).reshape(xq.shape).to(x_dtype)
    grad_w = scaled_gemm(recipe, "grad_weight", gq, xq.reshape(-1, xq.shape[-1]), 0, 0, sg, sx,
                         w_dtype, (finite, ag)).to(w_dtype)
    grad_b = g.float().sum(0).to(b_dtype) if b_dtype is not None else None
    return (grad_x, grad_w, grad_b), ag


class _Fp8MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module):
        out_dtype = (torch.get_autocast_dtype(x.device.type)
                     if x.device.type == "xla" and torch.is_autocast_enabled("xla") else x.dtype)
        with _autocast_off(x.device.type):
            y, saved = forward_impl(x, weight, bias, module, _records(), out_dtype)
        ctx.save_for_backward(*saved)
        ctx.module = module
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        with _autocast_off(grad_out.device.type):
            grads, _ = backward_impl(ctx.saved_tensors, grad_out, ctx.module, ctx.dtypes,
                                     _records())
        return (*grads, None)


@torch.compiler.disable
def _note_fallback(layer, why: str) -> None:
    """Records a fallback on the layer; logs the first of each kind."""
    if why not in layer.fallback:
        layer.fallback[why] = None
        log.warning("xla_amp.fp8: layer %r runs in the region's dtype, not fp8: %s",
                    layer.fp8_name or type(layer).__name__, why)


@torch.compiler.disable
def _delayed_forward(module, x):
    """Delayed scaling writes its amax history from the backward, which
    torch.compile cannot capture inside an autograd.Function: under
    torch.compile these layers run outside the compiled graph (a graph
    break; the same numerics). Dynamic scaling compiles."""
    return module._forward(x)


class Fp8Linear(nn.Module):
    """A converted ``nn.Linear`` (or Hugging Face ``Conv1D``, ``transposed``):
    the same parameters, float8 matmuls; see the module docstring. Made by
    `xla_amp.fp8.convert`."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, recipe: Fp8Recipe,
                 transposed: bool = False, name: str = ""):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.recipe = recipe
        self.transposed = transposed  # Conv1D keeps weight as (in, out)
        self.fp8_name = name  # qualified name in the converted model (log lines, report)
        self.fallback: dict[str, None] = {}  # why calls ran in the region's dtype, in order
        dev = weight.device
        self.register_buffer("fp8_scale", torch.ones(3, device=dev))
        self.register_buffer("fp8_stats", torch.zeros(3, 2, device=dev))
        if recipe.scaling == "delayed":
            self.register_buffer("fp8_amax_history",
                                 torch.zeros(3, recipe.amax_history_len, device=dev))
            self.register_buffer("fp8_amax_pending", torch.zeros(3, device=dev))

    @property
    def per_call_buffers(self) -> tuple[str, ...]:
        """The buffers that describe the last call rather than the training
        state (the diagnostics; under dynamic scaling the scales that call
        computed): every call rewrites them, a skipped step included."""
        return ("fp8_stats",) + (("fp8_scale",) if self.recipe.scaling == "dynamic" else ())

    @property
    def in_features(self) -> int:
        return self.weight.shape[0 if self.transposed else 1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1 if self.transposed else 0]

    def forward(self, x):
        if self.recipe.scaling == "delayed":
            return _delayed_forward(self, x)
        return self._forward(x)

    def _forward(self, x):
        weight = self.weight.t() if self.transposed else self.weight
        why = self.ineligible(x)
        if why is not None:
            _note_fallback(self, why)
            return F.linear(x, weight, self.bias)  # under the region's rules
        if x.device.type == "jax":  # torchax: the same functions under a jax.custom_vjp
            if _backends.get("jax") is None:
                raise RuntimeError("xla_amp.fp8: a torchax tensor reached an Fp8Linear; fp8 on "
                                   "torchax runs through xla_amp's torchax backend: "
                                   "import xla_amp.torchax")
            return _backends["jax"](self, x, weight, self.bias)
        return _Fp8MatMul.apply(x, weight, self.bias, self)

    def ineligible(self, x) -> str | None:
        """Why a call on input `x` cannot run on float8 operands, or None."""
        fx, fw, fg = self.recipe.dtypes()
        k = self.in_features
        return _dot.eligible(x.numel() // k if k else 0, k, self.out_features,
                             ((fx, fw), (fg, fw), (fg, fx)), x.device.type)

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scaling={r.scaling}, format={r.format}")
