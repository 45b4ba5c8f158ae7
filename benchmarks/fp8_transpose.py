"""How fast XLA:GPU writes a tensor's float8 copy in both layouts, on an NVIDIA GPU.

    python -m benchmarks.fp8_transpose [--out DIR] [--iters 101] [--rounds 5] [--smoke]

Hopper's fp8 GEMMs take both operands K-major, so each converted layer
needs x, w and g quantized in both layouts: the forward's, and the
transposed one its gradient GEMMs read. XLA writes both in one pass (a
multi-output fusion that reads the wide tensor once); on the H100 and the
H200 these passes moved 1.5-2.2 TB/s where the step's reductions moved
3.5-4 (docs/fp8.md, "Where the H100's time goes"): 4.6 of the MLP step's
32.7 ms on the H200. Each form below is one jitted function of a tensor t
(bf16 or f32) and a runtime scale s that returns (q, qT), q = the float8
e4m3 copy of t * s, qT its transpose:

  fused          xla_amp's form: (q, q.T); XLA fuses both into one pass
  split          q, then q behind an optimization barrier transposed: a
                 quantize pass at a reduction's bandwidth plus a transpose
                 of one byte per element
  packed         split, with the transpose done on 4-byte words
                 (xla_amp.torchax._fp8._word_transpose: q's bytes regrouped
                 into [R/4, C, 4], read as uint32 [R/4, C], transposed, read
                 back as bytes)
  packed-fused   packed without the barrier (XLA fuses what it will): what
                 xla_amp.torchax's fp8 dots do on a GPU
  one-layout     q alone: the quantize pass with no transposed copy
  transpose-f8   the transpose of a float8 tensor alone (split's second pass)

For each it reports ms per call (median of --rounds interleaved rounds of
--iters calls), GB/s over the bytes it must read and write, the optimized
program's fusions, and whether (q, qT) equals fused's bit for bit. Shapes:
the MLP's GELU output and up-projection gradient (bf16 8192 x 16384), its
down-projection gradient (bf16 8192 x 4096) and a master weight (f32 4096 x
16384). Results: DIR/fp8_transpose.json and .md. --smoke: tiny shapes on any
backend.
"""
from __future__ import annotations

import json
import re
import time

from benchmarks import _harness as H

FORMS = ("fused", "split", "packed", "packed-fused", "one-layout", "transpose-f8")
SHAPES = (("bfloat16", 8192, 16384), ("bfloat16", 8192, 4096), ("float32", 4096, 16384))
_FUSION = re.compile(r"\bfusion\(")


def form(name: str):
    """The jittable function (t [R, C], s f32 [], q8 f8 [R, C]) -> its outputs."""
    import jax
    import jax.numpy as jnp
    from xla_amp.torchax._fp8 import _word_transpose

    def quant(t, s):
        return jnp.clip(t.astype(jnp.float32) * s, -448.0, 448.0).astype(jnp.float8_e4m3fn)

    def fn(t, s, q8):
        if name == "transpose-f8":
            return q8.T
        q = quant(t, s)
        if name == "one-layout":
            return q
        if name == "fused":
            return q, q.T
        if name == "packed-fused":
            return q, _word_transpose(q)
        qb = jax.lax.optimization_barrier(q)
        return q, (_word_transpose(qb) if name == "packed" else qb.T)
    return fn


def moved_bytes(name: str, dtype_bytes: int, n: int) -> int:
    """The bytes a form must read and write at least (n elements)."""
    if name == "transpose-f8":
        return 2 * n
    if name == "one-layout":
        return (dtype_bytes + 1) * n
    if name in ("split", "packed"):
        return (dtype_bytes + 1) * n + 2 * n
    return (dtype_bytes + 2) * n


def measure(dtype: str, rows: int, cols: int, iters: int, rounds: int) -> dict:
    import jax
    import jax.numpy as jnp
    t = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32).astype(dtype)
    s = 448.0 / jnp.max(jnp.abs(t)).astype(jnp.float32)
    q8 = jnp.clip(t.astype(jnp.float32) * s, -448.0, 448.0).astype(jnp.float8_e4m3fn)
    args = (t, s, q8)
    out, calls, ys = {}, {}, {}
    for name in FORMS:
        t0 = time.perf_counter()
        compiled = jax.jit(form(name)).lower(*args).compile()
        ys[name] = jax.block_until_ready(compiled(*args))
        out[name] = {"compile_s": round(time.perf_counter() - t0, 2),
                     "fusions": len(_FUSION.findall(compiled.as_text()))}
        calls[name] = compiled

    def bits(a):
        return jax.lax.bitcast_convert_type(a, jnp.uint8)
    want = ys["fused"]
    for name in FORMS:
        got = ys[name]
        pairs = {"transpose-f8": [(got, want[1])], "one-layout": [(got, want[0])]}.get(
            name, list(zip(got, want)))
        out[name]["bit_equal"] = all(bool(jnp.array_equal(bits(a), bits(b))) for a, b in pairs)

    width = jnp.dtype(dtype).itemsize
    for name, ms in H.jitted_ms(calls, args, iters, rounds).items():
        out[name]["ms"] = ms
        out[name]["gb_s"] = moved_bytes(name, width, rows * cols) / ms / 1e6
    return out


def table(results: dict) -> str:
    rows = ["| tensor | form | ms | vs fused | GB/s | fusions | bits equal to fused |",
            "|---|---|---|---|---|---|---|"]
    for key, res in results.items():
        if not isinstance(res, dict) or "fused" not in res:
            continue
        for name in FORMS:
            r = res[name]
            rows.append(f"| {key} | {name} | {r['ms']:.3f} | {res['fused']['ms'] / r['ms']:.2f}x"
                        f" | {r['gb_s']:.0f} | {r['fusions']} | {r['bit_equal']} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    args = H.kernel_parser(__doc__).parse_args(argv)
    import jax
    shapes = [("bfloat16", 64, 128), ("float32", 32, 64)] if args.smoke else SHAPES
    results = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
    for dtype, rows, cols in shapes:
        key = f"{dtype}[{rows},{cols}]"
        results[key] = measure(dtype, rows, cols, 3 if args.smoke else args.iters,
                               2 if args.smoke else args.rounds)
        print(key, json.dumps(results[key]), flush=True)
    H.write_results(args.out, "fp8_transpose", results, table(results))


if __name__ == "__main__":
    main()
