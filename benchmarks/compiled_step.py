"""The AMP training step lazy vs. under torch.compile(backend="openxla").

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/compiled_step.py [--batch 8,32,128]

The MNIST-sized CNN of benchmarks/syncfree_step.py trains under
xla_amp.autocast (tpu rules, bf16) + xla_amp.GradScaler + xla_amp.syncfree
(SGD with momentum by default); every 5th step's input is multiplied by a
device-side inf (an overflow the scaler must skip) and an ExponentialLR
scheduler changes the learning rate every step. Three paths, side by side:

  lazy      the default path: everything traced lazily, one graph per step
  compiled  forward + loss in torch.compile; backward, scaler and optimizer
            lazily after it (the pattern docs/compiled.md recommends)
  whole     the whole step (zero_grad, forward, loss, backward, unscale,
            optimizer, scale update) in one torch.compile region: Dynamo
            breaks the graph where it cannot trace (listed after the table)

Warm-up runs every graph variant first (overflow and finite steps, lr
changes); then rounds interleave the paths (each round led by another) and
ms/step is the median over rounds, the ratio the median of per-round ratios
to lazy. Executions, device-to-host transfers and XLA compilations are read
from torch_xla.debug.metrics over the measured steps; Dynamo graphs compiled
after warm-up are recompilations (a frame that exceeds Dynamo's recompile
limit in warm-up runs uncompiled from then on: see the warm-up count).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402

import syncfree_step  # noqa: E402  (this folder's; its model and per-round measurement)
from _harness import (Tally, interleaved, md_header, md_row, median,  # noqa: E402
                      paired_ratio, warm_up)

PATHS = ("lazy", "compiled", "whole")
SCALER = dict(init_scale=2.0 ** 16, growth_interval=4)


def _frames() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class Path(syncfree_step.Path):
    """One compared training loop; ``measure(n)`` (syncfree_step's: time,
    executions, transfers, compilations) runs n more steps."""

    def __init__(self, name, args, dev, data):
        torch.manual_seed(0)
        self.name, self.dev, self.data = name, dev, data
        self.model = syncfree_step.MNISTNet().to(dev)
        opt_cls = getattr(xla_amp.syncfree, args.optimizer)
        kw = dict(lr=args.lr, momentum=0.9) if args.optimizer == "SGD" else dict(lr=args.lr)
        self.opt = opt_cls(self.model.parameters(), **kw)
        self.scaler = xla_amp.GradScaler(**SCALER)
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.99)
        self.forward_loss = self._forward_loss
        self.step_fn = self._step
        if name == "compiled":
            self.forward_loss = torch.compile(self._forward_loss, backend="openxla")
        elif name == "whole":
            self.step_fn = torch.compile(self._step, backend="openxla")
        self.i = 0
        self.tally = Tally()  # per-round ms/step, XLA metric counts
        self.recompiles = 0
        self.warmup_graphs = 0
        self.breaks: collections.Counter = collections.Counter()

    def _forward_loss(self, x, y):
        with xla_amp.autocast(self.dev, policy="tpu"):
            return F.nll_loss(self.model(x), y)

    def _step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        loss = self.forward_loss(x, y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss

    def train_step(self):
        x, y, one, inf = self.data
        # the overflow comes through the data; a device-side factor keeps one graph
        self.step_fn(x * (inf if self.i % 5 == 4 else one), y)
        self.sched.step()
        torch_xla.sync()
        self.i += 1

    def warm_up(self, n):
        before = collections.Counter(torch._dynamo.utils.counters["graph_break"])
        frames = _frames()
        warm_up([self.train_step], n)
        self.warmup_graphs = _frames() - frames
        self.breaks = collections.Counter(torch._dynamo.utils.counters["graph_break"]) - before

    def measure(self, n):
        frames = _frames()
        super().measure(n)
        self.recompiles += _frames() - frames


def run_batch(args, dev, batch):
    data = syncfree_step.mnist_data(batch, dev)
    torch._dynamo.reset()
    paths = [Path(name, args, dev, data) for name in args.paths.split(",")]
    for p in paths:
        p.warm_up(args.warmup)
    per_round = max(1, args.steps // args.rounds)
    interleaved(paths, args.rounds, lambda p, r: p.measure(per_round))
    base = next((p.tally.ms for p in paths if p.name == "lazy"), None)
    print(f"\nMNIST CNN, batch {batch}, tpu rules (bf16), syncfree.{args.optimizer}, "
          f"GradScaler, overflow every 5th step, lr changes every step; "
          f"{args.rounds} rounds x {per_round} steps\n")
    print(md_header(["path", "ms/step (median)", "vs lazy", "executions/step", "transfers/step",
                     "XLA compiles", "Dynamo graphs: warm-up / after", "graph breaks"]))
    for p in paths:
        t = p.tally
        ratio = paired_ratio(t.ms, base) if base is not None else float("nan")
        print(md_row([p.name, f"{median(t.ms):.2f}", f"{ratio:.2f}x",
                      f"{t.per_step('ExecuteTime'):.2f}",
                      f"{t.per_step('TransferFromDeviceTime'):.2f}", t.counts["CompileTime"],
                      f"{p.warmup_graphs} / {p.recompiles}", sum(p.breaks.values())]))
    for p in paths:
        for reason, n in sorted(p.breaks.items(), key=lambda kv: -kv[1]):
            print(f"- {p.name}: {n} x {_short(reason)}")
    sys.stdout.flush()


def _short(reason: str) -> str:
    """The first line of a Dynamo graph-break reason, plus what it hit."""
    first = reason.strip().splitlines()[0]
    hit = re.search(r"qualname: ([\w.]+)", reason) or re.search(r"context: (.{0,90})", reason)
    if not hit:
        return first
    what = hit.group(1)
    if "pybind11" in what or what.startswith("pybind"):
        module = re.search(r"module: ([\w.]+)", reason)
        what = f"{module.group(1) if module else ''}.{what.rsplit('.', 1)[-1]}"
    return f"{first} ({what})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="8,32,128")
    ap.add_argument("--optimizer", choices=["SGD", "Adam", "AdamW"], default="SGD")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=200, help="measured steps per path")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10, help="steps; must include an overflow")
    ap.add_argument("--paths", default=",".join(PATHS))
    args = ap.parse_args(argv)
    if args.warmup < 5:
        ap.error("--warmup must be at least 5 (every 5th step overflows)")
    dev = torch_xla.device()
    for batch in [int(b) for b in args.batch.split(",")]:
        run_batch(args, dev, batch)


if __name__ == "__main__":
    main()
