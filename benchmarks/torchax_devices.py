"""How closely a bf16 run on 4 devices follows the same run on 1.

    JAX_PLATFORMS=cpu .venv/bin/python -P benchmarks/torchax_devices.py [--steps 30]

A GPT-2-shaped LM (2 layers x 64, 4 heads, vocab 256, batch 16 x 32
tokens, GPT-2's init, seed 0) trained by ``xla_amp.torchax.make_train_step``
with optax AdamW (lr 1e-3) on the same batches, four ways in one process
with 4 XLA:CPU devices: one device; a 4-device mesh with
``sharding="replicate"`` (data parallel); with ``sharding="fsdp"``; each
under policy "tpu" (bf16) and with autocast off (float32). Printed per
configuration: the largest and the final relative loss difference from the
1-device run of the same precision, and over the parameter tensors after
the last step the median and the largest ||difference|| / ||parameter||. The batch is split along its first
dimension, so the 4-device step sums each gradient in another order (four
partial sums, then an all-reduce): the difference is rounding, and it
grows with the steps as training amplifies it.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402

hf_logging.set_verbosity_error()
VOCAB, BATCH, SEQ = 256, 16, 32


class _LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                              n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                              attn_pdrop=0.0))

    def forward(self, ids):
        return self.gpt(input_ids=ids).logits


def _loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def _batches(n):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def run(batches, enabled: bool, sharding: str | None):
    torch.manual_seed(0)
    mesh = Mesh(np.array(jax.devices()), ("data",)) if sharding else None
    step = xt.make_train_step(_LM(), _loss, optax.adamw(1e-3), policy="tpu",
                              dtype=torch.bfloat16, enabled=enabled, mesh=mesh,
                              sharding=sharding or "replicate")
    losses = [float(step(ids, ids)) for ids in batches]
    params = {k: v.float().numpy() for k, v in step.state_dict()["model"].items()}
    return np.array(losses), params


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    assert jax.device_count() == 4, jax.devices()
    batches = _batches(args.steps)
    print(f"| precision | devices | sharding | max rel. loss diff | final rel. loss diff | "
          f"param ||diff||/||param||: median / max over tensors |\n|---|---|---|---|---|---|")
    first = None
    for enabled, label in ((True, "bf16 (tpu)"), (False, "float32")):
        ref, ref_params = run(batches, enabled, None)
        first = ref if first is None else first
        for sharding in ("replicate", "fsdp"):
            losses, params = run(batches, enabled, sharding)
            rel = np.abs(losses - ref) / np.abs(ref)
            prm = [float(np.linalg.norm(params[k] - ref_params[k]) /
                         max(float(np.linalg.norm(ref_params[k])), 1e-30)) for k in ref_params]
            worst = list(ref_params)[int(np.argmax(prm))]
            print(f"| {label} | 4 vs 1 | {sharding} | {rel.max():.2e} | {rel[-1]:.2e} | "
                  f"{np.median(prm):.2e} / {max(prm):.2e} (`{worst}`) |")
    print(f"\n{args.steps} steps; 1-device losses (bf16) from {first[0]:.4f} to {first[-1]:.4f}")


if __name__ == "__main__":
    main()
