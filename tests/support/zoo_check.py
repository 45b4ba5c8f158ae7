"""The zoo's correctness sweep (tests/zoo/test_zoo.py and test_zoo_hf.py,
through a served process: tests/support/served.py; ``benchmarks/zoo.py
--check`` runs the same): every variant starts from the same weights, batch
and XLA generator state (the same dropout masks) and trains ``--steps``
steps; one JSON line per variant with the losses, graph executions and
device-to-host transfers per step (the losses are read after the last step,
so the steps themselves must show 0 transfers), and whether the step's graph
compiled at all. The first line, "eager_cpu", is PyTorch's own float32 run
on the CPU, the reference.

    python -m tests.support.zoo_check --check --models resnet18 \
        --policies fp32,tpu,cuda,cpu,cuda:float16
"""
from __future__ import annotations

import copy
import json

import torch
import torch_xla
import torch_xla.core.xla_model as xm

from xla_amp_launch.metrics import Counters
from tests.support.zoo_models import Trainer, build, loss_fn, parse_args


def eager_reference(cpu_model, x, y, loss, steps: int, lr: float) -> dict:
    """PyTorch alone, eager on the CPU, from the same weights and batch:
    ``losses``, the float32 run's `steps` losses (torch.optim.SGD with the
    sweep's momentum: what syncfree.SGD and GradScaler compute when no step
    overflows), and ``deviation``, |loss(bf16 autocast) - loss(fp32)| /
    loss(fp32) of the first step's forward: how far bf16 autocast moves this
    model's loss by itself (a deep net at random init moves by several
    percent). The bf16 forward runs first, without gradients, on the weights
    the first step starts from; in train mode it only moves the running
    statistics, which no training-mode loss reads."""
    model = copy.deepcopy(cpu_model).train()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = loss(model, x, y).item()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        value = loss(model, x, y)
        value.backward()
        opt.step()
        losses.append(value.item())
    fp32 = losses[0]
    return {"deviation": abs(low - fp32) / abs(fp32), "losses": losses}



def check(name: str, variants: list[str], steps: int, batch: int, image: int | None, lr: float,
          init_scale: float, seed: int = 0):
    dev = torch_xla.device()
    cpu_model, x, y = build(name, batch, image, seed)
    print(json.dumps({"model": name, "variant": "eager_cpu",
                      **eager_reference(cpu_model, x, y, loss_fn(name), steps, lr)}),
          flush=True)
    for variant in variants:
        row = {"model": name, "variant": variant}
        # every variant draws the same dropout masks, whatever ran before in
        # this process (a served process runs many sweeps): torch.manual_seed
        # does not reset XLA's generator
        xm.set_rng_state(seed, dev)
        try:
            trainer = Trainer(variant, cpu_model, x, y, loss_fn(name), dev, lr, init_scale)
            torch_xla.sync()
            xm.wait_device_ops()
            before = Counters.now()  # XLA metric counts over the steps
            losses = [trainer.step().detach() for _ in range(steps)]
            xm.wait_device_ops()
            counts = Counters.delta(before, Counters.now())
            row["losses"] = [float(v) for v in torch.stack(losses).cpu()]
            row["executions_per_step"] = counts["executions"] / steps
            row["transfers_per_step"] = counts["transfers"] / steps
            row["scale"] = trainer.scaler.get_scale()
            row["compilations"] = counts["compilations"]
        except Exception as e:  # reported, not raised: the sweep goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        print(json.dumps(row), flush=True)
        del row
        torch_xla.sync()


def main(argv=None):
    args, names = parse_args(argv, __doc__.split("\n\n")[0])
    for n in names:
        check(n, args.policies.split(","), args.steps, args.batch, args.image, args.lr,
              args.init_scale)


if __name__ == "__main__":
    main()
