"""Real models under every policy: torchvision's zoo, a transformer layer,
and Hugging Face Transformers and timm models (tests/support/zoo_models.py
builds them and their step).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py [--models resnet18,...|all]
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --check --models resnet18 \
        --policies fp32,tpu,cuda,cpu,cuda:float16

Each model trains with xla_amp.autocast + GradScaler + syncfree.SGD under
each variant (fp32, tpu, cuda, cpu; zoo_models.py's docstring has their
forms).

``--check``: the correctness sweep tests/zoo/ runs (tests/support/zoo_check.py:
losses, executions and transfers per step, one JSON line per variant).

Timing mode (default): after a warm-up that compiles every variant's graphs,
interleaved rounds of steps per variant, each round led by another variant;
prints per model and policy the median ms/step, the median per-round ratio
to the tpu rules and to fp32, and the number of convert ops in the step's
HLO. XLA:CPU computes bfloat16 no faster than float32: the table shows what
the XLA adaptations (policies/_xla_adaptations.toml) cost against the tpu
rules, which need none.
"""
from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch_xla  # noqa: E402

from tests.support import zoo_check  # noqa: E402
from tests.support.zoo_models import VARIANTS, Trainer, build, loss_fn, parse_args  # noqa: E402
from _harness import (interleaved, md_header, md_row, median, paired_ratio,  # noqa: E402
                      time_steps, warm_up)  # (this folder's)


def timed(names, rounds: int, steps: int, batch: int, image: int | None):
    dev = torch_xla.device()
    size = f"{image}x{image}" if image else "fitting_image's"
    print(f"Step time by policy (batch {batch}, {size} images; median of "
          f"{rounds} interleaved rounds of {steps} steps; ratios are medians of "
          "per-round ratios)\n")
    print(md_header(["model", "policy", "ms/step", "vs tpu", "vs fp32",
                     "converts in step HLO"]))
    for name in names:
        cpu_model, x, y = build(name, batch, image)
        trainers = {v: Trainer(v, cpu_model, x, y, loss_fn(name), dev, lr=1e-3)
                    for v in VARIANTS}
        converts = {v: t.converts() for v, t in trainers.items()}
        # warm-up: both graphs of each variant
        warm_up([t.step for t in trainers.values()], 3)
        times = interleaved(VARIANTS, rounds,
                            lambda v, r, ts=trainers: time_steps(ts[v].step, steps))
        for v in VARIANTS:
            print(md_row([name, v, f"{median(times[v]):.1f}",
                          f"{paired_ratio(times[v], times['tpu']):.3f}",
                          f"{paired_ratio(times[v], times['fp32']):.3f}", converts[v]]),
                  flush=True)
        del trainers


def main(argv=None):
    args, names = parse_args(argv, __doc__.split("\n\n")[0])
    if args.check:
        zoo_check.main(argv)
    else:
        timed(names, args.rounds, args.steps, args.batch, args.image)


if __name__ == "__main__":
    main()
