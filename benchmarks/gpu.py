"""XLA:GPU as users meet it: one command for an NVIDIA GPU (part gpu-lm of gpu_suite.sh).

    python benchmarks/gpu.py [--out DIR] [--steps 60] [--rounds 5] [--smoke]
                             [--flag-sets "A;B"]       (XLA_FLAGS sets to try)
                             [--unfused-attention] [--only fp16,bf16,compile-amp]

The LM (tests/support/gpt_model.py: 6 layers x 768, 12 heads, vocab 8192, seq 512,
batch 16; AdamW 1e-3; one initialisation, the same batches) trained by:

  torchax worker (xla_amp.torchax.make_train_step on JAX's backend)
    fp16          policy cuda, float16, LossScaler
    bf16          policy tpu, bfloat16
    f32-default   autocast off, XLA's DEFAULT precision (TF32 on a GPU)
    f32-highest   autocast off under jax.default_matmul_precision("highest")
  native worker (never imports torchax: docs/upstream/privateuse1_...md)
    eager-amp     torch.autocast("cuda", float16) + GradScaler + fused AdamW
    compile-amp   the same step under torch.compile
    fp32          TF32 off (torch.backends.cuda.matmul.fp32_precision "ieee")

Each worker compiles (or warms) each variant first, timed, then runs
--rounds interleaved rounds of the rest of --steps; ms/step is the median
over rounds. Reported per variant: ms/step, compile seconds, the loss first
and last (mean of the last 5), and for torchax the GEMMs of the optimized
program by operand type (cuBLAS/cuBLASLt calls and Triton GEMM fusions; on a
backend with neither, its dots). --flag-sets reruns the torchax fp16/bf16
variants once per XLA_FLAGS set (e.g. autotuning or latency-hiding flags) and
reports what each gave. On a GPU xla_amp's regions send attention to cuDNN's
fused kernel (xla_amp/torchax/_attention.py); --unfused-attention adds a
torchax worker whose fp16/bf16 steps keep torchax's own, unfused lowering
(make_train_step(..., fused_attention=False)): the difference it makes.
--only keeps the named variants in every worker. Results: DIR/gpu.json and DIR/gpu.md (DIR: --out, else
$OUT, else build/). --smoke: a tiny LM, a few steps, the native worker on the
CPU (bf16 autocast): a check of the script itself. Run from the checkout's
root (``python benchmarks/gpu.py`` re-runs itself as ``-m benchmarks.gpu``:
this folder on sys.path would shadow the torchax package).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and __package__ in (None, ""):  # see the docstring's end
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.gpu", *sys.argv[1:]])

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from benchmarks import _harness as H  # noqa: E402

FULL = dict(vocab=8192, seq=512, d=768, heads=12, layers=6, batch=16)
SMOKE = dict(vocab=256, seq=32, d=64, heads=4, layers=2, batch=4)
TORCHAX = ("fp16", "bf16", "f32-default", "f32-highest")
NATIVE = ("eager-amp", "compile-amp", "fp32")


def _shapes(args):
    return SMOKE if args.smoke else FULL


def batches(args, n: int = 4):
    import torch
    s = _shapes(args)
    g = torch.Generator().manual_seed(1)
    toks = [torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1), generator=g)
            for _ in range(n)]
    return [(t[:, :-1], t[:, 1:]) for t in toks]


def model(args):
    import torch
    from tests.support.gpt_model import GPT
    torch.manual_seed(0)
    s = _shapes(args)
    return GPT(s["vocab"], s["seq"], s["d"], s["heads"], s["layers"], tied=True)


def gemm_types(optimized: str) -> dict:
    """{"lhs x rhs" operand element types: count} of the optimized program's
    GEMMs: cuBLAS/cuBLASLt custom calls and Triton GEMM fusions, or on a
    backend with neither its dots."""
    from tests.support.fp8 import parse
    instrs = parse(optimized)
    gemms = [ops for typ, opcode, ops, attrs in instrs.values()
             if (opcode == "custom-call" and "__cublas" in attrs)
             or (opcode == "fusion" and "__triton_gemm" in attrs)]
    if not gemms:
        gemms = [ops for typ, opcode, ops, attrs in instrs.values() if opcode == "dot"]
    kinds = collections.Counter()
    for ops in gemms:
        types = [instrs[o][0].split("[")[0] for o in ops[:2] if o in instrs]
        kinds[" x ".join(types) or "?"] += 1
    return dict(kinds)


class Runner:
    """One variant: `step()` runs a training step, `wait()` blocks on it."""

    def __init__(self, step, wait, losses):
        self.step, self.wait, self.losses = step, wait, losses


def torchax_runner(name: str, args) -> tuple[Runner, dict]:
    import jax
    import optax
    import xla_amp.torchax as xt
    from tests.support.gpt_model import lm_loss
    options = {"fp16": dict(policy="cuda", scaler=xt.LossScaler()),
               "bf16": dict(policy="tpu"), "f32-default": dict(enabled=False),
               "f32-highest": dict(enabled=False)}[name]
    precision = "highest" if name == "f32-highest" else None
    step = xt.make_train_step(model(args), lambda o, y: lm_loss(o.float(), y),
                              optax.adamw(1e-3), fused_attention=args.fused_attention, **options)
    data = [step.place_batch(*b) for b in batches(args)]
    losses, k = [], [0]

    def run():
        with jax.default_matmul_precision(precision):
            losses.append(step(*data[k[0] % len(data)]))
        k[0] += 1
    t0 = time.perf_counter()
    with jax.default_matmul_precision(precision):
        compiled = step.lower(*data[0]).compile()
    run()
    jax.block_until_ready(losses[-1])
    info = {"compile_s": time.perf_counter() - t0, "gemms": gemm_types(compiled.as_text())}
    return Runner(run, lambda: jax.block_until_ready(losses[-1]), losses), info


def native_runner(name: str, args) -> tuple[Runner, dict]:
    import torch
    from tests.support.gpt_model import lm_loss
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    if cuda:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    net = model(args).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=cuda)
    amp = name != "fp32"
    dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(dev, enabled=amp and cuda)
    data = [(x.to(dev), y.to(dev)) for x, y in batches(args)]

    def forward_loss(x, y):
        with torch.autocast(dev, dtype=dtype, enabled=amp):
            return lm_loss(net(x).float(), y)
    fl = torch.compile(forward_loss) if name == "compile-amp" else forward_loss
    losses, k = [], [0]

    def run():
        x, y = data[k[0] % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = fl(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
        k[0] += 1
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    run()
    sync()
    return Runner(run, sync, losses), {"compile_s": time.perf_counter() - t0}


def variants(kind: str, only: str) -> tuple:
    """The variants worker `kind` runs, those in `only` where it names any."""
    names = ("fp16", "bf16") if kind.startswith("flags:") or kind == "unfused-attention" else (
        TORCHAX if kind == "torchax" else NATIVE)
    return tuple(n for n in names if n in only.split(",")) if only else names


def worker(kind: str, args) -> dict:
    names = variants(kind, args.only)
    args.fused_attention = False if kind == "unfused-attention" else None
    make = native_runner if kind == "native" else torchax_runner
    runners, out = {}, {}
    for n in names:
        runners[n], out[n] = make(n, args)
    ms = H.timed_rounds({n: (lambda k, r=runners[n]: [r.step() for _ in range(k)], runners[n].wait)
                         for n in names}, args.steps, args.rounds)
    for n in names:
        losses = [float(v) for v in runners[n].losses]
        out[n].update(ms_per_step=H.median(ms[n]), first_loss=losses[0],
                      last_loss=statistics.fmean(losses[-5:]), steps=len(losses))
    import torch
    out["environment"] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                          "xla_flags": os.environ.get("XLA_FLAGS", ""),
                          "fused_attention": args.fused_attention}
    if kind != "native":
        import jax
        out["environment"].update(jax=jax.__version__, backend=jax.default_backend())
    return out


def table(results: dict) -> str:
    rows = ["| worker | variant | ms/step | compile s | loss first -> last | GEMMs (operand types) |",
            "|---|---|---|---|---|---|"]
    for kind, res in results.items():
        for name, r in res.items():
            if name in ("environment", "error") or "ms_per_step" not in r:
                continue
            rows.append(f"| {kind} | {name} | {r['ms_per_step']:.2f} | {r['compile_s']:.1f} | "
                        f"{r['first_loss']:.4f} -> {r['last_loss']:.4f} | "
                        f"{', '.join(f'{k}: {v}' for k, v in r.get('gemms', {}).items())} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "build")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flag-sets", default="", help="XLA_FLAGS sets, ';'-separated")
    ap.add_argument("--unfused-attention", action="store_true")
    ap.add_argument("--only", default="", help="variants to keep, ','-separated")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", default="",
                    help="torchax | native | flags:N | unfused-attention (internal)")
    args = ap.parse_args(argv)
    if args.smoke and args.steps == 60:
        args.steps, args.rounds = 7, 2
    if args.worker:
        H.print_result(worker(args.worker, args))
        return
    os.makedirs(args.out, exist_ok=True)
    common = ["--steps", str(args.steps), "--rounds", str(args.rounds), "--only", args.only]
    common += ["--smoke"] if args.smoke else []
    results, t0 = {}, time.perf_counter()
    jobs = [("native", None), ("torchax", None)]
    jobs += [("unfused-attention", None)] if args.unfused_attention else []
    jobs += [(f"flags:{i}", f) for i, f in enumerate(filter(None, args.flag_sets.split(";")))]
    for kind, flags in [(k, f) for k, f in jobs if variants(k, args.only)]:
        env = dict(os.environ)
        if flags:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
        try:
            results[kind] = H.run_worker("benchmarks.gpu", ["--worker", kind, *common], kind,
                                         env=env, stream_stderr=True)
        except SystemExit as e:  # one worker's failure: reported, the others still run
            results[kind] = {"error": str(e)[-2000:]}
        print(kind, json.dumps(results[kind]), flush=True)
    results["wall_s"] = {"total": time.perf_counter() - t0}
    H.write_results(args.out, "gpu", results,
                    table({k: v for k, v in results.items() if k != "wall_s"}))


if __name__ == "__main__":
    main()
