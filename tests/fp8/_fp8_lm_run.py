"""The training runs of tests/fp8/test_fp8_lm.py, in a process of their
own (``python -m tests.fp8._fp8_lm_run``, from the repository root): a
GPT-2-shaped LM trained under bf16 AMP, then again from the same
initialisation and batches with its Linear/Conv1D layers in fp8 (delayed
scaling). Prints one JSON object: per recipe the losses, the executions,
transfers and compilations per step after warm-up, and the layers fp8 fell
back on."""
from __future__ import annotations

import json
import sys

import torch
import torch_xla

import xla_amp
from tests.support import clear_metrics, count
from xla_amp import fp8, syncfree

STEPS = 200


def train(device, recipe, steps=STEPS) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.support.byte_lm import corpus
    src = corpus(200_000)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                                       n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0)).to(device)
    converted = 0
    if recipe is not None:
        fp8.convert(model, recipe)
        converted = sum(isinstance(m, fp8.Fp8Linear) for m in model.modules())
    opt = syncfree.AdamW(model.parameters(), lr=1e-3)
    if recipe is not None:
        fp8.attach(opt, model)
    scaler = xla_amp.GradScaler()
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps):
        idx = torch.randint(0, len(src) - 65, (16,), generator=g)
        ids = torch.stack([src[j:j + 64] for j in idx]).to(device)
        if i == 10:
            clear_metrics()
        opt.zero_grad()
        with xla_amp.autocast(device, policy="tpu"):
            loss = model(input_ids=ids, labels=ids).loss  # (no use_cache=False: a
            # transfer per call in Transformers 5.23 on XLA, fp8 or not)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        losses.append(loss.detach())
        if i == 19:
            per_step = [count(m) / 10 for m in ("ExecuteTime", "TransferFromDeviceTime",
                                                "CompileTime")]
    fallback = [] if recipe is None else list(fp8.report(model).fallback)
    return {"losses": torch.stack(losses).cpu().tolist(), "per_step": per_step,
            "converted": converted, "fallback": [str(f) for f in fallback]}


def main() -> None:
    device = torch_xla.device()
    runs = {"bf16": train(device, None),
            "fp8": train(device, fp8.Fp8Recipe(scaling="delayed"))}
    sys.stdout.write(json.dumps(runs) + "\n")


if __name__ == "__main__":
    main()
