"""The model zoo's models and training step, shared by benchmarks/zoo.py
(timing) and tests/support/zoo_check.py (the correctness sweep of
tests/zoo/): torchvision's zoo, a transformer layer, and Hugging Face
Transformers and timm models (tests/support/zoo_hf.py).

Each model (10 classes, small images: fitting_image) trains with xla_amp.autocast +
GradScaler + syncfree.SGD(momentum=0.9) under each variant: ``fp32`` (no
autocast), ``tpu``, ``cuda``, ``cpu`` (bfloat16 unless ``policy:dtype``);
``+compiled`` after a variant (``tpu+compiled``) runs its forward and loss
through ``torch.compile(backend="openxla")``, the backward, scaler and
optimizer lazily after it (the step docs/compiled.md recommends).
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402

from tests.support import zoo_hf  # noqa: E402

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


def parse_args(argv, description: str):
    """The zoo's command line (benchmarks/zoo.py and tests/support/zoo_check.py
    alike): (args, the model names), every name checked."""
    ap = argparse.ArgumentParser(description=description)
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
    return args, names
