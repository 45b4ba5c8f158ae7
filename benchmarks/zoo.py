"""Real models under every policy: torchvision's zoo, a transformer layer,
and Hugging Face Transformers and timm models (benchmarks/zoo_hf.py).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py [--models resnet18,...|all]
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --check --models resnet18 \
        --policies fp32,tpu,cuda,cpu,cuda:float16

Each model (10 classes, small images: fitting_image) trains with xla_amp.autocast +
GradScaler + syncfree.SGD(momentum=0.9) under each variant: ``fp32`` (no
autocast), ``tpu``, ``cuda``, ``cpu`` (bfloat16 unless ``policy:dtype``);
``+compiled`` after a variant (``tpu+compiled``) runs its forward and loss
through ``torch.compile(backend="openxla")``, the backward, scaler and
optimizer lazily after it (the step docs/compiled.md recommends).

``--check`` (what tests/zoo/test_zoo.py runs): every variant starts from the same
weights, batch and XLA generator state (the same dropout masks) and trains
``--steps`` steps; one JSON line per variant
with the losses, graph executions and device-to-host transfers per step
(the losses are read after the last step, so the steps themselves must show
0 transfers), and whether the step's graph compiled at all.

Timing mode (default): after a warm-up that compiles every variant's graphs,
interleaved rounds of steps per variant, each round led by another variant;
prints per model and policy the median ms/step, the median per-round ratio
to the tpu rules and to fp32, and the number of convert ops in the step's
HLO. XLA:CPU computes bfloat16 no faster than float32: the table shows what
the XLA adaptations (policies/_xla_adaptations.toml) cost against the tpu
rules, which need none.
"""
from __future__ import annotations

import argparse
import json
import os
import re

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

import xla_amp  # noqa: E402

import zoo_hf  # noqa: E402  (this folder's, as _harness)
from _harness import (Tally, interleaved, md_header, md_row, median,  # noqa: E402
                      paired_ratio, time_steps, warm_up)  # (this folder's)

TORCHVISION = ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0",
               "convnext_tiny", "densenet121", "regnet_y_400mf", "shufflenet_v2_x0_5",
               "vit_b_16")
MODELS = TORCHVISION + ("transformer_layer",) + zoo_hf.MODELS
NON_IMAGE = ("transformer_layer",) + zoo_hf.HF
DEFAULT_TIMED = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "transformer_layer")
VARIANTS = ("fp32", "tpu", "cuda", "cpu")


class TransformerClassifier(nn.Module):
    """nn.TransformerEncoderLayer over 16 tokens, mean-pooled, 10 classes."""

    def __init__(self, d_model=64, nhead=4, vocab=100):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=128,
                                                dropout=0.0, batch_first=True)
        self.head = nn.Linear(d_model, 10)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)).mean(1))


# The image models' smallest input, and the steps up from it (fitting_image).
IMAGE, IMAGE_STEP = 64, 32


def fitting_image(make, image: int) -> int:
    """The smallest image size, from `image` up in steps of IMAGE_STEP, at
    which no dense convolution (groups=1) of the model ``make(size)`` builds
    has a kernel larger than its input. XLA:CPU swaps such a convolution's
    operands (a 3x3 kernel over a ResNet's last 2x2 maps at 64 px becomes a
    2x2 window with ``rhs_reversal``), and its Eigen path does not take the
    swapped form: the naive loop runs it 6-20x slower
    (docs/upstream/xla_cpu_conv_operand_swap.md): ResNet-18's lazy step took
    4.2 s at 64 px, 0.9-1.2 s at 96. Probed with one eager forward on
    the CPU per size, in eval mode; refused past 4x `image` (a kernel over a
    map that no input size grows, as after an adaptive pooling)."""
    start = image
    while True:
        model, seen = make(image).eval(), []
        for conv in model.modules():
            if isinstance(conv, nn.Conv2d) and conv.groups == 1:
                conv.register_forward_pre_hook(lambda c, args: seen.append(
                    (c.kernel_size, tuple(args[0].shape[2:]))))
        with torch.no_grad():
            model(torch.zeros(1, 3, image, image))
        over = [(k, s) for k, s in seen if k[0] * k[1] > s[0] * s[1]]
        if not over:
            return image
        if image + IMAGE_STEP > 4 * start:
            raise ValueError(f"no image size from {start} to {image} px gives every dense "
                             f"convolution a map at least its kernel's size: kernel {over[0][0]} "
                             f"over a {over[0][1]} map at {image} px")
        image += IMAGE_STEP


def build(name: str, batch: int, image: int | None = None, seed: int = 0):
    """(model on CPU, input batch, targets) for `name`, deterministic: the
    same weights whatever the image size. An image model's images are
    `image` pixels square, or by default the smallest fitting_image from
    IMAGE."""
    if image is None and name not in NON_IMAGE:
        image = fitting_image(lambda size: _build(name, 1, size, seed)[0], IMAGE)
    return _build(name, batch, image, seed)


def _build(name: str, batch: int, image: int | None, seed: int):
    torch.manual_seed(seed)
    if name in zoo_hf.MODELS:
        return zoo_hf.build(name, batch, image)
    if name == "transformer_layer":
        model = TransformerClassifier()
        x = torch.randint(0, 100, (batch, 16))
    else:
        import torchvision
        kwargs = {"image_size": image} if name.startswith("vit") else {}
        model = getattr(torchvision.models, name)(num_classes=10, **kwargs)
        x = torch.randn(batch, 3, image, image)
    return model, x, torch.randint(0, 10, (batch,))


def loss_fn(name: str):
    """(model, x, y) -> the training loss of model `name`."""
    if name in zoo_hf.MODELS:
        return zoo_hf.loss_fn(name)
    return lambda model, x, y: F.cross_entropy(model(x), y)


def parse_variant(v: str) -> tuple[str, torch.dtype | None, bool]:
    """(policy, dtype, compiled) of ``policy[:dtype][+compiled]``."""
    rest, plus, mode = v.partition("+")
    policy, _, dtype = rest.partition(":")
    if (policy != "fp32" and policy not in xla_amp.policies.names()) or plus and mode != "compiled":
        raise SystemExit(f"unknown variant {v!r}: fp32 or a policy name ({', '.join(VARIANTS)}),"
                         " then optionally :dtype and +compiled")
    low = getattr(torch, dtype) if dtype else (None if policy == "fp32" else torch.bfloat16)
    return policy, low, bool(plus)


class Trainer:
    """One variant's model copy, optimizer and scaler; `step()` traces one
    training step and syncs (one graph)."""

    def __init__(self, variant: str, cpu_model, x, y, loss, dev, lr: float,
                 init_scale: float = 2.0**16):
        self.policy, self.dtype, compiled = parse_variant(variant)
        self.model = _copy(cpu_model).to(dev)
        self.x, self.y, self.dev = x.to(dev), y.to(dev), dev
        self.loss = loss  # (model, x, y) -> loss: loss_fn(name)
        self.opt = xla_amp.syncfree.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scaler = xla_amp.GradScaler(init_scale=init_scale)
        self.forward_loss = self._forward_loss
        if compiled:
            import torch._dynamo
            torch._dynamo.reset()  # no guards or graphs of another variant's model
            self.forward_loss = torch.compile(self._forward_loss, backend="openxla")

    def _forward_loss(self, x, y) -> torch.Tensor:
        with xla_amp.autocast(self.dev, enabled=self.policy != "fp32",
                              policy=None if self.policy == "fp32" else self.policy,
                              dtype=self.dtype):
            return self.loss(self.model, x, y)

    def trace(self) -> torch.Tensor:
        self.opt.zero_grad()
        loss = self.forward_loss(self.x, self.y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss

    def step(self) -> torch.Tensor:
        loss = self.trace()
        torch_xla.sync()
        return loss

    def converts(self) -> int:
        """convert ops in the HLO of one step (traced, not run)."""
        loss = self.trace()
        live = [loss, *self.model.parameters(), *self.model.buffers()]
        live += [t for s in self.opt.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor)]
        hlo = torch_xla._XLAC._get_xla_tensors_hlo(live)
        torch_xla.sync()
        return len(re.findall(r"\bconvert\(", hlo))


def _copy(model):
    import copy
    return copy.deepcopy(model)


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
    model = _copy(cpu_model).train()
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
            losses, tally = [], Tally()  # XLA metric counts over the steps
            tally.measure(lambda: losses.append(trainer.step().detach()), steps)
            row["losses"] = [float(v) for v in torch.stack(losses).cpu()]
            row["executions_per_step"] = tally.per_step("ExecuteTime")
            row["transfers_per_step"] = tally.per_step("TransferFromDeviceTime")
            row["scale"] = trainer.scaler.get_scale()
            row["compilations"] = tally.counts["CompileTime"]
        except Exception as e:  # reported, not raised: the sweep goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        print(json.dumps(row), flush=True)
        del row
        torch_xla.sync()


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_TIMED),
                    help="comma-separated, or 'all': " + ", ".join(MODELS))
    ap.add_argument("--check", action="store_true", help="correctness sweep, JSON lines")
    ap.add_argument("--policies", default=",".join(VARIANTS),
                    help="--check variants: fp32 or policy[:dtype]")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=None,
                    help=f"image models' size (default: the smallest from {IMAGE} at which "
                    "no dense convolution's kernel is larger than its input: fitting_image)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--init_scale", type=float, default=2.0**16, help="GradScaler's")
    args = ap.parse_args(argv)
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model {n!r}; one of {', '.join(MODELS)}")
    if args.check:
        for n in names:
            check(n, args.policies.split(","), args.steps, args.batch, args.image, args.lr,
                  args.init_scale)
    else:
        timed(names, args.rounds, args.steps, args.batch, args.image)


if __name__ == "__main__":
    main()
