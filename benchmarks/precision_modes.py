"""A small transformer language model trained in five precision modes.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/precision_modes.py [--steps 400]

Text: the Python standard library's own source files (sorted, the first
``--chars`` bytes; nothing downloaded), byte-level (256 symbols), the last
10 % held out. Model: a 2-layer causal transformer (d=128, 4 heads, context
64, pre-norm), AdamW(lr 3e-3, cosine decay to 0, weight decay 0.01) from the
same initial weights and the same batches in every mode:

  fp32         no autocast, fp32 weights
  amp          xla_amp.autocast (tpu rules, bf16) + GradScaler, fp32 weights
  bf16         cast_module(bf16, LayerNorm kept), syncfree.AdamW plain: its
               state bf16, updates rounded to nearest (what XLA_USE_BF16 gave)
  bf16_master  the same weights, AdamW(master_weights=True)
  bf16_sr      the same weights, AdamW(stochastic_rounding=True)

Each mode runs in its own process (XLA:CPU keeps compiled code per
process). Prints held-out loss per mode (mean over 16 fixed batches) and the
ratio to amp's; writes the loss curves to ``docs/precision_modes.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig

MODES = ("fp32", "amp", "bf16", "bf16_master", "bf16_sr")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def corpus(chars: int) -> bytes:
    lib = sysconfig.get_paths()["stdlib"]
    out = bytearray()
    for name in sorted(os.listdir(lib)):
        if name.endswith(".py"):
            with open(os.path.join(lib, name), "rb") as f:
                out += f.read()
            if len(out) >= chars:
                break
    return bytes(out[:chars])


def worker(mode: str, args) -> dict:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_xla

    import xla_amp

    dev = torch_xla.device()
    data = torch.frombuffer(bytearray(corpus(args.chars)), dtype=torch.uint8).long()
    split = int(len(data) * 0.9)
    train, held = data[:split], data[split:]
    ctx, batch = 64, 32
    g = torch.Generator().manual_seed(0)

    def batch_at(src, gen):
        i = torch.randint(0, len(src) - ctx - 1, (batch,), generator=gen)
        x = torch.stack([src[j:j + ctx] for j in i.tolist()])
        y = torch.stack([src[j + 1:j + ctx + 1] for j in i.tolist()])
        return x.to(dev), y.to(dev)

    class LM(nn.Module):
        def __init__(self, d=128, heads=4, layers=2):
            super().__init__()
            self.embed = nn.Embedding(256, d)
            self.pos = nn.Parameter(torch.randn(ctx, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 256)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

        def forward(self, x):
            h = self.embed(x) + self.pos
            h = self.blocks(h, mask=self.mask.to(h.dtype), is_causal=True)
            return self.head(self.norm(h))

    torch.manual_seed(0)
    model = LM().to(dev)
    if mode.startswith("bf16"):
        xla_amp.cast_module(model, torch.bfloat16, keep=(nn.LayerNorm,))
        xla_amp.module_policies(model, {nn.LayerNorm: "fp32"})
    flags = {"bf16_master": dict(master_weights=True),
             "bf16_sr": dict(stochastic_rounding=True)}.get(mode, {})
    opt = xla_amp.syncfree.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, **flags)
    scaler = xla_amp.GradScaler(enabled=mode != "fp32")
    amp = mode != "fp32"

    def loss_of(x, y):
        with xla_amp.autocast(dev, policy="tpu", enabled=amp):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))

    held_gen = torch.Generator().manual_seed(1)
    held_batches = [batch_at(held, held_gen) for _ in range(16)]

    def held_loss():
        with torch.no_grad():
            losses = [loss_of(x, y) for x, y in held_batches]
        return torch.stack(losses).mean().item()

    curve = []
    for step in range(args.steps):
        for group in opt.param_groups:  # cosine to 0: late updates fall below bf16's step
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        x, y = batch_at(train, g)
        opt.zero_grad()
        scaler.scale(loss_of(x, y)).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append((step + 1, held_loss()))
    return {"mode": mode, "curve": curve, "final": curve[-1][1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--chars", type=int, default=2_000_000)
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "precision_modes.png"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args)), flush=True)
        return
    results = {}
    for mode in args.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--steps",
               str(args.steps), "--lr", str(args.lr), "--chars", str(args.chars),
               "--eval_every", str(args.eval_every)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not line:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(line[0][len("RESULT "):])
        print(f"{mode}: held-out loss {results[mode]['final']:.4f}", flush=True)
    amp = results.get("amp", {}).get("final")
    print(f"\nLM on stdlib source, {args.steps} steps: held-out loss (16 batches)")
    print("| mode | held-out loss | vs amp |\n|---|---|---|")
    for mode, r in results.items():
        ratio = f"{r['final'] / amp:.4f}" if amp else "-"
        print(f"| {mode} | {r['final']:.4f} | {ratio} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, r in results.items():
        steps, losses = zip(*r["curve"])
        ax.plot(steps, losses, marker="o", markersize=3, label=mode)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss (nats/byte)")
    ax.set_title("byte-level LM on Python stdlib source, 5 precision modes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"chart: {os.path.relpath(args.png)}")


if __name__ == "__main__":
    main()
