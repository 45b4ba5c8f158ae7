"""Gradient reduction in ``reduce_dtype`` (``ShardedPrecision``).

Under SPMD nobody calls a reduction: XLA's partitioner inserts one where a
contraction over a sharded dimension (the batch) leaves partial sums, in
the dtype of the op that made them. A weight gradient computed in bf16 is
therefore summed across the mesh in bf16 -- with AMP on fp32 parameters
too, since the cast back to fp32 comes after the sum. To sum in fp32, the
weight-gradient op itself must produce fp32. For the covered modules the
backward is replaced by one that does::

    forward   y = op(x, w, b)                       as before (autocast applies)
    backward  gx = op_input_grad(g, w)               in the forward's dtype
              gw = op_weight_grad(f32(g), f32(x_c))  f32 result: partial sums,
              gb = sum(f32(g))                       and so the reduction, in f32
              then gw, gb cast to the parameter's dtype

where x_c is the input as the forward used it (rounded to its compute
dtype first, so the product is the forward's operands, accumulated in
fp32). On a TPU an f32 dot of bf16-valued operands runs as a bf16 pass
with f32 accumulation; the reduction moves 4 bytes per element instead of 2.

Covered: ``nn.Linear``, ``nn.Conv1d/2d/3d`` (zero padding), ``nn.Embedding``
(dense), ``nn.LayerNorm``, and Hugging Face's ``Conv1D`` (GPT-2). Parameters
of other modules keep the partitioner's dtype; :func:`uncovered` lists them.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


class _Linear(torch.autograd.Function):
    """``F.linear(x, w, b)``, or with ``in_out`` Hugging Face's Conv1D:
    ``addmm(b, x, w)`` with ``w`` [in, out] (its forward, op for op)."""

    @staticmethod
    def forward(ctx, x, w, b, rdt, in_out=False):
        if in_out:
            y = torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])
        else:
            y = F.linear(x, w, b)
        ctx.save_for_backward(x, w, b)
        ctx.cdt, ctx.rdt, ctx.in_out = y.dtype, rdt, in_out
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        cdt, rdt = ctx.cdt, ctx.rdt
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            wc = w.to(cdt)
            gx = (g.to(cdt) @ (wc.t() if ctx.in_out else wc)).to(x.dtype)
        g2 = g.reshape(-1, g.shape[-1]).to(rdt)
        if ctx.needs_input_grad[1]:
            x2 = x.to(cdt).reshape(-1, x.shape[-1]).to(rdt)
            gw = (x2.t() @ g2 if ctx.in_out else g2.t() @ x2).to(w.dtype)
        if b is not None and ctx.needs_input_grad[2]:
            gb = g2.sum(0).to(b.dtype)
        return gx, gw, gb, None, None


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, rdt, stride, padding, dilation, groups):
        conv = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]  # as the module: autocast's op
        y = conv(x, w, b, stride, padding, dilation, groups)
        ctx.save_for_backward(x, w, b)
        ctx.cdt, ctx.rdt, ctx.args = y.dtype, rdt, (stride, padding, dilation, groups)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        cdt, rdt = ctx.cdt, ctx.rdt
        stride, padding, dilation, groups = ctx.args
        out_pad = [0] * (x.dim() - 2)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.ops.aten.convolution_backward(
                g.to(cdt), x.to(cdt), w.to(cdt), None, stride, padding, dilation, False,
                out_pad, groups, [True, False, False])[0].to(x.dtype)
        want_b = b is not None and ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1] or want_b:
            _, gw, gb = torch.ops.aten.convolution_backward(
                g.to(rdt), x.to(cdt).to(rdt), w.to(rdt), [w.shape[0]] if want_b else None,
                stride, padding, dilation, False, out_pad, groups,
                [False, ctx.needs_input_grad[1], want_b])
            gw = gw.to(w.dtype) if gw is not None else None
            gb = gb.to(b.dtype) if want_b else None
        return gx, gw, gb, None, None, None, None, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, w, padding_idx, rdt):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.wdt, ctx.padding_idx, ctx.rdt = w.shape, w.dtype, padding_idx, rdt
        return F.embedding(idx, w, padding_idx)

    @staticmethod
    def backward(ctx, g):
        # autograd's own op (PyTorch/XLA's lowering), fed rdt: a scatter-add
        # written here (index_add) summed in an order that depended on the
        # graph, and a run resumed from a checkpoint was no longer bit-identical
        (idx,) = ctx.saved_tensors
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        gw = torch.ops.aten.embedding_dense_backward(g.to(ctx.rdt), idx, ctx.shape[0], pad, False)
        return None, gw.to(ctx.wdt), None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, rdt, shape, eps):
        y = F.layer_norm(x, shape, w, b, eps)
        ctx.save_for_backward(x, w, b)
        ctx.rdt, ctx.shape, ctx.eps, ctx.cdt = rdt, shape, eps, y.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, b = ctx.saved_tensors
        rdt = ctx.rdt
        leaves = [x.detach().to(ctx.cdt).to(rdt).requires_grad_()]
        leaves += [t.detach().to(rdt).requires_grad_() if t is not None else None for t in (w, b)]
        with torch.enable_grad():  # the same normalisation, differentiated in rdt
            y = F.layer_norm(leaves[0], ctx.shape, leaves[1], leaves[2], ctx.eps)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(y, wanted, g.to(rdt)))
        gx, gw, gb = (next(grads) if t is not None else None for t in leaves)
        return (gx.to(x.dtype), gw.to(w.dtype) if gw is not None else None,
                gb.to(b.dtype) if gb is not None else None, None, None, None)


def _is_hf_conv1d(m) -> bool:
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


def _forward_for(m, rdt):
    """The replacement forward of `m`, or None where `m` is not covered."""
    if isinstance(m, nn.Linear):
        return lambda self, x: _Linear.apply(x, self.weight, self.bias, rdt)
    if _is_hf_conv1d(m) and m.bias is not None:  # y = addmm(b, x, W), W [in, out]
        return lambda self, x: _Linear.apply(x, self.weight, self.bias, rdt, True)
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.padding_mode == "zeros" \
            and not isinstance(m.padding, str):
        return lambda self, x: _Conv.apply(x, self.weight, self.bias, rdt, self.stride,
                                           self.padding, self.dilation, self.groups)
    if isinstance(m, nn.Embedding) and not (m.sparse or m.scale_grad_by_freq) \
            and m.max_norm is None:
        return lambda self, idx: _Embedding.apply(idx, self.weight, self.padding_idx, rdt)
    if isinstance(m, nn.LayerNorm):
        return lambda self, x: _LayerNorm.apply(x, self.weight, self.bias, rdt,
                                                self.normalized_shape, self.eps)
    return None


_INSTALLED = "_xla_amp_reduce_dtype"


def install(model: nn.Module, rdt: torch.dtype) -> list[str]:
    """Give each covered module of `model` the backward above (once; a module
    already given one keeps it). Returns the names of trainable parameters
    whose module is not covered."""
    for m in model.modules():
        if getattr(m, _INSTALLED, None) is not None:
            continue
        fwd = _forward_for(m, rdt)
        if fwd is not None:
            m.forward = types.MethodType(fwd, m)
            setattr(m, _INSTALLED, rdt)
    return uncovered(model)


def uncovered(model: nn.Module) -> list[str]:
    """Names of `model`'s trainable parameters that no covered module owns."""
    out = []
    for name, m in model.named_modules():
        if getattr(m, _INSTALLED, None) is None:
            out += [f"{name}.{n}" if name else n for n, p in m.named_parameters(recurse=False)
                    if p.requires_grad]
    return out
