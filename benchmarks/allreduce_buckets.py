"""Gradient all-reduce: bucketed (xla_amp) vs one collective per tensor.

    python benchmarks/allreduce_buckets.py [--model resnet50] [--iters 20]

Gradients shaped like a torchvision ResNet's parameters (161 tensors,
25.6 M values for ResNet-50) live on XLA:CPU; each variant builds the
replica-mode reduction (mean) and we report, per step:
  collectives   all-reduce ops in the lowered HLO
  trace ms      CPU time to build the reduction (time.thread_time)
  lower ms      CPU time to lower the graph to HLO text
Replica-mode collectives cannot execute on XLA:CPU (pytorch/xla issue 5005),
so this measures what the host does; XLA_ALWAYS_ALLREDUCE=1 makes one
process emit the collectives it would emit on a pod.
"""
import argparse
import os
import re
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["XLA_ALWAYS_ALLREDUCE"] = "1"

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torchvision  # noqa: E402

import xla_amp  # noqa: E402

from _harness import markdown_table, median  # noqa: E402  (this folder's)


class _Grads:
    """Parameters of the model's shapes with fresh gradients, and an
    optimizer over them (all_reduce_gradients takes a torch.optim.Optimizer)."""

    def __init__(self, shapes, device):
        self.params = [torch.nn.Parameter(torch.empty(0, device=device)) for _ in shapes]
        self.optimizer = torch.optim.SGD(self.params, lr=0.0)
        self.shapes = shapes
        self.device = device

    def fresh(self):
        for p, shape in zip(self.params, self.shapes):
            p.grad = None  # (a .grad must match its parameter's shape)
            p.data = torch.zeros(shape, device=self.device)
            p.grad = torch.zeros(shape, device=self.device)
        torch_xla.sync()


def per_tensor(holder):
    for p in holder.params:
        xm.all_reduce(xm.REDUCE_SUM, [p.grad], scale=1.0, groups=[])


def bucketed(holder):
    xla_amp.all_reduce_gradients(holder.optimizer, scale=1.0)


def measure(fn, holder, iters):
    trace, lower, collectives = [], [], None
    for _ in range(iters):
        holder.fresh()
        t0 = time.thread_time()
        fn(holder)
        t1 = time.thread_time()
        text = torch_xla._XLAC._get_xla_tensors_hlo([p.grad for p in holder.params])
        t2 = time.thread_time()
        trace.append(t1 - t0)
        lower.append(t2 - t1)
        collectives = len(re.findall(r" all-reduce\(", text))
    return collectives, median(trace) * 1e3, median(lower) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    model = getattr(torchvision.models, args.model)()
    shapes = [tuple(p.shape) for p in model.parameters()]
    holder = _Grads(shapes, torch_xla.device())
    n = sum(torch.Size(s).numel() for s in shapes)
    rows = {name: measure(fn, holder, args.iters)
            for name, fn in (("per-tensor", per_tensor), ("xla_amp bucketed", bucketed))}
    print(f"{args.model}: {len(shapes)} gradient tensors, {n / 1e6:.1f} M values, "
          f"bucket cap {xla_amp.distributed.DEFAULT_BUCKET_CAP_MB:g} MB, median of {args.iters}")
    print(markdown_table(["reduction", "collectives/step", "trace ms", "lower-to-HLO ms"],
                         [[name, c, f"{t:.2f}", f"{l:.2f}"] for name, (c, t, l) in rows.items()]))
    pt, bk = rows["per-tensor"], rows["xla_amp bucketed"]
    print(f"\ncollectives {pt[0] / bk[0]:.0f}x fewer, trace {pt[1] / bk[1]:.1f}x, "
          f"lowering {pt[2] / bk[2]:.1f}x faster")


if __name__ == "__main__":
    main()
