"""Which form of a scaled fp8 GEMM XLA:GPU runs fastest, on an NVIDIA GPU.

    python -m benchmarks.fp8_forms [--out DIR] [--iters 101] [--smoke]

The fp8 MLP's step on an H100 was 1.22x bf16 (goal 1.3x), on an H200 1.31x:
what fp8 adds around its GEMMs is memory traffic. A reading of XLA's
GemmRewriter (docs/fp8.md) says it folds one runtime scalar multiply of an
fp8 GEMM's result into the cuBLASLt call, never a second one, never a convert
of the float32 result to bfloat16; a bfloat16 result comes only from the dot
itself. Each form below is one jitted function of the layer's shapes that
quantizes x (bf16) and w (f32) with runtime scales and returns bf16 y:

  f32-out        xla_amp's form: dot(x8, w8) -> f32, * (1/sx) * (1/sw), -> bf16
  f32-out-1      the same with the two factors multiplied first: one multiply
  bf16-out       Fp8Recipe(gemm_output="bfloat16"): dot(x8, w8) -> bf16, then
                 f32(.) * (1/sx) * (1/sw) -> bf16: half the GEMM's bytes
  bf16-out-fold  dot(x8, w8) -> bf16, * bf16((1/sx)(1/sw)): the multiply
                 GemmRewriter may fold into the GEMM, no pass after it (not
                 xla_amp's: where XLA rounds a bf16 multiply depends on the
                 graph, and torch.compile's numerics then differ from lazy)
  dequant-barrier  x8, w8 behind an optimization_barrier, then
                 dot(f32(x8) * (1/sx), f32(w8) * (1/sw)) -> bf16: the operand
                 pattern GemmRewriter turns into cuBLASLt's a/b scales (the
                 barrier keeps XLA from folding the f32 -> f8 -> f32 round trip)
  bf16           the bf16 GEMM the fp8 step is measured against

For each it reports ms per call (median of --rounds interleaved rounds of
--iters calls), the optimized program's cuBLAS calls and fusions, and the
largest difference from f32-out relative to max |y|. Shapes: the MLP's
forward (8192 x 4096 x 16384) and its down projection (8192 x 16384 x 4096).
Results: DIR/fp8_forms.json and .md. --smoke: tiny shapes on any backend.
"""
from __future__ import annotations

import json
import re
import time

from benchmarks import _harness as H

FORMS = ("f32-out", "f32-out-1", "bf16-out", "bf16-out-fold", "dequant-barrier", "bf16")
_CUSTOM = re.compile(r'custom_call_target="([^"]+)"')
_FUSION = re.compile(r"\bfusion\(")


def form(name: str):
    """The jittable function (x bf16 [m, k], w f32 [n, k], sx, sw f32 []) -> bf16 [m, n]."""
    import jax
    import jax.numpy as jnp
    f8, dims = jnp.float8_e4m3fn, (((1,), (1,)), ((), ()))

    def quant(t, s):
        return jnp.clip(t.astype(jnp.float32) * s, -448.0, 448.0).astype(f8)

    def fn(x, w, sx, sw):
        if name == "bf16":
            return jax.lax.dot_general(x, w.astype(jnp.bfloat16), dims,
                                       preferred_element_type=jnp.bfloat16)
        xq, wq = quant(x, sx), quant(w, sw)
        ix, iw = 1.0 / sx, 1.0 / sw
        if name == "dequant-barrier":
            xq, wq = jax.lax.optimization_barrier((xq, wq))
            return jax.lax.dot_general(xq.astype(jnp.float32) * ix, wq.astype(jnp.float32) * iw,
                                       dims, preferred_element_type=jnp.bfloat16)
        if name == "bf16-out-fold":
            y = jax.lax.dot_general(xq, wq, dims, preferred_element_type=jnp.bfloat16)
            return y * (ix * iw).astype(jnp.bfloat16)
        if name == "bf16-out":
            y = jax.lax.dot_general(xq, wq, dims, preferred_element_type=jnp.bfloat16)
            return (y.astype(jnp.float32) * ix * iw).astype(jnp.bfloat16)
        y = jax.lax.dot_general(xq, wq, dims, preferred_element_type=jnp.float32)
        y = y * (ix * iw) if name == "f32-out-1" else y * ix * iw
        return y.astype(jnp.bfloat16)
    return fn


def measure(shape, iters: int, rounds: int, options: dict | None) -> dict:
    import jax
    import jax.numpy as jnp
    m, k, n = shape
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (n, k), jnp.float32) * 0.02
    sx = 448.0 / jnp.max(jnp.abs(x)).astype(jnp.float32)
    sw = 448.0 / jnp.max(jnp.abs(w))
    args = (x, w, sx, sw)
    out, calls = {}, {}
    for name in FORMS:
        t0 = time.perf_counter()
        try:  # one form's refusal (XLA:GPU: "GEMM is not supported by cublasLt") is reported
            compiled = jax.jit(form(name)).lower(*args).compile(compiler_options=options)
            y = compiled(*args)
            jax.block_until_ready(y)
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            continue
        text = compiled.as_text()
        out[name] = {"compile_s": round(time.perf_counter() - t0, 2),
                     "custom_calls": sorted(set(_CUSTOM.findall(text))),
                     "fusions": len(_FUSION.findall(text)), "y": y}
        calls[name] = compiled
    ran = [n for n in FORMS if n in calls]
    ref = out["f32-out"]["y"].astype(jnp.float32)
    scale = float(jnp.max(jnp.abs(ref)))
    for name in ran:
        y = out[name].pop("y").astype(jnp.float32)
        out[name]["max_diff_vs_f32_out"] = float(jnp.max(jnp.abs(y - ref))) / scale
    for name, ms in H.jitted_ms(calls, args, iters, rounds).items():
        out[name]["ms"] = ms
    return out


def table(results: dict) -> str:
    rows = ["| shape | form | ms | vs f32-out | compile s | fusions | custom calls | "
            "max diff / max abs |", "|---|---|---|---|---|---|---|---|"]
    for shape, res in results.items():
        if not isinstance(res, dict) or "f32-out" not in res:
            continue
        for name in FORMS:
            r = res[name]
            if "error" in r:
                rows.append(f"| {shape} | {name} | failed: {r['error']} |" + " |" * 5)
                continue
            rows.append(f"| {shape} | {name} | {r['ms']:.3f} | "
                        f"{res['f32-out']['ms'] / r['ms']:.2f}x | {r['compile_s']} | "
                        f"{r['fusions']} | {', '.join(r['custom_calls'])} | "
                        f"{r['max_diff_vs_f32_out']:.2e} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    args = H.kernel_parser(__doc__).parse_args(argv)
    import jax
    shapes = [(64, 32, 128), (64, 128, 32)] if args.smoke else [(8192, 4096, 16384),
                                                                (8192, 16384, 4096)]
    options = {"xla_gpu_enable_triton_gemm": False} if jax.default_backend() == "gpu" else None
    results = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
    for shape in shapes:
        key = "x".join(map(str, shape))
        results[key] = measure(shape, 3 if args.smoke else args.iters,
                               2 if args.smoke else args.rounds, options)
        print(key, json.dumps(results[key]), flush=True)
    H.write_results(args.out, "fp8_forms", results, table(results))


if __name__ == "__main__":
    main()
