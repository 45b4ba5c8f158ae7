"""Trace cost of one sync-free optimizer step (no execution counted).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/optimizer_trace.py [--iters 400]

For SGD (momentum 0.9), Adam and AdamW over two parameter lists -- the
MNIST-sized CNN of benchmarks/syncfree_step.py (12 tensors) and ResNet-18
(62 tensors, 11.7M elements) -- it times, on the tracing thread only
(time.thread_time, so other load on the machine and XLA's execution threads
do not count):

  step    optimizer.step(found_inf=flag): building the lazy IR
  sync    the torch_xla.sync() after it: graph walk, hashing, cache lookup
          and launch (the graph is cached after the first steps)

for each optimizer module given in --modules (default: ours and PyTorch/XLA's
torch_xla.amp.syncfree). The variants alternate step by step, in turn first
(whatever runs right after the other's graph launch competes with that
graph's execution on a 2-core machine, and the machine drifts over blocks of
steps); each cell is the median µs per step. Extra modules (e.g. an older
copy of xla_amp.syncfree on PYTHONPATH) can be compared with
--modules xla_amp.syncfree,my_copy.
"""
from __future__ import annotations

import argparse
import importlib
import os
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

import xla_amp  # noqa: E402,F401

from _harness import interleaved, md_header, md_row, median, warm_up  # noqa: E402 (this folder's)

OPTS = {"sgd": ("SGD", dict(lr=1e-2, momentum=0.9)),
        "adam": ("Adam", dict(lr=1e-3)),
        "adamw": ("AdamW", dict(lr=1e-3, weight_decay=1e-2))}


def param_shapes(model: str) -> list[tuple[int, ...]]:
    if model == "cnn":  # benchmarks/syncfree_step.py's MNISTNet
        return [(10, 1, 5, 5), (10,), (10,), (10,), (20, 10, 5, 5), (20,), (20,), (20,),
                (50, 320), (50,), (10, 50), (10,)]
    import torchvision
    return [tuple(p.shape) for p in torchvision.models.resnet18().parameters()]


class Variant:
    def __init__(self, module, opt, model, dev):
        self.label = module
        mod = importlib.import_module(module)
        cls_name, kw = OPTS[opt]
        g = torch.Generator().manual_seed(0)
        shapes = param_shapes(model)
        self.params = [torch.randn(s, generator=g).to(dev).requires_grad_() for s in shapes]
        for p in self.params:
            p.grad = (torch.randn(p.shape, generator=g) * 1e-2).to(dev)
        self.opt = getattr(mod, cls_name)(self.params, **kw)
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.999)
        self.flags = [torch.tensor(0.0).to(dev), torch.tensor(1.0).to(dev)]
        self.i = 0
        self.nparams = len(shapes)

    def one(self):
        """One step: (step, sync) seconds of tracing-thread CPU time."""
        flag = self.flags[int(self.i % 5 == 4)]
        t0 = time.thread_time()
        self.opt.step(found_inf=flag)
        t1 = time.thread_time()
        torch_xla.sync()
        t2 = time.thread_time()
        self.sched.step()  # lr changes every step, as in training
        self.i += 1
        return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=400, help="measured steps per cell")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--models", default="cnn,resnet18")
    ap.add_argument("--optimizers", default="sgd,adam,adamw")
    ap.add_argument("--modules", default="xla_amp.syncfree,torch_xla.amp.syncfree")
    args = ap.parse_args()
    dev = torch_xla.device()
    modules = args.modules.split(",")
    print(f"trace cost per optimizer step, µs of tracing-thread CPU time "
          f"(median of {args.iters} steps, variants alternating step by step)\n")
    print(md_header(["model (tensors)", "optimizer"]
                    + [f"{m} {part}" for m in modules for part in ("step", "sync")]))
    for model in args.models.split(","):
        for opt in args.optimizers.split(","):
            vs = [Variant(m, opt, model, dev) for m in modules]
            warm_up([v.one for v in vs], args.warmup)
            # a round is one step of each variant
            times = interleaved(vs, args.iters, lambda v, i: v.one(), order="alternate")
            cells = [f"{median(t[part] * 1e6 for t in times[v]):.0f}"
                     for v in vs for part in (0, 1)]
            print(md_row([f"{model} ({vs[0].nparams})", opt] + cells), flush=True)
            del vs, times
            xm.wait_device_ops()


if __name__ == "__main__":
    main()
