"""Whole models train under jit on the torchax backend: a GPT-2-shaped LM
(Transformers, from a config) and torchvision's ResNet-18, random init,
under the tpu and cuda policies. The first step's loss (same weights, same
batch) is within the zoo test's tolerance of the same model's fp32 torchax
run and of xla_amp on torch_xla under the same policy; later losses are
finite and fall; one cached program, no transfers after the first step."""
from __future__ import annotations

import copy

import jax
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import tests.support.torchax_env as helpers_torchax  # noqa: F401  (JAX on CPU)

import xla_amp
import xla_amp.torchax as xt

pytestmark = pytest.mark.torchax
STEPS = 4


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))

    class LM(torch.nn.Module):  # logits only: the step's loss takes (output, target)
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).logits

    def loss(logits, ids):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                               ids[:, 1:].reshape(-1))
    return LM(), (ids, ids), loss


def resnet18():
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)), \
        F.cross_entropy


def _torchax_losses(build, policy, dtype=None):
    model, batch, loss = build()
    step = xt.make_train_step(model, loss, optax.sgd(0.01), policy=policy, dtype=dtype,
                              enabled=policy is not None,
                              scaler=xt.LossScaler(init_scale=2.0 ** 8) if dtype == torch.float16
                              else None)
    placed = step.place_batch(*batch)
    losses = [float(step(*placed))]
    with jax.transfer_guard("disallow"):
        for _ in range(STEPS - 1):
            last = step(*placed)
    losses.append(float(last))
    assert step._jitted._cache_size() == 1
    return losses


def _torch_xla_loss(build, policy, dtype):
    import torch_xla
    device = torch_xla.device()
    model, batch, loss = build()
    model = model.to(device)
    batch = [b.to(device) for b in batch]
    with xla_amp.autocast(device, policy=policy, dtype=dtype):
        value = loss(model(*batch[:-1]), batch[-1])
    return float(value.cpu())


def _eager_bf16_deviation(build):
    model, batch, loss = build()
    fp32 = float(loss(model(*batch[:-1]), batch[-1]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = float(loss(copy.deepcopy(model)(*batch[:-1]), batch[-1]))
    return abs(low - fp32) / abs(fp32)


@pytest.mark.parametrize("build", [gpt2, resnet18], ids=["gpt2", "resnet18"])
def test_trains_like_fp32_and_like_torch_xla(build):
    fp32 = _torchax_losses(build, None)
    tol = max(0.01, 3.0 * _eager_bf16_deviation(build))
    for policy, dtype in [("tpu", torch.bfloat16), ("cuda", torch.float16)]:
        got = _torchax_losses(build, policy, dtype)
        assert np.isfinite(got).all(), (policy, got)
        assert abs(got[0] - fp32[0]) <= tol * abs(fp32[0]), (policy, got, fp32, tol)
        assert got[-1] < got[0], (policy, got)
        ref = _torch_xla_loss(build, policy, dtype)
        assert abs(got[0] - ref) <= tol * abs(ref), (policy, got[0], ref, tol)
