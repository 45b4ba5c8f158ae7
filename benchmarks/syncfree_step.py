"""Sync-free AMP training step vs. the stock torch.amp path, on one XLA device.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/syncfree_step.py [--steps 50]

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

After warm-up it reads torch_xla.debug.metrics over the measured steps and
prints a markdown table: device-to-host transfers per step, executions per
step, compilations, ms/step and the speed-up over the stock path.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import xla_amp  # noqa: E402


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


def make_path(name, opt_name, params, dev, lr):
    """(optimizer, scaler, autocast factory) for one of the compared paths."""
    kw = {"sgd": dict(lr=lr, momentum=0.9), "adam": dict(lr=lr),
          "adamw": dict(lr=lr, weight_decay=1e-2)}[opt_name]
    cls = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[opt_name]
    if name == "xla_amp":
        return (getattr(xla_amp.syncfree, cls)(params, **kw), xla_amp.GradScaler(),
                lambda: _xla_amp_autocast(dev))
    if name == "torch.amp":
        return (getattr(torch.optim, cls)(params, **kw), torch.amp.GradScaler("xla"),
                lambda: torch.autocast("xla", dtype=torch.bfloat16))
    if name == "torch_xla":
        import torch_xla.amp.syncfree as txs
        return (getattr(txs, cls)(params, **kw), xla_amp.GradScaler(),
                lambda: _xla_amp_autocast(dev))
    if name == "xla_amp+optim":
        if opt_name != "sgd":
            kw["capturable"] = True
        return (getattr(torch.optim, cls)(params, **kw), xla_amp.GradScaler(),
                lambda: _xla_amp_autocast(dev))
    raise ValueError(name)


def run(name, args, dev, data):
    torch.manual_seed(0)
    model = MNISTNet().to(dev)
    opt, scaler, amp = make_path(name, args.optimizer, model.parameters(), dev, args.lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.99)
    x, y, one, inf = data

    def train_step(i):
        opt.zero_grad(set_to_none=True)
        # overflow injected through the data; a device-side factor keeps one graph
        xb = x * (inf if i % 5 == 4 else one)
        with amp():
            loss = F.nll_loss(model(xb), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        torch_xla.sync()
        return loss

    for i in range(args.warmup):
        train_step(i)
    xm.wait_device_ops()
    met.clear_all()
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = train_step(i)
    xm.wait_device_ops()
    ms = (time.perf_counter() - t0) * 1e3 / args.steps

    def count(metric):
        data = met.metric_data(metric)
        return 0 if data is None else data[0]

    row = dict(path=name, transfers=count("TransferFromDeviceTime") / args.steps,
               executions=count("ExecuteTime") / args.steps,
               compilations=count("CompileTime"), ms=ms)
    # read back only after measuring: a sanity check that training went on
    row["scale"] = scaler.get_scale()
    row["loss"] = float(loss.item())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
    ap.add_argument("--steps", type=int, default=50, help="measured steps per path")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--paths", default="xla_amp,torch.amp,torch_xla,xla_amp+optim")
    args = ap.parse_args()

    dev = torch_xla.device()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(args.batch, 1, 28, 28, generator=g).to(dev),
            torch.randint(0, 10, (args.batch,), generator=g).to(dev),
            torch.tensor(1.0).to(dev), torch.tensor(math.inf).to(dev))

    rows = [run(name, args, dev, data) for name in args.paths.split(",")]
    stock = next((r["ms"] for r in rows if r["path"] == "torch.amp"), None)
    print(f"\nMNIST CNN, batch {args.batch}, bf16 autocast, {args.optimizer}, "
          f"{args.steps} steps after {args.warmup} warm-up, overflow every 5th step, "
          f"lr changed every step; device {xm.xla_device_hw(dev)}\n")
    print("| path | D2H transfers/step | executions/step | compilations | ms/step "
          "| speed-up vs torch.amp | final scale |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        speed = f"{stock / r['ms']:.1f}x" if stock else "-"
        print(f"| {r['path']} | {r['transfers']:.2f} | {r['executions']:.2f} | "
              f"{r['compilations']} | {r['ms']:.1f} | {speed} | {r['scale']:g} |")


if __name__ == "__main__":
    main()
