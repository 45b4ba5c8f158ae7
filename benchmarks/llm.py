"""Llama-3-8B's layers trained on one NVIDIA GPU: xla_amp (bf16, fp8) against
torch.compile and torchao's float8 on the same card, in one command.

    python -m benchmarks.llm [--out DIR] [--steps 100] [--seq 4096] [--batch N]
                             [--paths xla-bf16,xla-fp8,...] [--budget 470]
    python -m benchmarks.llm --smoke          (the script's own check, on the CPU)

The model (tests/support/llama_model.py, ``8b-8l``): Hugging Face
``LlamaForCausalLM`` from a ``LlamaConfig`` with Llama-3-8B's values (hidden
4096, intermediate 14336, 32 heads, 8 KV heads, vocabulary 128256, RoPE theta
500000, RMSNorm, SwiGLU) and 8 decoder layers; random init (seed 0, on the
device), the same batches (seed 1) and AdamW (lr 1e-4, betas 0.9/0.95, eps
1e-8, weight decay 0.1) on every path. Sequence --seq (4096), batch --batch
(by default 2 on a card of 130 GiB or more, 1 below: the batch every path fits
with AdamW's state, so that every path sees the same tokens); both recorded.

Paths, each in a process of its own (the native ones never import torchax):
  xla-bf16      xla_amp.torchax.make_train_step, the tpu rules (bf16), the
                regions' fused attention (cuDNN on a GPU), optax.adamw
  xla-fp8       the same with xla_amp.fp8.convert on every Linear of the
                decoder layers (delayed scaling, the default recipe); the LM
                head stays bf16
  compile-bf16  torch.compile of forward + loss under torch.autocast("cuda",
                bfloat16), fused AdamW, SDPA restricted to flash / cuDNN
  torchao-fp8   the same after torchao's convert_to_float8_training
                (tensorwise scaling), the LM head kept
  eager-bf16    the native step without torch.compile: a floor
A path whose library (transformers, torchax, torchao) is missing is reported
as not run, with the reason; one that fails, or runs past its share of
--budget seconds (twice an even share of what is left), is reported with
the reason, and the others still run.

Per path, after the first step (compilation included: "compile s"), --steps
less one split over --rounds rounds of the same process (one model's AdamW
state fills a card, so the paths run one after another, not interleaved):
tokens/s is the median over rounds; MFU is the model FLOPs of those tokens
(llama_model.training_flops: 6 N + 12 L d T per token, written in the
output) over the card's dense bf16 peak (H100 and H200: 989 TFLOP/s); peak
device memory; the loss after --steps steps (the mean of the last 5) against
xla-bf16's; for the XLA paths the optimized program's GEMMs by operand type
and its cuBLASLt fp8 calls (``__cublas$lt$matmul$f8``) against all GEMMs
(benchmarks/fp8_gpu.gemm_counts); the Linear layers each path runs in fp8
(the fp8 paths: 7 a decoder layer). Results: DIR/llm.json and DIR/llm.md (DIR:
--out, else $OUT, else build/). Without an NVIDIA GPU (no nvidia-smi, or it
lists none) and without --smoke: one line, exit 2. --smoke: a 2-layer,
256-wide Llama, seq 64, a few steps, every path on the CPU (JAX's CPU
backend; CPU autocast; torch.compile's aot_eager backend for the compiled
paths): a check of the script itself.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import _harness as H
from tests.support import llama_model as L

PATHS = ("xla-bf16", "xla-fp8", "compile-bf16", "torchao-fp8", "eager-bf16")
XLA = ("xla-bf16", "xla-fp8")
_JAX = ("transformers", "jax", "torchax")
NEEDS = {"xla-bf16": _JAX, "xla-fp8": _JAX, "compile-bf16": ("transformers",),
         "torchao-fp8": ("transformers", "torchao"), "eager-bf16": ("transformers",)}
# dense bf16 TFLOP/s (NVIDIA's data sheets, without sparsity), by the name
# nvidia-smi gives
PEAKS = {"H100": 989.0, "H200": 989.0}
ADAMW = dict(lr=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)
BATCHES = 20  # distinct batches, cycled: 100 steps see each 5 times (random tokens)


def gpu() -> tuple[str, float] | None:
    """(the first GPU's name, its memory in GiB) from nvidia-smi, or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    if not lines:
        return None
    name, mib = lines[0].rsplit(",", 1)
    return name.strip(), float(mib) / 1024


def peak(name: str) -> tuple[float | None, str]:
    """(the card's dense bf16 peak in TFLOP/s, what it is), None where unknown."""
    for key, tflops in PEAKS.items():
        if key in name:
            return tflops, f"{key} dense bf16 {tflops:.0f} TFLOP/s"
    return None, f"{name}: no dense bf16 peak known"


def missing(path: str) -> str | None:
    """Why `path` cannot run here (a library it needs is not installed), or None."""
    gone = [m for m in NEEDS[path] if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(gone)}" if gone else None


def _shape(args) -> str:
    return "smoke" if args.smoke else "8b-8l"


def _model(args, device):
    """The model, initialised on `device` (the same values on every path of
    one device kind: seed 0), and BATCHES batches on the CPU."""
    import torch
    with torch.device(device):
        model = L.build(_shape(args), args.seq)
    return model, L.batches(_shape(args), args.batch, args.seq, BATCHES)


class Runner:
    """One path's training step: `run(n)` takes n steps, `wait()` blocks
    until they ran; `losses` the step losses (device values)."""

    def __init__(self, run, wait, losses, info):
        self.run, self.wait, self.losses, self.info = run, wait, losses, info


def xla_runner(path: str, args) -> Runner:
    import jax
    import optax
    import torch
    import xla_amp.torchax as xt
    from benchmarks.fp8_gpu import gemm_counts
    from benchmarks.gpu import gemm_types
    from xla_amp import fp8
    cuda = not args.smoke and torch.cuda.is_available()
    model, data = _model(args, "cuda" if cuda else "cpu")
    model = model.cpu()  # make_train_step copies the parameters into JAX
    if cuda:
        torch.cuda.empty_cache()
    if path == "xla-fp8":
        fp8.convert(model, L.fp8_recipe())
    layers = sum(isinstance(m, fp8.Fp8Linear) for m in model.modules())
    a = ADAMW
    step = xt.make_train_step(model, L.loss, optax.adamw(a["lr"], a["b1"], a["b2"], a["eps"],
                                                         weight_decay=a["weight_decay"]),
                              policy="tpu")
    del model
    placed = [step.place_batch(*b) for b in data]
    losses, k = [], [0]

    def run(n):
        for _ in range(n):
            losses.append(step(*placed[k[0] % len(placed)]))
            k[0] += 1
    t0 = time.perf_counter()
    lowered = step.lower(*placed[0])
    optimized = lowered.compile().as_text()
    run(1)
    jax.block_until_ready(losses[-1])
    info = {"compile_s": time.perf_counter() - t0, "fp8_layers": layers,
            "gemm_types": gemm_types(optimized),
            **gemm_counts(lowered.as_text(dialect="hlo"), optimized)}

    def memory():
        stats = jax.local_devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")
    info["memory"] = memory
    return Runner(run, lambda: jax.block_until_ready(losses[-1]), losses, info)


def native_runner(path: str, args) -> Runner:
    import torch
    cuda = not args.smoke and torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    model, data = _model(args, dev)
    if path == "torchao-fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn != "model.lm_head")
    layers = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    a = ADAMW
    opt = torch.optim.AdamW(model.parameters(), lr=a["lr"], betas=(a["b1"], a["b2"]),
                            eps=a["eps"], weight_decay=a["weight_decay"], fused=cuda)
    data = [(x.to(dev), y.to(dev)) for x, y in data]

    def forward_loss(x, y):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return L.loss(model(x), y)
    # --smoke: AOTAutograd's graphs without Inductor's code (minutes on a CPU)
    fl = forward_loss if path == "eager-bf16" else torch.compile(
        forward_loss, backend="aot_eager" if args.smoke else "inductor")
    attention = _fused_sdpa if cuda else _no_context
    losses, k = [], [0]

    def run(n):
        for _ in range(n):
            x, y = data[k[0] % len(data)]
            opt.zero_grad(set_to_none=True)
            with attention():
                loss = fl(x, y)
                loss.backward()
            opt.step()
            losses.append(loss.detach())
            k[0] += 1
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    run(1)
    sync()
    memory = (lambda: torch.cuda.max_memory_allocated()) if cuda else (lambda: None)
    return Runner(run, sync, losses, {"compile_s": time.perf_counter() - t0, "memory": memory,
                                      "fp8_layers": layers})


def _fused_sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION])


def _no_context():
    import contextlib
    return contextlib.nullcontext()


def worker(path: str, args) -> dict:
    reason = missing(path)
    if reason:
        return {"not_run": reason}
    r = (xla_runner if path in XLA else native_runner)(path, args)
    ms = H.timed_rounds({path: (r.run, r.wait)}, args.steps, args.rounds)[path]
    r.run(args.steps - len(r.losses))  # up to --steps steps, untimed
    r.wait()
    losses = [float(v) for v in r.losses]
    tokens = args.batch * args.seq
    out = {k: v for k, v in r.info.items() if k != "memory"}
    out.update(tokens_per_s=tokens / (H.median(ms) / 1e3), ms_per_step=H.median(ms),
               rounds_ms=ms, first_loss=losses[0], last_loss=statistics.fmean(losses[-5:]),
               steps=len(losses), peak_memory_bytes=r.info["memory"]())
    out["versions"] = versions()
    return out


def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for dist in ("torch", "transformers", "jax", "jaxlib", "torchax", "torchao"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def summarize(results: dict, args, card: str) -> dict:
    """MFU and the loss against xla-bf16's, per path that ran."""
    per_token, formula = L.training_flops(_shape(args), args.seq)
    tflops, peak_name = peak(card)
    base = results.get("xla-bf16", {}).get("last_loss")
    for r in results.values():
        if "tokens_per_s" not in r:
            continue
        achieved = r["tokens_per_s"] * per_token / 1e12
        r["model_tflops"] = achieved
        r["mfu"] = achieved / tflops if tflops else None
        r["loss_vs_xla_bf16"] = (r["last_loss"] / base - 1) if base else None
    return {"card": card, "peak": peak_name, "flops_per_token": per_token,
            "mfu_formula": f"MFU = tokens/s x ({formula}) / peak", "seq": args.seq,
            "batch": args.batch, "steps": args.steps, "shape": _shape(args)}


def table(results: dict, meta: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{100 * v:+.2f} %"
    rows = []
    for path, r in results.items():
        if "tokens_per_s" not in r:
            rows.append([path, r.get("not_run") or r.get("error", "?")[:200], *"-" * 8])
            continue
        gib = r["peak_memory_bytes"]
        gemms = "-"
        if "gemms" in r:  # the XLA paths
            gemms = (f"{r['cublas_fp8']}/{r['gemms']}; lowered fp8 dots "
                     f"{r['lowered_fp8_dots']}/{r['lowered_dots']}; "
                     + ", ".join(f"{k}: {v}" for k, v in r["gemm_types"].items()))
        rows.append([path, f"{r['tokens_per_s']:.0f}",
                     "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %",
                     "-" if gib is None else f"{gib / 2**30:.1f}", f"{r['compile_s']:.1f}",
                     f"{r['last_loss']:.4f}", pct(r["loss_vs_xla_bf16"]), gemms,
                     r["fp8_layers"], r["steps"]])
    head = (f"Llama-3-8B shapes, {meta['shape']}: seq {meta['seq']}, batch {meta['batch']}, "
            f"{meta['steps']} steps; {meta['card']}; {meta['mfu_formula']}, peak: "
            f"{meta['peak']}\n\n")
    return head + H.markdown_table(
        ["path", "tokens/s", "MFU", "peak GiB", "compile s", "loss", "vs xla-bf16",
         "GEMMs: cuBLASLt fp8 / all; lowered; by operand type", "fp8 layers", "steps"], rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "build")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=0, help="default: by the card's memory")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--budget", type=float, default=470.0, help="seconds for every path")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", default="", help="a path (internal)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seq, args.batch = 64, args.batch or 2
        args.steps, args.rounds = (6, 2) if args.steps == 100 else (args.steps, args.rounds)
    if args.worker:
        H.print_result(worker(args.worker, args))
        return
    card = gpu()
    if card is None and not args.smoke:
        print("benchmarks/llm.py: no NVIDIA GPU here (nvidia-smi lists none); "
              "run it on a GPU, or with --smoke for the CPU check")
        sys.exit(2)
    name = "CPU (--smoke)" if args.smoke else card[0]
    if not args.batch:
        args.batch = 2 if card[1] >= 130 else 1
    common = ["--steps", str(args.steps), "--rounds", str(args.rounds), "--seq", str(args.seq),
              "--batch", str(args.batch)] + (["--smoke"] if args.smoke else [])
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")  # JAX's share of the card
    if args.smoke:
        env["JAX_PLATFORMS"] = "cpu"
    results, t0 = {}, time.perf_counter()
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown path {unknown[0]!r}: one of {', '.join(PATHS)}")
    for i, path in enumerate(paths):
        left = args.budget - (time.perf_counter() - t0)
        cap = min(left, max(60.0, 2 * left / (len(paths) - i)))  # a hung path leaves time
        if missing(path):
            results[path] = {"not_run": missing(path)}
        elif left < 30:
            results[path] = {"not_run": f"the budget: {left:.0f} s of {args.budget:.0f} left"}
        else:
            try:
                results[path] = H.run_worker("benchmarks.llm", ["--worker", path, *common], path,
                                             env=env, stream_stderr=True, timeout=cap)
            except SystemExit as e:  # one path's failure: reported, the others still run
                results[path] = {"error": str(e)[-2000:]}
        print(path, json.dumps(results[path])[:2000], flush=True)
    meta = summarize(results, args, name)
    meta["wall_s"] = time.perf_counter() - t0
    H.write_results(args.out, "llm", {"meta": meta, "paths": results}, table(results, meta))


if __name__ == "__main__":
    main()
