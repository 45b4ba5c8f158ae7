"""fp8 against bf16 AMP per training step on XLA, side by side.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/fp8.py [--model lm|mlp] [--rounds 10]
    python benchmarks/fp8.py --gpu [--out DIR] ...   the GPU benchmark
                                                     (benchmarks/fp8_gpu.py)

Models: ``lm`` a GPT-2-shaped LM (Transformers, 2 layers x 256, 4 heads,
vocab 1024, seq 128, batch 8: its Conv1D layers and the tied head in fp8);
``mlp`` a 4-layer MLP of width --width (default 1024; 4096 is the GPU
benchmark's), batch 64. Variants, the same weights and batches:

    bf16   xla_amp.autocast(policy="tpu") + GradScaler + syncfree.AdamW
    fp8    the same with xla_amp.fp8.convert (delayed scaling, attach)
    fp8-dynamic   dynamic scaling

Per variant: ms/step (median of interleaved rounds, a ratio the median of
per-round ratios), trace time per step (Python until torch_xla.sync()
hands the graph over: what fp8's extra ops cost to trace), graph executions,
device-to-host transfers and compilations per timed step, parameter bytes,
and the bytes the forward saves for the backward (saved_tensors_hooks: fp8
keeps float8 inputs and weights). On XLA:CPU fp8 is emulated exactly: its
step time there says nothing about a GPU's fp8 GEMMs (docs/fp8.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__" and "--gpu" in sys.argv[1:]:
    # run from the checkout's root as a module (the checkout need not be
    # installed): benchmarks.fp8_gpu imports its siblings as benchmarks.*
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.fp8_gpu",
                              *[a for a in sys.argv[1:] if a != "--gpu"]])

import torch
import torch.nn as nn

import _harness as h  # this folder's sibling (benchmarks/_harness.py)

VARIANTS = ("bf16", "fp8", "fp8-dynamic")


def build(model: str, width: int):
    torch.manual_seed(0)
    if model == "lm":
        import transformers as tf
        net = tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=1024, n_positions=128, n_embd=256, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, 1024, (8, 128), generator=g) for _ in range(4)]
        return net, [(b, b) for b in batches], lambda m, x, y: m(input_ids=x, labels=y).loss
    layers = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.GELU()]
    net = nn.Sequential(*layers[:-1])
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, width, generator=g), torch.randn(64, width, generator=g))
               for _ in range(4)]
    return net, batches, lambda m, x, y: torch.nn.functional.mse_loss(m(x).float(), y)


class Variant:
    def __init__(self, name: str, args):
        import torch_xla
        import xla_amp
        from xla_amp import fp8, syncfree
        self.dev = torch_xla.device()
        net, batches, self.loss_of = build(args.model, args.width)
        if name != "bf16":
            scaling = "dynamic" if name == "fp8-dynamic" else "delayed"
            fp8.convert(net, fp8.Fp8Recipe(scaling=scaling), unaligned="keep")
        self.model = net.to(self.dev)
        self.opt = syncfree.AdamW(self.model.parameters(), lr=1e-4)
        if name == "fp8":
            fp8.attach(self.opt, self.model)
        self.scaler = xla_amp.GradScaler()
        self.batches = [(x.to(self.dev), y.to(self.dev)) for x, y in batches]
        self.k, self.trace_s, self.traced = 0, 0.0, 0
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.saved_bytes = self._saved_bytes()

    def _saved_bytes(self) -> int:
        import xla_amp
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t
        x, y = self.batches[0]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with xla_amp.autocast(self.dev, policy="tpu"):
                loss = self.loss_of(self.model, x, y)
        del loss
        import torch_xla
        torch_xla.sync()
        return total

    def step(self):
        import torch_xla
        import xla_amp
        t0 = time.perf_counter()
        x, y = self.batches[self.k % len(self.batches)]
        self.opt.zero_grad()
        with xla_amp.autocast(self.dev, policy="tpu"):
            loss = self.loss_of(self.model, x, y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.trace_s += time.perf_counter() - t0
        self.traced += 1
        torch_xla.sync()
        self.k += 1
        return loss


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="lm", choices=("lm", "mlp"))
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    variants = {v: Variant(v, args) for v in VARIANTS}
    h.warm_up([v.step for v in variants.values()], 3)
    tallies = {v: h.Tally() for v in VARIANTS}
    for v in variants.values():
        v.trace_s, v.traced = 0.0, 0

    def run_one(name, r):
        return tallies[name].measure(variants[name].step, args.steps)
    h.interleaved(VARIANTS, args.rounds, run_one)
    rows, out = [], {"model": args.model, "width": args.width, "rounds": args.rounds}
    for name in VARIANTS:
        t, v = tallies[name], variants[name]
        res = {"ms_per_step": h.median(t.ms),
               "vs_bf16": h.paired_ratio(t.ms, tallies["bf16"].ms),
               "trace_ms_per_step": 1e3 * v.trace_s / v.traced,
               "executions": t.per_step("ExecuteTime"),
               "transfers": t.per_step("TransferFromDeviceTime"),
               "compilations": t.per_step("CompileTime"),
               "param_bytes": v.param_bytes, "saved_bytes": v.saved_bytes}
        out[name] = res
        rows.append([name, f"{res['ms_per_step']:.1f}", f"{res['vs_bf16']:.3f}x",
                     f"{res['trace_ms_per_step']:.1f}", f"{res['executions']:.2f}",
                     f"{res['transfers']:.2f}", f"{res['compilations']:.2f}",
                     f"{res['param_bytes'] / 2**20:.2f}", f"{res['saved_bytes'] / 2**20:.2f}"])
    print(h.markdown_table(["variant", "ms/step", "vs bf16", "trace ms/step", "executions/step",
                            "transfers/step", "compilations/step", "params MiB",
                            "saved for backward MiB"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
