"""xla_amp.fp8 on the torchax backend: the same layers (fp8/_linear.py's
functions under a jax.custom_vjp) in a jitted make_train_step: every
matmul of a transformer block's step -- forward, input and weight gradient
-- in the form XLA:GPU fuses into fp8 GEMMs (the matcher of the torch_xla
test, on JAX's HLO), gradients in e5m2; the loss equals the torch_xla fp8
run's; delayed scaling refused by name."""
from __future__ import annotations

import optax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import helpers_torchax  # noqa: F401  (JAX on CPU)
from helpers_fp8 import Block, dots, in_form

import xla_amp
import xla_amp.torchax as xt
from xla_amp import fp8

pytestmark = pytest.mark.torchax


def _block():
    torch.manual_seed(0)
    return fp8.convert(Block(), fp8.Fp8Recipe()), torch.randn(2, 16, 32), torch.randn(2, 16, 32)


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
def test_every_matmul_of_a_jitted_step_is_in_the_fp8_gemm_form(policy):
    model, x, y = _block()
    hlo = xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy=policy).lower(
        x, y).as_text(dialect="hlo")
    found = [d for d in dots(hlo) if in_form(d)]
    assert len(found) == 12, dots(hlo)
    assert sum(d[1][0] == "f8e5m2" for d in found) == 8


def test_losses_equal_the_torch_xla_fp8_run(device):
    def mlp():
        torch.manual_seed(0)
        return fp8.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)),
                           fp8.Fp8Recipe())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 32, generator=g), torch.randn(8, 16, generator=g))
               for _ in range(4)]
    step = xt.make_train_step(mlp(), F.mse_loss, optax.sgd(0.1), policy="tpu")
    got = [float(step(x, y)) for x, y in batches]
    model = mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = []
    for x, y in batches:
        opt.zero_grad()
        with xla_amp.autocast(device, policy="tpu"):
            loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert got == pytest.approx(want, rel=1e-5)
    assert got[-1] < got[0]


def test_delayed_scaling_is_refused_on_torchax():
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(32, 64)), fp8.Fp8Recipe(scaling="delayed"))
    step = xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy="tpu")
    with pytest.raises(ValueError, match="delayed scaling writes its amax history"):
        step(torch.randn(8, 32), torch.randn(8, 64))
