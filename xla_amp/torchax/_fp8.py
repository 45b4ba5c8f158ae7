"""xla_amp.fp8 on torchax: the same quantized matmuls (fp8/_linear.py's
forward_impl / backward_impl, torch code run by torchax) inside one
``jax.custom_vjp``, so JAX's autodiff takes fp8's backward (the output
gradient quantized to e5m2, the two gradient matmuls on float8 operands)
instead of differentiating the quantization.

    matmul(layer, x, w, b):  torchax tensors in, out
        delayed: raise the layer's pending x / w amax (outside the vjp:
                 buffers are written in the traced step, never inside it)
        custom_vjp(x, w, b, probe):
            fwd: autocast suspended; y, (xq, wq, sx, sw) = forward_impl
            bwd: autocast suspended; grads, amax(g) = backward_impl
                 -> (grads, amax(g) as the probe's cotangent)
        output: the region's dtype under xla_amp.torchax.autocast, else x's

Inside, the three matmuls are `_dot.dot` on torchax tensors, which this
module serves with ``jax.lax.dot_general`` on the float8 arrays
(preferred_element_type=float32): the lowered program's dots have float8
operands, the form XLA:GPU turns into cuBLASLt fp8 GEMMs. A float8 pair the
default JAX backend cannot compile into a dot (`_supports`, probed once per
pair on a 16 x 16 dot) makes the layer run in the region's dtype instead, and
is logged once, by name.

A custom_vjp cannot write a buffer from its backward, so the output
gradient's amax leaves it as the cotangent of a zero "probe" input: a step
that differentiates the probes too (make_train_step does, `probing`) gets
each delayed layer's amax(g) and rolls the history itself. Called without
probes (a hand-written step), delayed scaling is refused by name.

`compiler_options(model, backend, xla_flags)`: what make_train_step compiles
a step with fp8 layers with. On a GPU, Triton GEMM fusions off: XLA's
autotuner otherwise compiles Triton candidates for every fp8 GEMM, which
then loses to cuBLASLt's fp8 GEMM anyway (measured on an H200, jax 0.11.2:
55.6 s against 0.11 s for one 8192 x 4096 x 16384 GEMM; the issue's MLP
step 203 s on an H100, 3.1 s on the H200; its bf16 step unchanged at 43.6 ms).
An XLA_FLAGS that names xla_gpu_enable_triton_gemm itself is left to decide.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading

import jax
import jax.numpy as jnp

from xla_amp.fp8 import _dot, _linear, _quant
from xla_amp.torchax import _region

_probes = threading.local()
log = logging.getLogger("xla_amp")


@contextlib.contextmanager
def probing(probes: dict):
    """Inside: delayed-scaling layer -> its probe (a 0-d float32 JAX value the
    caller differentiates: its gradient is amax(g) of the layer's backward)."""
    previous = getattr(_probes, "map", None)
    _probes.map = probes
    try:
        yield
    finally:
        _probes.map = previous


def _env(x):
    import torchax
    return getattr(x, "_env", None) or torchax.default_env()


def matmul(layer, x, weight, bias):
    env = _env(x)
    probe = None
    if layer.recipe.scaling == "delayed":
        probe = (getattr(_probes, "map", None) or {}).get(layer)
        if probe is None:
            raise ValueError(
                "xla_amp.fp8 on torchax: delayed scaling needs a step that carries the amax "
                "histories (xla_amp.torchax.make_train_step); a hand-written step can use "
                "Fp8Recipe(scaling='dynamic')")
        _run(env, _linear.record_forward_amax, layer, x, weight)
    top = _region.current()
    out_dtype = top[1] if top is not None else x.dtype
    dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
    args = (x.jax(), weight.jax(), None if bias is None else bias.jax(),
            jnp.zeros((), jnp.float32) if probe is None else probe)
    return env.j2t_iso(_vjp(layer, env, dtypes, out_dtype, *args))


def _run(env, fn, *args):
    _region._stack()  # this thread's state exists
    with env, _region._suspended():
        return fn(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _vjp(layer, env, dtypes, out_dtype, x, w, b, probe):
    return _fwd(layer, env, dtypes, out_dtype, x, w, b, probe)[0]


def _fwd(layer, env, dtypes, out_dtype, x, w, b, probe):
    def body():
        xt, wt, bt = env.j2t_iso((x, w, b))
        y, saved = _linear.forward_impl(xt, wt, bt, layer, record=False, out_dtype=out_dtype)
        return env.t2j_iso((y, saved))
    return _run(env, body)


def _bwd(layer, env, dtypes, out_dtype, saved, g):
    def body():
        s, gt = env.j2t_iso((saved, g))
        grads, ag = _linear.backward_impl(s, gt, layer, dtypes, record=False)
        return env.t2j_iso((grads, ag))
    (gx, gw, gb), ag = _run(env, body)
    return gx, gw, gb, ag


_vjp.defvjp(_fwd, _bwd)


def _dims(ca: int, cb: int):
    return (((ca,), (cb,)), ((), ()))


def dot(a, b, ca: int, cb: int, fast: bool, out):
    """`_dot.dot` for torchax tensors: a dot on the float8 arrays themselves,
    at DEFAULT precision (XLA:GPU: fast accumulation) or HIGHEST (the split
    accumulator); never a region's fp32 precision. `out`: the result's torch
    dtype (float32 or bfloat16). Operands contracted on their first dim are
    transposed through words first where `word_transposes` says so."""
    from torchax.ops.mappings import t2j_dtype
    precision = jax.lax.Precision.DEFAULT if fast else jax.lax.Precision.HIGHEST
    (xa, ca), (xb, cb) = _k_minor(a.jax(), ca), _k_minor(b.jax(), cb)
    y = jax.lax.dot_general(xa, xb, _dims(ca, cb), precision=precision,
                            preferred_element_type=t2j_dtype(out))
    return _env(a).j2t_iso(y)


# .on: True, False or None (`word_transposes`); .sharded: `sharded_parameters`
_words = threading.local()


@contextlib.contextmanager
def _setting(name: str, value):
    before = getattr(_words, name, None)
    setattr(_words, name, value)
    try:
        yield
    finally:
        setattr(_words, name, before)


def word_transposes(on: bool | None = None):
    """Inside, the fp8 dots' operands contracted on their first dim are made
    K-minor by `_word_transpose` (True), left to XLA (False), or the first
    on a GPU backend where the parameters are not sharded (None, the
    default). Hopper's fp8 GEMMs take both operands K-minor, so the gradient
    GEMMs need x, w and g transposed. XLA writes each transposed float8 copy
    in the quantize pass, one byte at a time; through 4-byte words the same
    pass ran 1.30x (bf16 [8192, 16384]) to 1.79x (f32 [4096, 16384]) faster
    on an H200, the same bits (benchmarks/fp8_transpose.py, docs/fp8.md).
    With sharded parameters (make_train_step's "fsdp" on a mesh) the SPMD
    partitioner gathered the transposed weights besides the weights (4
    CPU devices: 6 all-gathers against 4), so there XLA keeps them."""
    return _setting("on", on)


def sharded_parameters(sharded: bool):
    """make_train_step traces its step inside: whether its parameters are
    sharded (`word_transposes`)."""
    return _setting("sharded", sharded)


def _k_minor(x, c: int):
    """(x, c) with a 2-D x contracted on dim 0 transposed through words, per
    `word_transposes`; any other operand as it is."""
    on = getattr(_words, "on", None)
    if on is None:
        on = _on_gpu() and not getattr(_words, "sharded", None)
    if not on or c != 0 or x.ndim != 2 or x.shape[0] % 4:
        return x, c
    return _word_transpose(x), 1


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _word_transpose(q):
    """q [R, C] (one byte per element, R a multiple of 4) transposed: its
    bytes regrouped as [R/4, C, 4], read as uint32 [R/4, C], transposed, and
    read back as bytes, so that out[c, 4i + j] = q[4i + j, c]."""
    r, c = q.shape
    u8 = jax.lax.bitcast_convert_type(q, jnp.uint8).reshape(r // 4, 4, c).transpose(0, 2, 1)
    words = jax.lax.bitcast_convert_type(u8, jnp.uint32).T
    back = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(c, r)
    return jax.lax.bitcast_convert_type(back, q.dtype)


@functools.lru_cache(maxsize=None)
def _supports(da, db) -> bool:
    """Whether the default JAX backend compiles a dot on (da, db) operands."""
    from torchax.ops.mappings import t2j_dtype
    try:
        jax.jit(lambda a, b: jax.lax.dot_general(a, b, _dims(1, 1),
                                                 preferred_element_type=jnp.float32)).lower(
            jax.ShapeDtypeStruct((16, 16), t2j_dtype(da)),
            jax.ShapeDtypeStruct((16, 16), t2j_dtype(db))).compile()
    except Exception as e:  # noqa: BLE001 -- any refusal means: not on this backend
        log.warning("xla_amp.fp8: the %s JAX backend cannot dot %s x %s (%s); fp8 layers "
                    "run in the region's dtype", jax.default_backend(), da, db,
                    str(e).splitlines()[0][:200])
        return False
    return True


def compiler_options(model, backend: str, xla_flags: str) -> dict | None:
    """Compiler options for a step of `model` on JAX `backend` (module docstring)."""
    if backend != "gpu" or "xla_gpu_enable_triton_gemm" in xla_flags:
        return None
    from xla_amp.fp8 import Fp8Linear
    if not any(isinstance(m, Fp8Linear) for m in model.modules()):
        return None
    log.info("xla_amp.fp8: compiling the step with Triton GEMM fusions off "
             "(xla_gpu_enable_triton_gemm=false: fp8 GEMMs are cuBLASLt's; set "
             "XLA_FLAGS=--xla_gpu_enable_triton_gemm=true to keep them)")
    return {"xla_gpu_enable_triton_gemm": False}


def barrier(t):
    """`_quant.amax`'s pin for torchax tensors: jax.lax.optimization_barrier."""
    return _env(t).j2t_iso(jax.lax.optimization_barrier(t.jax()))


_linear.register_backend("jax", matmul)
_dot.register_dot("jax", dot, _supports)
_quant.register_barrier("jax", barrier)
