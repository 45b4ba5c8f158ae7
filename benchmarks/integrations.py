"""Training through Lightning, Accelerate and the Transformers Trainer: each
framework's stock mixed precision on XLA vs the same framework with xla_amp
vs a plain xla_amp loop, side by side in one run.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/integrations.py [--rounds 5] [--block 10] [--precisions bf16,fp16]
        [--frameworks lightning,accelerate,transformers]

One model for all: GPT-2 from a small config (2 layers, d=128, 4 heads,
context 128, a byte vocabulary, dropout off), batch 8 of windows of the
Python standard library's sources (tests/support/byte_lm.py), AdamW at lr 1e-3, no
gradient clipping. Rows, per framework:

  plain     xla_amp.autocast + (fp16: xla_amp.GradScaler) + syncfree.AdamW,
            a hand-written loop: the floor each framework is held to
  stock     the framework's own XLA mixed precision, xla_amp not imported:
            Lightning  precision="bf16-true" (XLA_USE_BF16=1) / "16-true"
                       (XLA_USE_F16=1, which torch_xla 2.9 no longer reads)
            Accelerate mixed_precision="bf16" / "fp16" (torch.autocast("xla")
                       with PyTorch/XLA's kernels; fp16: torch.amp.GradScaler)
            Trainer    --bf16 / --fp16 (through Accelerate), optim adamw_torch
  xla_amp   the framework with xla_amp: XLAAMPPrecision("bf16-mixed" /
            "16-mixed"), xla_amp.integrations.accelerate.Accelerator (with
            syncfree.AdamW), XLAAMPTrainer

Every row runs in its own process (so XLA_USE_BF16 and the absence of
xla_amp stay where they belong) inside the framework's own loop, paced from
a step-end callback (_harness.Pacer): after warm-up, blocks of steps are
timed in interleaved rounds, one process busy at a time. Reported: median
ms/step and steps/s, executions and device-to-host transfers per step, and
ratios paired by round: xla_amp's row against plain and against stock.
Lightning on XLA:CPU needs its TPU probe patched (no TPU chip here; the
device it then uses is XLA:CPU), as in tests/integrations/test_integrations_lightning.py.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")

from _harness import (Pacer, PacedWorker, interleaved, markdown_table, median,  # noqa: E402
                      paired_ratio)

CTX, BATCH, LR = 128, 8, 1e-3
KINDS = ("plain", "stock", "xla_amp")
FRAMEWORKS = ("lightning", "accelerate", "transformers")


def model_and_batches(steps: int):
    import torch
    import transformers
    from tests.support.byte_lm import corpus
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=CTX, n_embd=128, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    windows = corpus(64 * CTX).view(64, CTX)
    batches = [windows[(i * BATCH) % 64:(i * BATCH) % 64 + BATCH] for i in range(steps)]
    return transformers.GPT2LMHeadModel(config), batches


# ---------------------------------------------------------------- workers


def plain(precision, pacer, steps):
    import torch
    import torch_xla
    import xla_amp
    model, batches = model_and_batches(steps)
    device = torch_xla.device()
    model.to(device)
    opt = xla_amp.syncfree.AdamW(model.parameters(), lr=LR)
    scaler = xla_amp.GradScaler() if precision == "fp16" else None
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    for x in batches:
        x = x.to(device)
        opt.zero_grad()
        with xla_amp.autocast(device, dtype=dtype):
            loss = model(input_ids=x, labels=x).loss
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        torch_xla.sync()
        pacer.tick()


def lightning(kind, precision, pacer, steps):
    import torch
    import lightning as L
    import torch_xla._internal.tpu as tpu
    tpu.num_available_devices = lambda: 1  # Lightning's TPU probe (see the docstring)
    model, batches = model_and_batches(steps)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.gpt = model

        def training_step(self, x, i):
            return self.gpt(input_ids=x, labels=x).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    class Tick(L.Callback):
        def on_train_batch_end(self, *args):
            pacer.tick()

    if kind == "stock":
        extra = {"precision": "bf16-true" if precision == "bf16" else "16-true"}
    else:
        from xla_amp.integrations.lightning import XLAAMPPrecision
        extra = {"plugins": [XLAAMPPrecision("bf16-mixed" if precision == "bf16" else "16-mixed")]}
    trainer = L.Trainer(accelerator="tpu", devices=1, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Tick()], **extra)
    trainer.fit(Module(), torch.utils.data.DataLoader(batches, batch_size=None))


def accelerate(kind, precision, pacer, steps):
    import torch
    import torch_xla
    model, batches = model_and_batches(steps)
    if kind == "stock":
        from accelerate import Accelerator
    else:
        from xla_amp.integrations.accelerate import Accelerator
    acc = Accelerator(mixed_precision=precision)
    model.to(acc.device)
    if kind == "stock":
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
    else:
        import xla_amp
        opt = xla_amp.syncfree.AdamW(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    for x in batches:
        x = x.to(acc.device)
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        pacer.tick()


def transformers_trainer(kind, precision, pacer, steps):
    import transformers
    model, batches = model_and_batches(steps)
    if kind == "stock":
        cls = transformers.Trainer
    else:
        from xla_amp.integrations.transformers import XLAAMPTrainer as cls

    class Tick(transformers.TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            pacer.tick()

    args = transformers.TrainingArguments(
        output_dir="/tmp/xla_amp_bench_trainer", max_steps=steps,
        per_device_train_batch_size=BATCH, learning_rate=LR, optim="adamw_torch",
        max_grad_norm=0.0, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, seed=0, bf16=precision == "bf16", fp16=precision == "fp16",
        # the model's default, as in the other rows: the Trainer's default
        # (False) makes Transformers 5.23's GPT-2 read its position ids back
        # to the host every forward (masking_utils.find_packed_sequence_indices,
        # when there is neither a cache nor an attention mask): one transfer
        # and one more execution a step, stock or not
        use_cache=True)
    data = [{"input_ids": w, "labels": w} for b in batches for w in b]
    cls(model=model, args=args, train_dataset=data, callbacks=[Tick()]).train()


def worker(framework, kind, precision, warmup, block, steps):
    pacer = Pacer(warmup, block)
    if kind == "stock":  # the stock rows must run without xla_amp's engine
        tick = pacer.tick

        def checked():
            assert "xla_amp" not in sys.modules, f"{framework} stock imported xla_amp"
            tick()
        pacer.tick = checked
    if kind == "plain":
        plain(precision, pacer, steps)
    elif framework == "lightning":
        lightning(kind, precision, pacer, steps)
    elif framework == "accelerate":
        accelerate(kind, precision, pacer, steps)
    else:
        transformers_trainer(kind, precision, pacer, steps)
    pacer.tick()  # the run ended early: the parent reads the error below
    raise SystemExit(f"{framework} {kind} {precision}: the loop ended at step {pacer.n}")


# ----------------------------------------------------------------- parent


def run(framework, precision, rounds, block, warmup):
    """One framework at one precision: its three rows, interleaved."""
    steps = warmup + rounds * block
    workers = {}
    try:
        for kind in KINDS:  # one after another: each compiles in its warm-up
            workers[kind] = PacedWorker(__file__, ["--worker", framework, kind, precision,
                                                   str(warmup), str(block), str(steps)])
        results = interleaved(KINDS, rounds, lambda kind, r: workers[kind].block())
    finally:
        for w in workers.values():
            w.close()
    ms = {kind: [r["ms"] for r in results[kind]] for kind in KINDS}
    rows = []
    for kind in KINDS:
        per = {k: sum(r["counts"][k] for r in results[kind]) / (rounds * block)
               for k in ("ExecuteTime", "TransferFromDeviceTime")}
        ratios = [f"{paired_ratio(ms[other], ms[kind]):.2f}" if kind == "xla_amp" else ""
                  for other in ("plain", "stock")]
        rows.append([framework, kind, precision, f"{median(ms[kind]):.1f}",
                     f"{1e3 / median(ms[kind]):.2f}", f"{per['ExecuteTime']:.2f}",
                     f"{per['TransferFromDeviceTime']:.2f}", *ratios])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block", type=int, default=10, help="steps per timed block")
    # XLA:CPU runs float16 dots some 80x slower than bfloat16 ones (3.4 s a
    # step here): the fp16 rows get fewer, shorter blocks
    p.add_argument("--fp16_rounds", type=int, default=3)
    p.add_argument("--fp16_block", type=int, default=2)
    p.add_argument("--precisions", default="bf16,fp16")
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        fw, kind, precision, warmup, block, steps = a.worker
        return worker(fw, kind, precision, int(warmup), int(block), int(steps))
    unknown = set(a.frameworks.split(",")) - set(FRAMEWORKS)
    if unknown:
        p.error(f"--frameworks: unknown {sorted(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    rows = []
    for fw in a.frameworks.split(","):
        for precision in a.precisions.split(","):
            fp16 = precision == "fp16"
            rows += run(fw, precision, a.fp16_rounds if fp16 else a.rounds,
                        a.fp16_block if fp16 else a.block, a.warmup)
    print(markdown_table(["framework", "path", "precision", "ms/step", "steps/s", "exec/step",
                          "transfers/step", "plain ÷ xla_amp", "stock ÷ xla_amp"], rows))


if __name__ == "__main__":
    main()
