"""fp8 against bf16 on an NVIDIA GPU in one command (parts of benchmarks/gpu_suite.sh).

    python benchmarks/fp8.py --gpu [--out DIR] [--smoke] [--models mlp,gpt2]
    python -m benchmarks.fp8_gpu ...          (the same, from the checkout's root)

Models:
  mlp    4 residual blocks of Linear(4096 -> 16384) -> GELU -> Linear(16384 ->
         4096) over 8192 tokens, MSE against a fixed random teacher
  gpt2   GPT-2 small (tests/support/gpt_model.py: 12 x 768, 12 heads, vocab 50257,
         seq 1024, batch 8) with its MLPs (c_fc, mlp_proj) in fp8
Variants, from the same weights on the same batches: ``bf16`` (policy tpu)
and ``fp8`` (the same with xla_amp.fp8.convert, delayed scaling, as
docs/fp8.md recommends: fast accumulation in the forward GEMM only);
``fp8-fast-all`` (fast accumulation in all three GEMMs), ``fp8-fast-none`` and
``fp8-bf16-out`` (Fp8Recipe(gemm_output="bfloat16"): GEMMs whose result goes
to bf16 return bf16) on request
(--variants); ``-unpinned`` after an fp8 variant (``fp8-unpinned``) traces
its step without the optimization barrier xla_amp.fp8 puts behind each amax
by default (xla_amp.fp8._quant.pinned_amax: the same values; without it
XLA:GPU fuses the amaxes' last reduction stage into the history's serial
concatenate); ``-xla-transposes`` (``fp8-xla-transposes``) leaves the
transposed float8 operands of the gradient GEMMs to XLA instead of
xla_amp.torchax's word transposes on a GPU (the same bits).
Engines, where they run: ``torchax``
(xla_amp.torchax.make_train_step, optax.adamw) always; ``torch_xla``
(autocast + GradScaler + syncfree.AdamW) where torch_xla is installed; where it
is not, that engine is reported as not run.

Per (engine, model) one worker process builds both variants, compiles each
step (timed), then trains --steps steps in --rounds interleaved rounds (the
first step of each, its compilation, untimed): ms/step is the median over
rounds, the ratio the median of per-round ratios. It reports:
  - the lowered program's dots on float8 operands (the CPU tests' gate) and
    the optimized program's GEMMs: cuBLASLt fp8 (`__cublas$lt$matmul$f8`)
    against all (cuBLAS/cuBLASLt custom calls + Triton GEMM fusions; on a
    backend with neither, its dots);
  - the loss of each variant after --steps steps (mean of the last 10) and
    fp8's relative difference from bf16, at --lr 3e-5 (AdamW), where bf16
    descends steadily on the MLP (at 1e-4 its loss spikes).
--xla-flags adds to the workers' XLA_FLAGS (both variants alike).
--probe first compiles one fp8 GEMM of the MLP's shape (runtime scales) with
XLA's defaults and with Triton GEMMs off, and reports each compile's seconds
(with XLA's defaults the MLP's fp8 step took 203 s to compile on an H100,
bf16's 5 s).
Results: DIR/fp8_gpu.json and DIR/fp8_gpu.md (DIR: --out, else $OUT, else
build/); each worker's progress goes to stderr as it happens. Needs torchax
(``pip install --no-deps`` its wheel); run it with the checkout's root as the
current folder. --smoke: tiny shapes, a few steps (a check of the script itself
on the CPU).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import sys
import time

from benchmarks import _harness as H
from benchmarks._fp8_variants import FAST, FULL, SMOKE, VARIANTS, base, build, pinning

ENGINES = ("torchax", "torch_xla")
_CUBLAS = re.compile(r'custom_call_target="(__cublas\$[\w$]+)"')
_TRITON_GEMM = re.compile(r'"kind":"__triton_gemm"')


def gemm_counts(lowered: str, optimized: str) -> dict:
    """Dots on float8 operands in the lowered program; GEMMs of the optimized
    one (None where the engine gives no optimized text); the lowered
    program's optimization barriers (the fp8 variants' amaxes, pinned; XLA
    removes them once its fusion is done, so the optimized text has none)."""
    from tests.support.fp8 import dots, fp8_dot
    low = dots(lowered)
    barriers = {"barriers": lowered.count(" opt-barrier(")}
    if not optimized:
        return {"lowered_dots": len(low), "lowered_fp8_dots": sum(fp8_dot(e) for e in low),
                "gemms": None, "cublas_fp8": None, **barriers}
    calls = _CUBLAS.findall(optimized)
    triton = len(_TRITON_GEMM.findall(optimized))
    opt_dots = dots(optimized)
    gemms = len(calls) + triton or len(opt_dots)
    return {**barriers, "lowered_dots": len(low),
            "lowered_fp8_dots": sum(fp8_dot(e) for e in low), "gemms": gemms,
            "cublas_fp8": calls.count("__cublas$lt$matmul$f8"),
            "cublas": len(calls), "triton_gemms": triton,
            "optimized_fp8_dots": sum(fp8_dot(e) for e in opt_dots)}


class TorchaxVariant:
    """One variant's jitted step (xla_amp.torchax) and its batches on the device."""

    def __init__(self, model: str, variant: str, args):
        import jax
        import optax
        import xla_amp.torchax as xt
        net, batches, self.loss_fn = build(model, (SMOKE if args.smoke else FULL)[model], variant)
        self.step = xt.make_train_step(net, self.loss_fn, optax.adamw(args.lr), policy="tpu")
        self.batches = [self.step.place_batch(*b) for b in batches]
        self.block = jax.block_until_ready
        self.k, self.losses, self.variant = 0, [], variant

    def compile(self) -> dict:
        t0 = time.perf_counter()
        with pinning(self.variant):
            lowered = self.step.lower(*self.batches[0])
            compiled = lowered.compile()
        out = {"compile_s": time.perf_counter() - t0}
        out.update(gemm_counts(lowered.as_text(dialect="hlo"), compiled.as_text()))
        self.run(1)  # the step's first call (cached now), untimed
        self.wait()
        return out

    def run(self, n: int) -> None:
        with pinning(self.variant):  # a retrace, if any, traces the same step
            for _ in range(n):
                self.losses.append(self.step(*self.batches[self.k % len(self.batches)]))
                self.k += 1

    def wait(self) -> None:
        self.block(self.losses[-1])

    def loss_values(self) -> list[float]:
        return [float(v) for v in self.losses]


class TorchXlaVariant:
    """The same on torch_xla: autocast(tpu) + GradScaler + syncfree.AdamW."""

    def __init__(self, model: str, variant: str, args):
        import torch_xla
        import xla_amp
        from xla_amp import fp8, syncfree
        self.dev = torch_xla.device()
        net, batches, self.loss_fn = build(model, (SMOKE if args.smoke else FULL)[model], variant)
        self.net = net.to(self.dev)
        self.opt = syncfree.AdamW(self.net.parameters(), lr=args.lr)
        if base(variant) in FAST:
            fp8.attach(self.opt, self.net)
        self.scaler = xla_amp.GradScaler()
        self.batches = [(x.to(self.dev), y.to(self.dev)) for x, y in batches]
        self.k, self.losses, self.lowered, self.variant = 0, [], "", variant

    def _one(self, keep_hlo: bool = False) -> None:
        import torch_xla
        import xla_amp
        x, y = self.batches[self.k % len(self.batches)]
        self.opt.zero_grad()
        with pinning(self.variant):  # lazy: every step is traced
            with xla_amp.autocast(self.dev, policy="tpu"):
                loss = self.loss_fn(self.net(x), y)
            self.scaler.scale(loss).backward()
        if keep_hlo:
            grads = [p.grad for p in self.net.parameters() if p.grad is not None]
            # the buffers too: delayed scaling's pending amaxes (pinned) go there
            self.lowered = torch_xla._XLAC._get_xla_tensors_hlo(
                [loss] + grads + list(self.net.buffers()))
        self.scaler.step(self.opt)
        self.scaler.update()
        torch_xla.sync()
        self.losses.append(loss.detach())
        self.k += 1

    def compile(self) -> dict:
        t0 = time.perf_counter()
        self._one(keep_hlo=True)
        self.wait()
        out = {"compile_s": time.perf_counter() - t0}  # first step: trace + compile + run
        out.update(gemm_counts(self.lowered, ""))  # optimized: not read back on torch_xla
        return out

    def run(self, n: int) -> None:
        for _ in range(n):
            self._one()

    def wait(self) -> None:
        H.wait_device()

    def loss_values(self) -> list[float]:
        import torch
        return torch.stack(self.losses).float().cpu().tolist()


def _progress(*parts) -> None:
    print("[fp8_gpu]", *parts, file=sys.stderr, flush=True)


def worker(engine: str, model: str, args) -> dict:
    cls = TorchaxVariant if engine == "torchax" else TorchXlaVariant
    variants, out = {}, {}
    for v in args.variants.split(","):  # warm-up: every graph built
        try:
            variant = cls(model, v, args)
            out[v] = variant.compile()
            variants[v] = variant
        except Exception as e:  # noqa: BLE001 -- one variant's failure is reported, not fatal
            out[v] = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
        _progress(engine, model, v, json.dumps(out[v]))
    if "bf16" not in variants:
        return out
    names = list(variants)
    ms = H.timed_rounds({v: (variants[v].run, variants[v].wait) for v in names},
                        args.steps, args.rounds)
    for v in names:
        losses = variants[v].loss_values()
        out[v].update(ms_per_step=H.median(ms[v]), steps=len(losses), first_loss=losses[0],
                      final_loss=statistics.fmean(losses[-10:]),
                      losses=[round(x, 5) for x in losses])
        if v != "bf16":
            out[v]["speedup"] = H.paired_ratio(ms["bf16"], ms[v])
            out[v]["loss_rel_diff"] = out[v]["final_loss"] / out["bf16"]["final_loss"] - 1
    out["environment"] = environment()
    return out


def probe(shape=(8192, 4096, 16384)) -> dict:
    """Compile seconds of one fp8 GEMM in the layers' form (runtime scales),
    XLA's defaults against Triton GEMMs off, and whether it became cuBLASLt's."""
    import jax
    import jax.numpy as jnp
    m, k, n = shape

    def f(x, w, sx, sw):
        xq = jnp.clip(x * sx, -448, 448).astype(jnp.float8_e4m3fn)
        wq = jnp.clip(w * sw, -448, 448).astype(jnp.float8_e4m3fn)
        y = jax.lax.dot_general(xq, wq, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        return y / (sx * sw)
    spec = [jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((n, k), jnp.float32),
            jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32)]
    out = {}
    for name, options in (("defaults", {}), ("triton_gemm_off",
                                             {"xla_gpu_enable_triton_gemm": False})):
        t0 = time.perf_counter()
        text = jax.jit(f).lower(*spec).compile(compiler_options=options or None).as_text()
        out[name] = {"compile_s": round(time.perf_counter() - t0, 2),
                     "cublas": _CUBLAS.findall(text),
                     "triton_gemms": len(_TRITON_GEMM.findall(text))}
        _progress("probe", name, json.dumps(out[name]))
    return out


def environment() -> dict:
    import jax
    import torch
    env = {"commit": os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip(),
           "torch": torch.__version__, "jax": jax.__version__,
           "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def report(results: dict) -> str:
    lines = ["| engine | model | variant | ms/step | speed-up vs bf16 | compile s | "
             "fp8 dots (lowered) | cuBLASLt fp8 / all GEMMs | loss first -> last | "
             "loss vs bf16 | barriers (lowered) |", "|" + "---|" * 11]
    for key, res in results.items():
        if ":" not in key:
            continue
        engine, model = key.split(":")
        if "not_run" in res or "error" in res:
            why = res.get("not_run") or res.get("error", "")[-200:]
            lines.append(f"| {engine} | {model} | - | not run: {why} |" + " |" * 7)
            continue
        for v, r in res.items():
            if v in ("environment", "wall_s"):
                continue
            if "error" in r:
                lines.append(f"| {engine} | {model} | {v} | failed: {r['error'][:200]} |" + " |" * 7)
                continue
            gemms = "n/a" if r["gemms"] is None else f"{r['cublas_fp8']}/{r['gemms']}"
            lines.append(
                f"| {engine} | {model} | {v} | {r['ms_per_step']:.2f} | "
                f"{r.get('speedup', 1.0):.3f}x | {r['compile_s']:.1f} | "
                f"{r['lowered_fp8_dots']}/{r['lowered_dots']} | {gemms} | "
                f"{r['first_loss']:.4f} -> {r['final_loss']:.4f} | "
                f"{100 * r.get('loss_rel_diff', 0.0):+.2f} % | "
                f"{r.get('barriers', '')} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "build")
    ap.add_argument("--models", default="mlp,gpt2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=9)
    # 3e-5: where bf16 trains the MLP steadily; at 1e-4 its loss spikes (on an H200,
    # docs/benchmarks.md, "fp8 on a GPU"), and a comparison measures where a spike falls
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--variants", default="bf16,fp8", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--xla-flags", default="", help="added to the workers' XLA_FLAGS")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", default="", help="ENGINE:MODEL (internal)")
    args = ap.parse_args(argv)
    if args.smoke and args.steps == 100:
        args.steps, args.rounds = 13, 3
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad or not args.variants.startswith("bf16"):
        ap.error(f"--variants: bf16 first, then any of {', '.join(VARIANTS[1:])}; got "
                 f"{args.variants!r}")
    if args.worker == "probe":
        H.print_result(probe((256, 64, 256) if args.smoke else (8192, 4096, 16384)))
        return
    if args.worker:
        H.print_result(worker(*args.worker.split(":"), args))
        return
    os.makedirs(args.out, exist_ok=True)
    results, env = {}, dict(os.environ)
    if args.xla_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
    env.setdefault("PJRT_DEVICE", "CUDA" if importlib.util.find_spec("torch_xla") is None
                   else "CPU")
    common = ["--steps", str(args.steps), "--rounds", str(args.rounds), "--lr", str(args.lr),
              "--variants", args.variants]
    common += ["--smoke"] if args.smoke else []
    if args.probe:
        results["probe"] = H.run_worker("benchmarks.fp8_gpu", ["--worker", "probe", *common],
                                        "probe", env=env, stream_stderr=True)
        print("probe", json.dumps(results["probe"]), flush=True)
    for engine in args.engines.split(","):
        for model in args.models.split(","):
            key = f"{engine}:{model}"
            needs = "torchax" if engine == "torchax" else "torch_xla"
            if importlib.util.find_spec(needs) is None:
                results[key] = {"not_run": f"{needs} is not installed"}
                continue
            t0 = time.perf_counter()
            results[key] = H.run_worker("benchmarks.fp8_gpu", ["--worker", key, *common],
                                        key, env=env, stream_stderr=True)
            results[key]["wall_s"] = time.perf_counter() - t0
            print(key, json.dumps(results[key]), flush=True)
    H.write_results(args.out, "fp8_gpu", results, report(results))


if __name__ == "__main__":
    main()
