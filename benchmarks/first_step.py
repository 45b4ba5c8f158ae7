"""Start-up cost of a training run: compilations and wall time of the first
steps, each run in a fresh process (nothing compiled yet, as a user's job
starts).

    PJRT_DEVICE=CPU .venv/bin/python -P benchmarks/first_step.py [--model resnet18] [--rounds 3]

Paths (a real model from tests/support/zoo_models.py, SGD with momentum 0.9, bf16
autocast under the tpu rules, dynamic loss scaling):

  xla_amp     xla_amp.syncfree.SGD + xla_amp.GradScaler
  torch_xla   torch_xla.amp.syncfree.SGD + xla_amp.GradScaler
  torch.amp   torch.optim.SGD + torch.amp.GradScaler("xla") under
              torch.autocast("xla") (the stock path)

Per path: the XLA compilations of each of the first ``--steps`` steps, and
the wall time of each (tracing, compiling and running; the device waited
for). A step whose graph differs from the next one's compiles the whole
model's step again: on a TPU, minutes for a large model. Rounds are
interleaved, each led by another path; the figures are medians over rounds.
"""
from __future__ import annotations

import argparse
import os
import time

import _harness  # (this folder's)

PATHS = ("xla_amp", "torch_xla", "torch.amp")


def _worker(path: str, model_name: str, steps: int, batch: int, image: int) -> dict:
    import torch
    import torch.nn.functional as F
    import torch_xla

    import xla_amp
    from tests.support import zoo_models as zoo

    dev = torch_xla.device()
    cpu_model, x, y = zoo.build(model_name, batch, image)
    model = cpu_model.to(dev)
    x, y = x.to(dev), y.to(dev)
    params = model.parameters()
    if path == "xla_amp":
        opt, scaler = xla_amp.syncfree.SGD(params, lr=1e-3, momentum=0.9), xla_amp.GradScaler()
    elif path == "torch_xla":
        import torch_xla.amp.syncfree as txs
        opt, scaler = txs.SGD(params, lr=1e-3, momentum=0.9), xla_amp.GradScaler()
    else:
        opt, scaler = torch.optim.SGD(params, lr=1e-3, momentum=0.9), torch.amp.GradScaler("xla")

    def amp():
        if path == "torch.amp":
            return torch.autocast("xla", dtype=torch.bfloat16)
        return xla_amp.autocast(dev, policy="tpu")

    loss_fn = zoo.loss_fn(model_name)
    torch_xla.sync()
    _harness.wait_device()
    compiles, seconds = [], []
    for _ in range(steps):
        before = _harness.counts(("CompileTime",))["CompileTime"]
        t0 = time.perf_counter()
        opt.zero_grad()
        with amp():
            loss = loss_fn(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        _harness.wait_device()
        seconds.append(time.perf_counter() - t0)
        compiles.append(_harness.counts(("CompileTime",))["CompileTime"] - before)
    return {"compiles": compiles, "seconds": seconds,
            "loss": float(loss.detach().cpu())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _harness.print_result(_worker(args.worker, args.model, args.steps, args.batch,
                                      args.image))
        return
    paths = args.paths.split(",")
    for p in paths:
        if p not in PATHS:
            raise SystemExit(f"unknown path {p!r}; one of {', '.join(PATHS)}")
    env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
    common = ["--model", args.model, "--steps", str(args.steps), "--batch", str(args.batch),
              "--image", str(args.image)]
    runs = _harness.interleaved(paths, args.rounds, lambda p, r: _harness.run_worker(
        __file__, [*common, "--worker", p], f"{p} (round {r})", env))
    print(f"{args.model}, batch {args.batch}, {args.image}x{args.image}; medians of "
          f"{args.rounds} rounds, a fresh process each\n")
    steps = range(args.steps)
    cols = ["path"] + [f"compilations, step {i + 1}" for i in steps] + \
        [f"s, step {i + 1}" for i in steps] + [f"s to step {args.steps}"]
    rows = []
    for p in paths:
        rs = runs[p]
        comp = [sorted({r["compiles"][i] for r in rs}) for i in steps]
        secs = [_harness.median([r["seconds"][i] for r in rs]) for i in steps]
        total = _harness.median([sum(r["seconds"]) for r in rs])
        rows.append([p, *("/".join(map(str, c)) for c in comp),
                     *(f"{s:.1f}" for s in secs), f"{total:.1f}"])
    print(_harness.markdown_table(cols, rows))


if __name__ == "__main__":
    main()
