"""What the numerics tools cost on the MNIST training step.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/numerics_tools.py [--rounds 6] [--steps 20]

The launcher's MNIST network (xla_amp_launch.digits.MNISTNet, batch 128,
28x28) trains with xla_amp.autocast (tpu rules) + GradScaler +
syncfree.SGD; every 5th step overflows (an inf input, through a device-side
factor so the graph stays one). Variants, each its own model, stepped in
interleaved rounds after a warm-up that covers every graph variant:

  plain     the step as the launcher runs it
  watch     the same with xla_amp.watch_nonfinite(model) installed
  record    the same with autocast(..., record=True) every step
  fused     GradScaler's unscale as before overflow_report existed: PyTorch/
            XLA's fused check-and-unscale, no per-gradient flags (so
            plain/fused is what the flags cost)

Printed: ms/step (median of the rounds' medians), the ratio to plain paired
by round (median of per-round ratios: slow drifts of the machine cancel),
and transfers / executions / compilations per measured step. Target: watch
<= 1.05x plain.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402
from xla_amp.scaler import _unscale as _scaler_unscale  # noqa: E402
from xla_amp_launch.digits import MNISTNet  # noqa: E402

from _harness import (Tally, interleaved, md_header, md_row, median,  # noqa: E402
                      paired_ratio, warm_up)  # (this folder's)

PER_GRADIENT_UNSCALE = _scaler_unscale.unscale


def fused_unscale(grads, inv_scale):
    """found_inf from PyTorch/XLA's fused op; flags all False (not computed)."""
    found, flags = {}, []
    with torch.no_grad():
        for device, per_dtype in grads.items():
            f = torch.zeros((), dtype=torch.float32, device=device)
            positions = []
            for entries in per_dtype.values():  # float32 gradients here
                torch._amp_foreach_non_finite_check_and_unscale_(
                    [g for g, _ in entries], f, inv_scale.to(device))
                positions += [pos for _, pos in entries]
            found[device] = f
            flags.append((positions, torch.zeros(len(positions), dtype=torch.bool,
                                                 device=device)))
    return found, flags


class Variant:
    def __init__(self, name, dev, data):
        torch.manual_seed(0)
        self.name, self.dev, self.data = name, dev, data
        self.model = MNISTNet().to(dev)
        self.opt = xla_amp.syncfree.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.scaler = xla_amp.GradScaler(growth_interval=4)
        self.watch = xla_amp.watch_nonfinite(self.model) if name == "watch" else None
        self.i = 0
        self.tally = Tally()  # per-round ms/step, XLA metric counts

    def step(self):
        _scaler_unscale.unscale = (fused_unscale if self.name == "fused"
                                   else PER_GRADIENT_UNSCALE)
        x, y, one, inf = self.data
        self.opt.zero_grad(set_to_none=True)
        xb = x * (inf if self.i % 5 == 4 else one)
        with xla_amp.autocast(self.dev, policy="tpu", record=self.name == "record"):
            loss = F.cross_entropy(self.model(xb), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        torch_xla.sync()
        self.i += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    dev = torch_xla.device()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(args.batch, 1, 28, 28, generator=g).to(dev),
            torch.randint(0, 10, (args.batch,), generator=g).to(dev),
            torch.tensor(1.0).to(dev), torch.tensor(float("inf")).to(dev))
    variants = [Variant(name, dev, data) for name in ("plain", "watch", "record", "fused")]
    # warm-up: clean and overflow steps, every graph variant
    warm_up([v.step for v in variants], 10)
    interleaved(variants, args.rounds, lambda v, r: v.tally.measure(v.step, args.steps),
                order="alternate")
    plain = variants[0].tally
    print(f"MNIST step (batch {args.batch}), {args.rounds} rounds x {args.steps} steps, "
          "every 5th step overflows\n")
    print(md_header(["variant", "ms/step", "vs plain", "transfers/step", "executions/step",
                     "compilations"]))
    for v in variants:
        t = v.tally
        print(md_row([v.name, f"{median(t.ms):.2f}", f"{paired_ratio(t.ms, plain.ms):.3f}",
                      f"{t.per_step('TransferFromDeviceTime'):.2f}",
                      f"{t.per_step('ExecuteTime'):.2f}", t.counts["CompileTime"]]))
    report = variants[1].watch.report()
    print(f"\nwatch.report() after the run: {report}")


if __name__ == "__main__":
    main()
