"""Sync-free AMP training step vs. the stock torch.amp path, on one XLA device.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/syncfree_step.py [--batch 128,32,8] [--optimizer adam]

An MNIST-sized CNN (conv-bn-conv-bn-fc-fc) trains under bf16 autocast with
dynamic loss scaling; every 5th step the input batch is multiplied by inf
(so that step overflows and must be skipped) and an ExponentialLR scheduler
changes the learning rate every step. The same loop runs with:

  xla_amp          xla_amp.GradScaler + xla_amp.syncfree.<Opt>
  torch.amp        torch.amp.GradScaler("xla") + torch.optim.<Opt>    (stock)
  torch_xla        xla_amp.GradScaler + torch_xla.amp.syncfree.<Opt>
                   (PyTorch/XLA 2.9 ships no scaler for its syncfree optimizers)
  xla_amp+optim    xla_amp.GradScaler + torch.optim.<Opt>, masked step
                   (Adam/AdamW built with capturable=True so state stays on device)
  no-scaling       xla_amp.syncfree.<Opt> and no loss scaling at all, and no
                   overflow injected: what the step costs without any scaler,
                   a floor for every path above (so the best speed-up over
                   the stock path any scaler can reach on the machine that runs it)

After warm-up it reads torch_xla.debug.metrics over the measured steps and
prints a markdown table: device-to-host transfers per step, executions per
step, compilations, ms/step (median over rounds), the speed-up over the stock
path, and the time relative to PyTorch/XLA's syncfree optimizers paired by
round (median of per-round ratios: slow drifts of the machine cancel).
"""
from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

import xla_amp  # noqa: E402

from _harness import (Tally, interleaved, md_header, md_row, median,  # noqa: E402
                      paired_ratio, warm_up)  # (this folder's)


class MNISTNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.bn1 = nn.BatchNorm2d(10)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.bn2 = nn.BatchNorm2d(20)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def _xla_amp_autocast(dev):
    try:
        return xla_amp.autocast(dev, policy="cuda", dtype=torch.bfloat16)
    except ValueError:  # no "cuda" policy in this build
        return xla_amp.autocast(dev, policy="tpu", dtype=torch.bfloat16)


# Four clean steps between injected overflows: the scale doubles, then
# halves, as in a real run near its limit (the default 2000 would only ever
# shrink it here).
SCALER = dict(init_scale=2.0 ** 16, growth_interval=4)


def make_path(name, opt_name, params, dev, lr):
    """(optimizer, scaler, autocast factory) for one of the compared paths."""
    kw = {"sgd": dict(lr=lr, momentum=0.9), "adam": dict(lr=lr),
          "adamw": dict(lr=lr, weight_decay=1e-2)}[opt_name]
    cls = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[opt_name]
    if name == "xla_amp":
        return (getattr(xla_amp.syncfree, cls)(params, **kw), xla_amp.GradScaler(**SCALER),
                lambda: _xla_amp_autocast(dev))
    if name == "torch.amp":
        return (getattr(torch.optim, cls)(params, **kw), torch.amp.GradScaler("xla", **SCALER),
                lambda: torch.autocast("xla", dtype=torch.bfloat16))
    if name == "torch_xla":
        import torch_xla.amp.syncfree as txs
        return (getattr(txs, cls)(params, **kw), xla_amp.GradScaler(**SCALER),
                lambda: _xla_amp_autocast(dev))
    if name == "no-scaling":
        return (getattr(xla_amp.syncfree, cls)(params, **kw), None,
                lambda: _xla_amp_autocast(dev))
    if name == "xla_amp+optim":
        if opt_name != "sgd":
            kw["capturable"] = True
        return (getattr(torch.optim, cls)(params, **kw), xla_amp.GradScaler(**SCALER),
                lambda: _xla_amp_autocast(dev))
    raise ValueError(name)


class Path:
    """One compared training loop; ``measure(n)`` runs n more steps."""

    def __init__(self, name, args, dev, data):
        torch.manual_seed(0)
        self.name, self.data = name, data
        self.model = MNISTNet().to(dev)
        self.opt, self.scaler, self.amp = make_path(
            name, args.optimizer, self.model.parameters(), dev, args.lr)
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.99)
        self.i = 0
        self.tally = Tally()  # per-round ms/step, XLA metric counts
        self.loss = None

    def train_step(self):
        x, y, one, inf = self.data
        self.opt.zero_grad(set_to_none=True)
        # overflow injected through the data; a device-side factor keeps one graph
        if self.scaler is None:  # the no-scaling floor
            with self.amp():
                loss = F.nll_loss(self.model(x * one), y)
            loss.backward()
            self.opt.step()
        else:
            xb = x * (inf if self.i % 5 == 4 else one)
            with self.amp():
                loss = F.nll_loss(self.model(xb), y)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        self.sched.step()
        torch_xla.sync()
        self.i += 1
        self.loss = loss

    def measure(self, n):
        self.tally.measure(self.train_step, n)

    def row(self):
        t = self.tally
        return dict(path=self.name, transfers=t.per_step("TransferFromDeviceTime"),
                    executions=t.per_step("ExecuteTime"), compilations=t.counts["CompileTime"],
                    ms=median(t.ms), lo=min(t.ms), hi=max(t.ms),
                    # read back only after measuring: training went on
                    scale=self.scaler.get_scale() if self.scaler else None,
                    loss=float(self.loss.item()), per_round=t.ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    ap.add_argument("--steps", type=int, default=200, help="measured steps per path")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", default="128,32,8",
                    help="batch sizes, comma-separated: one table each, all in this run")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--paths", default="xla_amp,torch.amp,torch_xla,xla_amp+optim,no-scaling")
    args = ap.parse_args()

    dev = torch_xla.device()
    for batch in [int(b) for b in args.batch.split(",")]:
        run_batch(args, dev, batch)


def mnist_data(batch, dev):
    """(x, y, one, inf) on ``dev``: a fixed MNIST-shaped batch, and the
    device-side factors a step multiplies x by (inf: an overflow step)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, 1, 28, 28, generator=g).to(dev),
            torch.randint(0, 10, (batch,), generator=g).to(dev),
            torch.tensor(1.0).to(dev), torch.tensor(math.inf).to(dev))


def run_batch(args, dev, batch):
    data = mnist_data(batch, dev)
    paths = [Path(name, args, dev, data) for name in args.paths.split(",")]
    warm_up([p.train_step for p in paths], args.warmup)
    # Rounds interleave the paths so that load from other processes hits them
    # alike; ms/step is the median over rounds. Each round starts with another
    # path: none always follows the stock path's heavier graphs, or always leads.
    per_round = max(1, args.steps // args.rounds)
    interleaved(paths, args.rounds, lambda p, r: p.measure(per_round))
    rows = [p.row() for p in paths]
    stock = next((r["ms"] for r in rows if r["path"] == "torch.amp"), None)
    txla = next((r["per_round"] for r in rows if r["path"] == "torch_xla"), None)
    print(f"\nMNIST CNN, batch {batch}, bf16 autocast, {args.optimizer}, "
          f"{per_round * args.rounds} steps ({args.rounds} interleaved rounds, median) after "
          f"{args.warmup} warm-up, overflow every 5th step, "
          f"lr changed every step; device {xm.xla_device_hw(dev)}\n")
    print(md_header(["path", "D2H transfers/step", "executions/step", "compilations",
                     "ms/step", "min..max over rounds", "speed-up vs torch.amp",
                     "time vs torch_xla (paired)", "final scale"]))
    for r in rows:
        speed = f"{stock / r['ms']:.1f}x" if stock else "-"
        paired = f"{paired_ratio(r['per_round'], txla):.2f}" if txla else "-"
        scale = "-" if r["scale"] is None else f"{r['scale']:g}"
        print(md_row([r["path"], f"{r['transfers']:.2f}", f"{r['executions']:.2f}",
                      r["compilations"], f"{r['ms']:.1f}", f"{r['lo']:.1f}..{r['hi']:.1f}",
                      speed, paired, scale]), flush=True)


if __name__ == "__main__":
    main()
