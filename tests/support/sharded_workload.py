"""The sharded training run of benchmarks/sharded.py and tests/sharded/:
a model, a mesh, a ``ShardedPrecision`` and one sync-free step.

Models (small, random init, dropout off):

- ``lm``: a Hugging Face GPT-2 (2 layers, width 64, vocabulary 1000),
  batches of 8 sequences of 32 tokens, its own loss from ``labels``;
- ``resnet``: torchvision's ResNet with one BasicBlock per stage (ResNet-10),
  10 classes, batches of 8 images of 96x96 (image_size).

Meshes: ``1d`` -- N devices on one axis ``fsdp`` (parameters and batch
sharded over all N); ``2d`` -- 2 x N/2 devices, axes ``data`` x ``fsdp``
(parameters over ``fsdp``, the batch over both: FSDPv2's
``extra_data_axis``); ``none`` -- one device without SPMD, the reference.

Modes (``ShardedPrecision`` presets, the tpu rules forced so XLA:CPU runs
them): ``fp32``, ``amp`` (fp32 parameters, bf16 autocast), ``master``
(bf16 parameters, fp32 master shard), ``sr`` (bf16 parameters, stochastic
rounding, bf16 state), ``fp8`` (``amp`` with the Linear / Conv1D layers in
fp8, delayed scaling, xla_amp.fp8; layers whose dimensions are not multiples
of 16 kept). Every mode trains with ``xla_amp.GradScaler`` and
``syncfree.AdamW`` under ``precision.optimizer_options()``.
"""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("lm", "resnet")
MESHES = ("none", "1d", "2d")
MODES = ("fp32", "amp", "master", "sr", "fp8")
BATCH, SEQ, VOCAB, IMAGE = 8, 32, 1000, 32
BATCHES = 20  # distinct batches, cycled: a new one each step of a 20-step run (a
# few batches cycled are memorised within 20 steps, and near-zero losses
# compare as noise)
LR = {"lm": 1e-3, "resnet": 1e-4}


def precision(mode: str):
    from xla_amp.sharded import ShardedPrecision as P
    return {"fp32": P(), "amp": P.amp(torch.bfloat16, policy="tpu"),
            "fp8": P.amp(torch.bfloat16, policy="tpu"),
            "master": P.bf16_master(policy="tpu"),
            "sr": P.bf16_sr(policy="tpu")}[mode]


def build_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "lm":
        import transformers as tf
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    if name == "resnet":
        from torchvision.models.resnet import BasicBlock, ResNet
        return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    raise KeyError(name)


def image_size(name: str) -> int:
    """The ResNet's image size: the smallest from IMAGE at which no dense
    convolution's kernel is larger than its map (zoo.fitting_image: 96 px).
    At 32 px its last two stages' 3x3 kernels run over 2x2 and 1x1 maps,
    which XLA:CPU swaps and runs in its naive loop
    (docs/upstream/xla_cpu_conv_operand_swap.md): the one-device amp run took
    23.6 s at 32 px and 20.7 s at 96, the 2d-4 master run 51.8 s and 43.2."""
    from tests.support.zoo_models import fitting_image
    with torch.random.fork_rng():
        return fitting_image(lambda size: build_model(name), IMAGE)


def batches(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """BATCHES (input, target) pairs on the CPU, the same in every run."""
    image = None if name == "lm" else image_size(name)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(BATCHES):
        if name == "lm":
            x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
            out.append((x, x))
        else:
            out.append((torch.randn(BATCH, 3, image, image, generator=g),
                        torch.randint(0, 10, (BATCH,), generator=g)))
    return out


def loss_of(name: str, model, x, y) -> torch.Tensor:
    if name == "lm":
        return model(input_ids=x, labels=y).loss
    return F.cross_entropy(model(x).float(), y)


def make_mesh(kind: str, n: int):
    """(mesh, the batch dimension's mesh axes) for `kind`; SPMD is on."""
    import torch_xla.distributed.spmd as xs
    if kind == "1d":
        return xs.Mesh(np.arange(n), (n,), ("fsdp",)), "fsdp"
    if kind == "2d":
        if n % 2 or n < 4:
            raise SystemExit(f"a 2d mesh needs an even N >= 4, got {n}")
        return xs.Mesh(np.arange(n), (2, n // 2), ("data", "fsdp")), ("data", "fsdp")
    raise KeyError(kind)


class Run:
    """One model on one mesh in one mode: `step()` traces and runs a step."""

    def __init__(self, model_name: str, mesh_kind: str, mode: str, lr: float | None = None):
        import torch_xla
        import xla_amp
        from xla_amp import sharded, syncfree
        self.name, self.mesh_kind = model_name, mesh_kind
        self.precision = precision(mode)
        self.dev = torch_xla.device()
        model = build_model(model_name)
        if mode == "fp8":
            from xla_amp import fp8
            fp8.convert(model, fp8.Fp8Recipe(scaling="delayed"), unaligned="keep")
        if mesh_kind == "none":
            self.mesh, self.batch_axes = None, None
            self.model = self.precision.cast(model.to(self.dev))
        else:
            import torch_xla.runtime as xr
            import torch_xla.distributed.spmd as xs
            self.mesh, self.batch_axes = make_mesh(mesh_kind, xr.global_runtime_device_count())
            extra = {"extra_data_axis": "data"} if mesh_kind == "2d" else {}
            self.model = sharded.shard_model(model, self.precision, mesh=self.mesh,
                                             shard_output=self._shard_output, **extra)
            self._xs = xs
        self.opt = syncfree.AdamW(self.model.parameters(), lr=lr or LR[model_name],
                                  **self.precision.optimizer_options())
        if mode == "fp8":
            from xla_amp import fp8
            fp8.attach(self.opt, self.model)  # skipped steps leave the histories
        self.scaler = xla_amp.GradScaler(init_scale=2.0**10)
        self.data = [(x.to(self.dev), y.to(self.dev)) for x, y in batches(model_name)]
        if self.mesh is not None:
            for x, y in self.data:
                self._mark_batch(x)
                self._mark_batch(y)
        self.k = 0  # steps taken
        self.inject = False  # the next step puts an inf into one gradient shard

    def _mark_batch(self, t):
        self._xs.mark_sharding(t, self.mesh, (self.batch_axes,) + (None,) * (t.dim() - 1))

    def _shard_output(self, out, mesh):
        self._mark_batch(out.logits if hasattr(out, "logits") else out)

    def _forward_loss(self, x, y):
        if self.mesh is None:  # (shard_model's wrapper enters the autocast itself)
            with self.precision.autocast(self.dev):
                return loss_of(self.name, self.model, x, y)
        return loss_of(self.name, self.model, x, y)

    def step(self) -> torch.Tensor:
        import torch_xla
        x, y = self.data[self.k % BATCHES]
        self.opt.zero_grad()
        loss = self._forward_loss(x, y)
        self.scaler.scale(loss).backward()
        if self.inject:  # the last row of the first matrix's gradient: one shard's
            g = next(p.grad for p in self.model.parameters() if p.dim() == 2)
            g[-1, 0] = float("inf")
            self.inject = False
        self.scaler.step(self.opt)
        self.scaler.update()
        torch_xla.sync()
        self.k += 1
        return loss

    def snapshot(self) -> list[torch.Tensor]:
        """CPU copies of every parameter and optimizer state tensor.

        On a mesh, torch_xla 2.9 fetches a sharded tensor by compiling and
        running a graph that replicates it, one per tensor and per fetch
        (116 graphs for the LM, ~0.8 s a snapshot). Here one graph makes
        replicated copies of them all (``t * 1``: exact, and a new value the
        replicated annotation can go on), and the fetches compile nothing."""
        tensors = [p.detach() for p in self.model.parameters()]
        for p in self.model.parameters():
            tensors += [v.detach() for v in self.opt.state.get(p, {}).values()
                        if isinstance(v, torch.Tensor)]
        if self.mesh is not None:
            import torch_xla
            copies = [t * 1 for t in tensors]
            for c in copies:
                self._xs.mark_sharding(c, self.mesh, (None,) * c.dim())
            torch_xla.sync()
            tensors = copies
        return [t.cpu().clone() for t in tensors]


def configure_devices(mesh_kind: str, n: int) -> None:
    """Before torch_xla is imported: N virtual XLA:CPU devices and SPMD."""
    os.environ["PJRT_DEVICE"] = "CPU"
    if mesh_kind == "none":
        os.environ.pop("CPU_NUM_DEVICES", None)
    else:
        os.environ["CPU_NUM_DEVICES"] = str(n)
