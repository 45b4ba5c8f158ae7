"""xla_amp.fp8 on torchax: the same quantized matmuls (fp8/_linear.py's
forward_impl / backward_impl, torch code run by torchax) inside one
``jax.custom_vjp``, so JAX's autodiff takes fp8's backward (the output
gradient quantized to e5m2, the two gradient matmuls on float8 operands)
instead of differentiating the quantization.

    matmul(layer, x, w, b):  torchax tensors in, out
        custom_vjp(x, w, b):
            fwd: autocast suspended; y, (xq, wq, sx, sw) = forward_impl
            bwd: autocast suspended; grads = backward_impl
        output: the region's dtype under xla_amp.torchax.autocast, else x's

Dynamic scaling only: a custom_vjp cannot write the module's buffers (delayed
scaling's history, the diagnostics) without leaking traced values out of
JAX's transformation, so delayed scaling is refused here by name.
"""
from __future__ import annotations

import functools

import jax

from xla_amp.fp8 import _linear
from xla_amp.torchax import _region


def _env(x):
    import torchax
    return getattr(x, "_env", None) or torchax.default_env()


def matmul(layer, x, weight, bias):
    if layer.recipe.scaling != "dynamic":
        raise ValueError(
            "xla_amp.fp8 on torchax: delayed scaling writes its amax history from the "
            "backward, which a jax.custom_vjp cannot do; use Fp8Recipe(scaling='dynamic')")
    env = _env(x)
    top = _region.current()
    out_dtype = top[1] if top is not None else x.dtype
    dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
    args = (x.jax(), weight.jax(), None if bias is None else bias.jax())
    y = _vjp(layer, env, dtypes, out_dtype, *args)
    return env.j2t_iso(y)


def _run(env, fn, *args):
    _region._stack()  # this thread's state exists
    with env, _region._suspended():
        return fn(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _vjp(layer, env, dtypes, out_dtype, x, w, b):
    return _fwd(layer, env, dtypes, out_dtype, x, w, b)[0]


def _fwd(layer, env, dtypes, out_dtype, x, w, b):
    def body():
        xt, wt, bt = env.j2t_iso((x, w, b))
        y, saved = _linear.forward_impl(xt, wt, bt, layer, record=False)
        return env.t2j_iso((y.to(out_dtype), saved))
    y, saved = _run(env, body)
    return y, saved


def _bwd(layer, env, dtypes, out_dtype, saved, g):
    def body():
        s, gt = env.j2t_iso((saved, g))
        grads = _linear.backward_impl(s, gt, layer, dtypes, record=False)
        return env.t2j_iso(grads)
    gx, gw, gb = _run(env, body)
    return gx, gw, gb


_vjp.defvjp(_fwd, _bwd)
_linear.register_backend("jax", matmul)

__all__ = ["matmul"]
