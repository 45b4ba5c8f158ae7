"""A call of every public torch function that has a sample, for comparing the
floating dtypes autocast gives: torch.overrides' functions with
PyTorch's OpInfo samples (torch.testing), plus multi-operand calls OpInfo's
first samples miss. Imports neither torch_xla nor torchax: the GPU's
recorder (scripts/record_cuda_autocast.py) runs it in a process that never
imported torchax, under torch.autocast("cuda").

    composite_cases(skip)       {name: (make() -> (args, kwargs), call)}
    run(call, args, kwargs, device, region)
                                the floating dtypes of the call's outputs, or
                                ["error: <type>"]
    signature(args, kwargs)     the sample's tensors as "dtype[shape]" strings
                                (a table recorded with another torch's samples
                                is compared only where these agree)
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

def _r(*shape):
    return torch.randn(*shape)


def _mha_inputs():
    """Query, MultiheadAttention(12, 2)'s weights, a causal mask (the issue's model)."""
    layer = torch.nn.MultiheadAttention(12, 2, batch_first=True)
    weights = [p.detach().clone() for p in (layer.in_proj_weight, layer.in_proj_bias,
                                             layer.out_proj.weight, layer.out_proj.bias)]
    return [_r(3, 7, 12), *weights, torch.nn.Transformer.generate_square_subsequent_mask(7)]


def _mha(q, w, b, ow, ob, mask):
    qt = q.transpose(0, 1)
    return F.multi_head_attention_forward(qt, qt, qt, 12, 2, w, b, None, None, False, 0.0,
                                          ow, ob, training=False, attn_mask=mask)[0]


# func qualname -> (inputs, call) for what OpInfo has no sample of
HAND = {
    "multi_head_attention_forward": (_mha_inputs, _mha),
    "chain_matmul": (lambda: [_r(3, 4), _r(4, 5), _r(5, 2)], torch.chain_matmul),
    "softmax": (lambda: [_r(3, 5)], lambda x: F.softmax(x, -1)),
    "log_softmax": (lambda: [_r(3, 5)], lambda x: F.log_softmax(x, -1)),
    "gumbel_softmax": (lambda: [_r(3, 5)], lambda x: F.gumbel_softmax(x, tau=0.5)),
    "affine_grid": (lambda: [_r(2, 2, 3)], lambda t: F.affine_grid(t, [2, 1, 4, 4],
                                                                    align_corners=False)),
    "fold": (lambda: [_r(1, 4, 9)], lambda x: F.fold(x, (4, 4), (2, 2))),
    "dropout1d": (lambda: [_r(2, 3, 4)], lambda x: F.dropout1d(x, 0.5)),
    "lp_pool1d": (lambda: [_r(1, 2, 6)], lambda x: F.lp_pool1d(x, 2.0, 2)),
    "lp_pool2d": (lambda: [_r(1, 2, 6, 6)], lambda x: F.lp_pool2d(x, 2.0, 2)),
    "lp_pool3d": (lambda: [_r(1, 2, 4, 4, 4)], lambda x: F.lp_pool3d(x, 2.0, 2)),
    "max_pool1d_with_indices": (lambda: [_r(1, 2, 6)], lambda x: F.max_pool1d(x, 2)),
    "max_pool2d_with_indices": (lambda: [_r(1, 2, 6, 6)], lambda x: F.max_pool2d(x, 2)),
    "max_pool3d_with_indices": (lambda: [_r(1, 2, 4, 4, 4)], lambda x: F.max_pool3d(x, 2)),
    "adaptive_max_pool1d_with_indices": (lambda: [_r(1, 2, 6)],
                                         lambda x: F.adaptive_max_pool1d(x, 3)),
    "adaptive_max_pool2d_with_indices": (lambda: [_r(1, 2, 6, 6)],
                                         lambda x: F.adaptive_max_pool2d(x, 3)),
    "adaptive_max_pool3d_with_indices": (lambda: [_r(1, 2, 4, 4, 4)],
                                         lambda x: F.adaptive_max_pool3d(x, 2)),
    "Tensor.__floordiv__": (lambda: [_r(3, 4), _r(3, 4) + 3], lambda a, b: a // b),
    "Tensor.__rfloordiv__": (lambda: [_r(3, 4) + 3], lambda a: 2.0 // a),
    "TensorBase.pow": (lambda: [_r(3, 4).abs() + 0.5], lambda a: a.pow(2.5)),
    "TensorBase.pow_": (lambda: [_r(3, 4).abs() + 0.5], lambda a: a.clone().pow_(2.5)),
}

# multi-operand calls OpInfo's first samples miss (einsum's is one operand)
EXTRA = {
    "einsum-2": (lambda: [torch.randn(4, 5), torch.randn(5, 6)],
                 lambda a, b: torch.einsum("ij,jk->ik", a, b)),
    "einsum-1": (lambda: [torch.randn(4, 4)], lambda a: torch.einsum("ii->i", a)),
    "tensordot": (lambda: [torch.randn(3, 4, 5), torch.randn(4, 5, 6)],
                  lambda a, b: torch.tensordot(a, b, dims=2)),
    "affine_grid": (lambda: [torch.randn(2, 2, 3)],
                    lambda t: torch.nn.functional.affine_grid(t, [2, 1, 4, 4],
                                                              align_corners=False)),
}


@functools.lru_cache(maxsize=1)
def opinfos() -> dict:
    """{callable: its OpInfo} over PyTorch's op_db, by every variant's name."""
    from torch.testing._internal.common_methods_invocations import op_db
    out = {}
    for info in op_db:
        named = torch
        for part in info.name.split("."):
            named = getattr(named, part, None)
        for variant in (info.op, info.method_variant, named, getattr(torch.Tensor, info.name, None)):
            if variant is not None:
                try:
                    out.setdefault(variant, info)
                except TypeError:
                    pass
    return out


def samples(info):
    """`info`'s float32 CPU samples, untracked: OpInfo.sample_inputs wraps
    them in torch.testing's TrackedInputIter, which calls inspect.stack() per
    call (under pytest's deep stack 0.3 s each: 760 ops took 7 minutes)."""
    return iter(info.sample_inputs_func(info, "cpu", torch.float32, False))


def qualname(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))


def composite_cases(skip=frozenset(HAND)) -> dict:
    """{name: (make, call)}: each overridable function's first OpInfo sample
    without complex tensors (names in `skip` left out), then EXTRA."""
    seen = {}
    for fns in torch.overrides.get_overridable_functions().values():
        for func in fns:
            name = qualname(func)
            if name in seen or name in skip:
                continue
            info = opinfos().get(func)
            if info is None:
                continue
            for s in samples(info):
                leaves = [s.input, *s.args, *s.kwargs.values()]
                if all(not (isinstance(t, torch.Tensor) and t.is_complex()) for t in leaves):
                    seen[name] = (lambda s=s: ((s.input, *s.args), s.kwargs), info.op)
                    break
    for name, (make, call) in EXTRA.items():
        seen[name] = (lambda make=make: (tuple(make()), {}), call)
    return seen


def floats(out) -> list[str]:
    return [str(t.dtype) for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def run(call, args, kwargs, device, region) -> list[str]:
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    torch.manual_seed(0)
    with region:
        try:
            return floats(call(*pytree.tree_map(move, list(args)),
                               **pytree.tree_map(move, dict(kwargs))))
        except Exception as e:  # noqa: BLE001 -- compared, not hidden
            return [f"error: {type(e).__name__}"]


def signature(args, kwargs) -> list[str]:
    return [f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
            for t in pytree.tree_leaves([list(args), dict(kwargs)]) if isinstance(t, torch.Tensor)]
