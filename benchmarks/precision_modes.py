"""A small transformer language model trained in five precision modes.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/precision_modes.py [--steps 400]

Text: the Python standard library's own source files (sorted, the first
``--chars`` bytes; nothing downloaded), byte-level (256 symbols), the last
10 % held out. Model: tests/support/byte_lm.py's 2-layer causal transformer (d=128,
4 heads, context 64, pre-norm), AdamW(lr 3e-3, cosine decay to 0, weight
decay 0.01) from the same initial weights and the same batches in every
mode:

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
import math
import os

from _harness import markdown_table, print_result, run_worker  # this folder's
from tests.support.byte_lm import MODES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(mode: str, args) -> dict:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch.nn.functional as F
    import torch_xla

    from tests.support import byte_lm as lm
    import xla_amp

    dev = torch_xla.device()
    data = lm.corpus(args.chars)
    split = int(len(data) * 0.9)
    train, held = data[:split], data[split:]
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = lm.LM().to(dev)
    opt, scaler, amp = lm.apply_mode(model, mode, args.lr)

    def loss_of(x, y):
        with xla_amp.autocast(dev, policy="tpu", enabled=amp):
            logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))

    held_gen = torch.Generator().manual_seed(1)
    held_batches = [lm.batch_at(held, held_gen, dev) for _ in range(16)]

    def held_loss():
        with torch.no_grad():
            losses = [loss_of(x, y) for x, y in held_batches]
        return torch.stack(losses).mean().item()

    curve = []
    for step in range(args.steps):
        for group in opt.param_groups:  # cosine to 0: late updates fall below bf16's step
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        x, y = lm.batch_at(train, g, dev)
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
        print_result(worker(args.worker, args))
        return
    results = {}
    for mode in args.modes.split(","):
        results[mode] = run_worker(__file__, [
            "--worker", mode, "--steps", str(args.steps), "--lr", str(args.lr),
            "--chars", str(args.chars), "--eval_every", str(args.eval_every)], mode)
        print(f"{mode}: held-out loss {results[mode]['final']:.4f}", flush=True)
    amp = results.get("amp", {}).get("final")
    print(f"\nLM on stdlib source, {args.steps} steps: held-out loss (16 batches)")
    print(markdown_table(["mode", "held-out loss", "vs amp"],
                         [[mode, f"{r['final']:.4f}", f"{r['final'] / amp:.4f}" if amp else "-"]
                          for mode, r in results.items()]))
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
